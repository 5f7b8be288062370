// The process's resident memory as /proc/self/status reports it: parsed, and seen to grow by what
// this process touches.
#include "kvl/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace kvl {
namespace {

TEST(ProcessMemoryTest, ParsesTheKernelsFieldsInBytes) {
  const std::optional<ProcessMemory> m = ParseProcessStatus(
      "Name:\tkvl\nVmHWM:\t    4096 kB\nVmRSS:\t    3000 kB\nRssAnon:\t     1000 kB\n"
      "RssFile:\t    1900 kB\nRssShmem:\t     100 kB\nThreads:\t3\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rss_bytes, 3000 * 1024);
  EXPECT_EQ(m->rss_anon_bytes, (1000 + 100) * 1024);
  EXPECT_EQ(m->rss_file_bytes, 1900 * 1024);
  EXPECT_EQ(m->rss_peak_bytes, 4096 * 1024);
  // A field missing (an old kernel without RssAnon) or malformed: nothing, not a guess.
  EXPECT_FALSE(ParseProcessStatus("VmHWM:\t1 kB\nVmRSS:\t1 kB\nRssFile:\t1 kB\nRssShmem:\t0 kB\n"));
  EXPECT_FALSE(ParseProcessStatus(
      "VmHWM:\t1 kB\nVmRSS:\tlots kB\nRssAnon:\t1 kB\nRssFile:\t1 kB\nRssShmem:\t0 kB\n"));
  // A name that only starts like a field is another field.
  EXPECT_FALSE(ParseProcessStatus("VmRSSX:\t1 kB\nVmHWM:\t1 kB\nRssAnon:\t1 kB\nRssFile:\t1 "
                                  "kB\nRssShmem:\t0 kB\n"));
}

TEST(ProcessMemoryTest, TouchingMemoryGrowsTheAnonymousPart) {
  const std::optional<ProcessMemory> before = ReadProcessMemory();
  ASSERT_TRUE(before.has_value()) << "/proc/self/status unreadable";
  constexpr size_t kBytes = 64 << 20;
  std::unique_ptr<char[]> block(new char[kBytes]);
  std::memset(block.get(), 1, kBytes);  // resident only once written
  const std::optional<ProcessMemory> after = ReadProcessMemory();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(after->rss_anon_bytes - before->rss_anon_bytes, static_cast<int64_t>(kBytes) * 9 / 10);
  EXPECT_GE(after->rss_peak_bytes, after->rss_bytes);
  volatile char keep = block[kBytes - 1];
  (void)keep;
}

}  // namespace
}  // namespace kvl
