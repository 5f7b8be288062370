// ThreadPool::ParallelFor in the per-token step must not allocate, whatever the closure captures.
// This file also holds test_base's allocation hooks and the check that the counter counts.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "alloc_counter.h"
#include "kvl/thread_pool.h"

KVL_ALLOC_COUNTER_HOOKS()

namespace kvl {
namespace {

using ::kvl::testing::AllocCounter;

TEST(AllocCounterTest, CountsEveryFormOfNewOnEveryThread) {
  AllocCounter counter;
  delete new int(1);
  delete[] new char[16];
  struct alignas(128) Wide {
    char c[128];
  };
  delete new Wide;
  std::vector<int> v(100);
  ThreadPool pool(2);  // starts a worker thread: at least one allocation
  const int64_t n = counter.Stop();
  EXPECT_GE(n, 5);
}

TEST(ThreadPoolAllocTest, ParallelForDoesNotAllocateAfterWarmUp) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> sum{0};
    // A capture far larger than any small-buffer optimization, as a std::function would need.
    std::array<int64_t, 64> big{};
    big[3] = 1;
    auto body = [&sum, big](int64_t task, int) { sum += task * big[3]; };
    pool.ParallelFor(8, body);  // warm-up: workers started and parked
    sum = 0;

    AllocCounter counter;
    for (int rep = 0; rep < 100; ++rep) {
      pool.ParallelFor(8, body);
      pool.ParallelFor(1, [&sum](int64_t, int) { sum += 1; });
      pool.ParallelFor(37, [&, big](int64_t task, int thread) { sum += big[3] * (thread >= 0); });
    }
    const int64_t allocations = counter.Stop();
    EXPECT_EQ(allocations, 0) << threads << " threads";
    EXPECT_EQ(sum.load(), 100 * (28 + 1 + 37));
  }
}

}  // namespace
}  // namespace kvl
