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
