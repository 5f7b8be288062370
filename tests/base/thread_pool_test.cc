#include "kvl/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "kvl/status.h"

namespace kvl {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 3, 100, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int64_t task, int thread) {
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, threads);
        hits[static_cast<size_t>(task)].fetch_add(1);
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPoolTest, ManyBackToBackLoops) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 2000; ++i) pool.ParallelFor(4, [&](int64_t task, int) { sum += task; });
  EXPECT_EQ(sum.load(), 2000 * 6);
}

// More threads than this machine's cores: workers are often not running when a loop starts, so
// the calling thread claims most tasks and workers join late or not at all. No task may run
// after its loop returned, nor for another loop, and every task's writes are visible on return.
TEST(ThreadPoolTest, LateWorkersNeverRunATaskOfAFinishedLoop) {
  ThreadPool pool(6);
  std::atomic<int64_t> current_loop{0};
  std::atomic<int64_t> stray{0};
  std::vector<int64_t> out(16);
  for (int64_t loop = 0; loop < 5000; ++loop) {
    current_loop.store(loop);
    const int64_t n = 2 + loop % 15;
    pool.ParallelFor(n, [&, loop](int64_t task, int) {
      // A few microseconds of work, so that workers do join some loops.
      for (int spin = 0; spin < 8000 * (1 + static_cast<int>(task % 3)); ++spin) {
        __asm__ volatile("");
      }
      out[static_cast<size_t>(task)] = loop * 100 + task;  // plain writes, read after the loop
      // Still this loop's turn at the task's end: it did not outlive its ParallelFor.
      if (current_loop.load() != loop) stray.fetch_add(1);
    });
    current_loop.store(-1);
    for (int64_t task = 0; task < n; ++task) {
      ASSERT_EQ(out[static_cast<size_t>(task)], loop * 100 + task) << "loop " << loop;
    }
  }
  EXPECT_EQ(stray.load(), 0);
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = DataLossError("tensor 'x': truncated");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "DATA_LOSS: tensor 'x': truncated");
  StatusOr<int> v = 3;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
  StatusOr<int> e = NotFoundError("nope");
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvl
