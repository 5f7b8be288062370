// The process's resident memory as /proc/self/status reports it: parsed, and seen to grow by what
// this process touches.
#include "kvl/process_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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

TEST(ProcessMemoryTest, ParsesAMappedFilesResidentPagesFromSmaps) {
  const char* smaps =
      "55d0c000-55d0e000 r--p 00000000 fd:01 1001                       /usr/bin/kvl\n"
      "Size:                  8 kB\n"
      "Rss:                   8 kB\n"
      "7f0000000000-7f0040000000 r--p 00000000 fd:01 2002                       /tmp/m.gguf\n"
      "Size:            1048576 kB\n"
      "Rss:               40000 kB\n"
      "Pss:               40000 kB\n"
      "VmFlags: rd mr mw me\n"
      "7f0040000000-7f0040001000 rw-p 00000000 00:00 0 \n"
      "Rss:                   4 kB\n"
      "7f0050000000-7f0050100000 r--p 40000000 fd:01 2002                       /tmp/m.gguf\n"
      "Rss:                1000 kB\n"
      "7f0060000000-7f0060100000 r--p 00000000 fd:01 3003                       /tmp/m.gguf.old\n"
      "Rss:                 900 kB\n";
  // Both mappings of the file, and nothing of another file whose name only starts the same.
  EXPECT_EQ(ParseMappedFileResidentBytes(smaps, "/tmp/m.gguf"), (40000 + 1000) * 1024);
  EXPECT_EQ(ParseMappedFileResidentBytes(smaps, "/usr/bin/kvl"), 8 * 1024);
  EXPECT_EQ(ParseMappedFileResidentBytes(smaps, "/tmp/other"), 0);
  EXPECT_FALSE(ParseMappedFileResidentBytes(
      "7f00-7f01 r--p 00000000 fd:01 2 /tmp/m.gguf\nRss:  many kB\n", "/tmp/m.gguf"));
}

TEST(ProcessMemoryTest, ReadingAMappedFileMakesItsPagesResident) {
  const std::string path =
      ::testing::TempDir() + "kvl_process_memory_" + std::to_string(::getpid()) + ".bin";
  constexpr size_t kBytes = 8 << 20;
  {
    const std::vector<char> bytes(kBytes, 7);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), kBytes), static_cast<ssize_t>(kBytes));
    ::close(fd);
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, kBytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  // Named through a path with a detour, as a user may give it: the kernel prints the real one.
  const std::filesystem::path p(path);
  const std::string detour = (p.parent_path() / "." / p.filename()).string();
  const std::optional<int64_t> untouched = ReadMappedFileResidentBytes(detour);
  ASSERT_TRUE(untouched.has_value());
  int64_t sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += static_cast<const char*>(map)[i];
  EXPECT_EQ(sum, 7 * static_cast<int64_t>(kBytes / 4096));
  const std::optional<int64_t> touched = ReadMappedFileResidentBytes(detour);
  ASSERT_TRUE(touched.has_value());
  EXPECT_GE(*touched, static_cast<int64_t>(kBytes) * 9 / 10);
  ::munmap(map, kBytes);
  ::close(fd);
  EXPECT_EQ(ReadMappedFileResidentBytes(detour), 0);
  ::unlink(path.c_str());
  EXPECT_FALSE(ReadMappedFileResidentBytes(path).has_value()) << "no such file";
}

}  // namespace
}  // namespace kvl
