// The warm tier timings' working set (calibration_internal::WarmSetBytes, WarmGroups): pages in
// the last-level cache but not in the reading core's own, as a page read back a while after it
// was written is; not one page set reread in a loop from the core's cache.
#include <gtest/gtest.h>

#include "calibrate/calibration_internal.h"

namespace kvl::calibration_internal {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(WarmSetTest, TwiceTheCoresCacheWithinHalfTheLastLevel) {
  EXPECT_EQ(WarmSetBytes(2 * kMiB, 32 * kMiB), 4 * kMiB);
  EXPECT_EQ(WarmSetBytes(4 * kMiB, 300 * kMiB), 8 * kMiB);
  // A small last-level cache bounds it: the set must stay in there.
  EXPECT_EQ(WarmSetBytes(2 * kMiB, 6 * kMiB), 3 * kMiB);
  // Unknown sizes: 2 MiB and 32 MiB.
  EXPECT_EQ(WarmSetBytes(0, 0), 4 * kMiB);
  EXPECT_EQ(WarmSetBytes(-1, 300 * kMiB), 4 * kMiB);
}

TEST(WarmSetTest, SmallCallsCycleThroughManyGroupsLargeOnesFew) {
  const int64_t set = 8 * kMiB;
  // One 128 KiB page a call: 64 groups, so no call finds its page in the core's cache.
  EXPECT_EQ(WarmGroups(128 << 10, set, 4096), 64);
  // 22 such pages a call (2.75 MiB): 3 groups cover the set.
  EXPECT_EQ(WarmGroups(22 * (128 << 10), set, 66), 3);
  // A call past the set alone: one group.
  EXPECT_EQ(WarmGroups(16 * kMiB, set, 12), 1);
  // Never more groups than the cold timing wrote.
  EXPECT_EQ(WarmGroups(4096, set, 64), 64);
}

}  // namespace
}  // namespace kvl::calibration_internal
