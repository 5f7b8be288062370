// A full disk is a full tier (issue 37): a disk tier larger than its filesystem used to be
// accepted, and once the filesystem filled every later write failed with an I/O error, so
// requests ended early or were refused for the rest of the process's life. Here, on a real small
// filesystem (a tmpfs mounted for the test): a tier larger than the free space is shrunk to it at
// open and says both sizes; a tier where not one slot fits is refused, naming both; and a
// filesystem that fills after open (another writer took the space) makes the tier keep the slots
// it wrote and evict there, answering RESOURCE_EXHAUSTED like any full tier, never an I/O error.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <string>
#include <vector>

#include "kv/tiers/disk_tier.h"
#include "kv/small_filesystem.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

using kv_internal::DiskSlotBytes;

constexpr int64_t kPageBytes = 5000;  // a slot of 8 KiB
constexpr int64_t kFilesystemBytes = 256 << 10;

DiskTierOptions Options(const std::string& path, int64_t capacity_bytes) {
  return {.path = path, .capacity_bytes = capacity_bytes, .page_bytes = kPageBytes,
          .identity = "disk tier full test"};
}

// Fills what is left of the filesystem at `dir` with a file of its own; returns the bytes taken.
int64_t FillFilesystem(const std::string& dir) {
  const int fd = ::open((dir + "/filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  const std::vector<uint8_t> block(4096, 0xab);
  int64_t written = 0;
  for (;;) {
    const ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) {
      EXPECT_EQ(errno, ENOSPC);
      break;
    }
    written += n;
  }
  ::close(fd);
  return written;
}

class DiskTierFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = std::make_unique<testing::SmallFilesystem>(::testing::TempDir(), kFilesystemBytes);
    if (!fs_->mounted()) GTEST_SKIP() << "no small filesystem: " << fs_->skip_reason();
  }
  std::unique_ptr<testing::SmallFilesystem> fs_;
};

TEST_F(DiskTierFullTest, ATierLargerThanItsFilesystemIsShrunkToItAndSaysBothSizes) {
  const std::string path = fs_->dir() + "/pages";
  auto tier = MakeDiskTier(Options(path, 16 << 20));
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const std::string& note = (*tier)->open_note();
  EXPECT_NE(note.find("shrunk to"), std::string::npos) << note;
  EXPECT_NE(note.find("asked for"), std::string::npos) << note;
  EXPECT_NE(note.find("bytes free"), std::string::npos) << note;
  const int64_t capacity = (*tier)->stats().capacity_bytes;
  EXPECT_LE(capacity, kFilesystemBytes);
  EXPECT_GE(capacity, kFilesystemBytes - 2 * DiskSlotBytes(kPageBytes) - 4096);
  // Twice what it holds, all evictable: every Put succeeds, the oldest pages making room.
  const int64_t slots = capacity / DiskSlotBytes(kPageBytes);
  std::map<PageKey, std::vector<uint8_t>> last;
  for (PageKey key = 1; key <= static_cast<PageKey>(2 * slots); ++key) {
    const std::vector<uint8_t> bytes = PageBytes(key, kPageBytes);
    const PageWrite write{key, bytes, /*evictable=*/true};
    ASSERT_TRUE((*tier)->Put(std::span(&write, 1)).ok()) << "page " << key;
    if (key > static_cast<PageKey>(slots)) last[key] = bytes;
  }
  EXPECT_GE((*tier)->stats().evictions, slots - 1);
  for (const auto& [key, bytes] : last) {
    std::vector<uint8_t> out(kPageBytes);
    ASSERT_TRUE(GetOne(**tier, key, out).ok()) << "page " << key;
    EXPECT_EQ(out, bytes);
  }
}

TEST_F(DiskTierFullTest, ATierWhereNotOneSlotFitsIsRefusedNamingBothSizes) {
  FillFilesystem(fs_->dir());
  auto tier = MakeDiskTier(Options(fs_->dir() + "/pages", 1 << 20));
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument);
  const std::string message = tier.status().message();
  EXPECT_NE(message.find("asks for"), std::string::npos) << message;
  EXPECT_NE(message.find("bytes free"), std::string::npos) << message;
  EXPECT_NE(message.find("another filesystem"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(fs_->dir() + "/pages"));  // nothing left behind
}

TEST_F(DiskTierFullTest, AFilesystemThatFillsAfterOpenMakesTheTierEvictNeverFail) {
  const int64_t slot = DiskSlotBytes(kPageBytes);
  auto made = MakeDiskTier(Options(fs_->dir() + "/pages", 24 * slot));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  DiskKvTier& tier = **made;
  EXPECT_EQ(tier.stats().capacity_bytes, 24 * slot);
  // Ten pages written while there is room: their slots have disk blocks behind them.
  for (PageKey key = 1; key <= 10; ++key) {
    const std::vector<uint8_t> bytes = PageBytes(key, kPageBytes);
    const PageWrite write{key, bytes, /*evictable=*/true};
    ASSERT_TRUE(tier.Put(std::span(&write, 1)).ok());
  }
  const int64_t filler = FillFilesystem(fs_->dir());
  EXPECT_GT(filler, 0);
  // Another writer took the rest: the fresh slots fail with ENOSPC, the tier gives them up and
  // evicts its oldest pages instead. Every Put succeeds.
  ::testing::internal::CaptureStderr();
  std::map<PageKey, std::vector<uint8_t>> latest;
  for (PageKey key = 11; key <= 40; ++key) {
    const std::vector<uint8_t> bytes = PageBytes(key, kPageBytes);
    const PageWrite write{key, bytes, /*evictable=*/true};
    const Status put = tier.Put(std::span(&write, 1));
    ASSERT_TRUE(put.ok()) << "page " << key << ": " << put.ToString();
    if (key > 30) latest[key] = bytes;
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("the filesystem is full"), std::string::npos) << log;
  const TierStats full = tier.stats();
  EXPECT_EQ(full.capacity_bytes, 10 * slot);  // the slots it had written
  EXPECT_EQ(full.pages, 10);
  EXPECT_GE(full.evictions, 20);
  for (const auto& [key, bytes] : latest) {
    std::vector<uint8_t> out(kPageBytes);
    ASSERT_TRUE(GetOne(tier, key, out).ok()) << "page " << key;
    EXPECT_EQ(out, bytes);
  }
  // Pages that must be kept fill it as they fill any tier: then RESOURCE_EXHAUSTED, which the
  // KV layer answers with another action, never an I/O error.
  int kept = 0;
  Status last;
  for (PageKey key = 100; key < 120; ++key) {
    const std::vector<uint8_t> bytes = PageBytes(key, kPageBytes);
    const PageWrite write{key, bytes, /*evictable=*/false};
    last = tier.Put(std::span(&write, 1));
    if (!last.ok()) break;
    ++kept;
  }
  EXPECT_EQ(kept, 10);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
}

}  // namespace
}  // namespace kvl
