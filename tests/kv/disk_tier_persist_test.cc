// The persistent disk tier: pages found again after a reopen, a file started empty (and saying
// so) when its identity, version or page size differ, nothing that is not the tier's own ever
// changed (foreign files, symbolic links), one tier per file at a time (the lock), torn slots read
// as misses for those pages only, LRU eviction, I/O errors named as the OS names them, and a
// writer killed with SIGKILL mid-write leaving only pages that read back exactly as written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kv/tiers/disk_tier.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

using kv_internal::DiskSlotBytes;
using kv_internal::DiskSlotOffset;
using kv_internal::DiskTierInfo;
using kv_internal::FileHeader;
using kv_internal::SlotHeader;

constexpr int64_t kPageBytes = 5000;
const std::string kModelA = "weights=0123abcd tokenizer=77 block=16 kv=f16 layers=4x2x64";
const std::string kModelB = "weights=feedbeef tokenizer=77 block=16 kv=f16 layers=4x2x64";

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void Poke(const std::string& path, int64_t offset, const void* bytes, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes, n, offset), static_cast<ssize_t>(n));
  ::close(fd);
}

const DiskTierInfo& Info(const KvTier& tier) { return dynamic_cast<const DiskTierInfo&>(tier); }

class PersistTest : public ::testing::TestWithParam<bool> {  // param: direct_io
 protected:
  void SetUp() override {
    path_ = TempPath(std::string("persist_") + (GetParam() ? "direct" : "buffered"));
    std::filesystem::remove(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  DiskTierOptions Options(const std::string& identity = kModelA,
                          int64_t page_bytes = kPageBytes) const {
    return {.path = path_,
            .capacity_bytes = 64 * DiskSlotBytes(page_bytes),
            .page_bytes = page_bytes,
            .direct_io = GetParam(),
            .identity = identity};
  }
  std::unique_ptr<DiskKvTier> Open(const DiskTierOptions& options) {
    auto tier = MakeDiskTier(options);
    EXPECT_TRUE(tier.ok()) << tier.status().ToString();
    return tier.ok() ? std::move(tier).value() : nullptr;
  }
  // A persistent and a scratch tier on path_ are both refused with `code`, saying `says`.
  void ExpectRefusedInBothModes(StatusCode code, const std::string& says) {
    for (bool persistent : {true, false}) {
      DiskTierOptions options = Options();
      options.persistent = persistent;
      auto tier = MakeDiskTier(options);
      ASSERT_FALSE(tier.ok());
      EXPECT_EQ(tier.status().code(), code);
      EXPECT_NE(tier.status().message().find(says), std::string::npos) << tier.status().message();
    }
  }
  // Writes pages under keys that look like chain hashes, in batches of 1..7.
  std::map<PageKey, std::vector<uint8_t>> WritePages(KvTier& tier, int count) {
    std::map<PageKey, std::vector<uint8_t>> pages;
    std::mt19937_64 rng(count);
    for (int i = 0; i < count; ++i) pages[rng()] = {};
    std::vector<PageWrite> batch;
    for (auto& [key, bytes] : pages) {
      bytes = PageBytes(key, kPageBytes);
      batch.push_back({key, bytes});
      if (batch.size() == 1 + key % 7) {
        EXPECT_TRUE(tier.Put(batch).ok());
        batch.clear();
      }
    }
    if (!batch.empty()) {
      EXPECT_TRUE(tier.Put(batch).ok());
    }
    return pages;
  }
  // Every page reads back bit-identical, in one batch.
  void ExpectAll(KvTier& tier, const std::map<PageKey, std::vector<uint8_t>>& pages) {
    std::vector<std::vector<uint8_t>> outs(pages.size(), std::vector<uint8_t>(kPageBytes));
    std::vector<PageRead> reads;
    for (const auto& [key, bytes] : pages) reads.push_back({key, outs[reads.size()]});
    const std::vector<Status> results = tier.Get(reads);
    size_t i = 0;
    for (const auto& [key, bytes] : pages) {
      EXPECT_TRUE(results[i].ok()) << results[i].ToString();
      EXPECT_EQ(outs[i], bytes) << "page " << key;
      ++i;
    }
  }

  std::string path_;
};

TEST_P(PersistTest, ReopenWithTheSameIdentityReadsEveryPageBack) {
  std::map<PageKey, std::vector<uint8_t>> pages;
  {
    auto tier = Open(Options());
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->open_note(), "created");
    pages = WritePages(*tier, 40);
    // A key written twice keeps its second page across the reopen.
    const PageKey twice = pages.begin()->first;
    pages[twice] = PageBytes(twice + 1, kPageBytes);
    ASSERT_TRUE(PutOne(*tier, twice, pages[twice]).ok());
  }
  ASSERT_TRUE(std::filesystem::exists(path_)) << "a persistent file outlives its tier";
  for (int round = 0; round < 2; ++round) {
    auto tier = Open(Options());
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->open_note(), "reopened with 40 pages");
    EXPECT_EQ(tier->pages_reloaded(), 40);
    EXPECT_EQ(tier->stats().pages, 40);
    std::vector<PageKey> keys = tier->Keys();
    std::sort(keys.begin(), keys.end());
    std::vector<PageKey> expected;
    for (const auto& [key, bytes] : pages) expected.push_back(key);
    EXPECT_EQ(keys, expected);
    for (PageKey key : expected) EXPECT_TRUE(tier->Contains(key));
    ExpectAll(*tier, pages);
    EXPECT_EQ(tier->stats().checksum_failures, 0);
  }
}

TEST_P(PersistTest, AnotherIdentityVersionOrPageSizeStartsEmptyAndSaysSo) {
  {
    auto tier = Open(Options());
    WritePages(*tier, 10);
  }
  {
    auto tier = Open(Options(kModelB));
    ASSERT_NE(tier, nullptr);
    EXPECT_NE(tier->open_note().find("started empty: it was written for another identity"),
              std::string::npos)
        << tier->open_note();
    EXPECT_NE(tier->open_note().find(kModelA), std::string::npos) << tier->open_note();
    EXPECT_EQ(tier->stats().pages, 0);
    EXPECT_TRUE(tier->Keys().empty());
    WritePages(*tier, 3);
  }
  {
    // Model A's pages are gone for good; model B's are another identity's now.
    auto tier = Open(Options());
    EXPECT_NE(tier->open_note().find("another identity"), std::string::npos);
    EXPECT_EQ(tier->stats().pages, 0);
  }
  {
    auto tier = Open(Options(kModelA, kPageBytes + 4));
    ASSERT_NE(tier, nullptr);
    EXPECT_NE(tier->open_note().find("it holds pages of 5000 bytes, this tier's are 5004"),
              std::string::npos)
        << tier->open_note();
  }
  {
    auto tier = Open(Options());
    WritePages(*tier, 5);
  }
  FileHeader header;
  std::vector<uint8_t> file = ReadFile(path_);
  std::memcpy(&header, file.data(), sizeof header);
  header.format_version = 99;
  Poke(path_, 0, &header, sizeof header);
  {
    auto tier = Open(Options());
    EXPECT_NE(tier->open_note().find("format version 99, this build reads version 1"),
              std::string::npos)
        << tier->open_note();
    EXPECT_EQ(tier->stats().pages, 0);
    WritePages(*tier, 5);
  }
  const char flipped = 'X';  // inside the identity: the header's checksum no longer holds
  Poke(path_, sizeof(FileHeader) + 3, &flipped, 1);
  {
    auto tier = Open(Options());
    EXPECT_NE(tier->open_note().find("header is damaged"), std::string::npos)
        << tier->open_note();
    EXPECT_EQ(tier->stats().pages, 0);
  }
  // A binary identity is shown by its size and hash.
  {
    auto tier = Open(Options(std::string("\x01\x02\x00\xff", 4)));
    ASSERT_NE(tier, nullptr);
  }
  {
    auto tier = Open(Options());
    EXPECT_NE(tier->open_note().find("4 bytes, hash"), std::string::npos) << tier->open_note();
  }
}

TEST_P(PersistTest, ForeignFilesAreRefusedAndLeftByteIdentical) {
  std::vector<std::vector<uint8_t>> contents;
  std::mt19937_64 rng(5);
  std::vector<uint8_t> noise(20000);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  contents.push_back(noise);
  const std::string text = "my notes\nplease do not truncate me\n";
  contents.emplace_back(text.begin(), text.end());
  // Close to the magic, but three bytes off: not taken for a damaged tier file.
  contents.emplace_back(kv_internal::kFileMagic, kv_internal::kFileMagic + 8);
  contents.back()[0] = 'k';
  contents.back()[1] = 'v';
  contents.back()[2] = 'l';
  contents.back().resize(4096 + 64, 0);
  for (const std::vector<uint8_t>& bytes : contents) {
    WriteFile(path_, bytes);
    ExpectRefusedInBothModes(StatusCode::kInvalidArgument,
                             path_ + " is not a kvlattice KV tier file");
    EXPECT_EQ(ReadFile(path_), bytes);
    auto spec = MakeTier(*ParseTierSpec("disk:" + path_ + ":1MiB"), kPageBytes, kModelA);
    EXPECT_FALSE(spec.ok());
    EXPECT_EQ(ReadFile(path_), bytes);
    EXPECT_TRUE(std::filesystem::exists(path_));
  }
}

// The names beside path_ that a damaged file was renamed to.
std::vector<std::string> RenamedAside(const std::string& path) {
  std::vector<std::string> found;
  const std::filesystem::path p(path);
  for (const auto& entry : std::filesystem::directory_iterator(p.parent_path())) {
    if (entry.path().filename().string().starts_with(p.filename().string() + ".damaged-")) {
      found.push_back(entry.path().string());
    }
  }
  return found;
}

// A tier file of our own that is damaged where the rule above would refuse it (empty, the magic
// cut short, the magic damaged while the rest of the header or the first slot is ours) no longer
// blocks a restart: it is renamed aside byte for byte, the note says so and names the new path,
// and a fresh tier opens on the path and holds pages.
TEST_P(PersistTest, ADamagedTierFileIsRenamedAsideAndAFreshOneMade) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> damaged;
  damaged.push_back({"it is empty", {}});
  damaged.push_back({"shorter than the tier's magic",
                     std::vector<uint8_t>(kv_internal::kFileMagic, kv_internal::kFileMagic + 5)});
  {
    auto tier = Open(Options());
    WritePages(*tier, 4);
  }
  std::vector<uint8_t> whole = ReadFile(path_);
  ASSERT_GT(whole.size(), 4096u);
  std::vector<uint8_t> one_byte = whole;
  one_byte[3] ^= 0x5a;
  damaged.push_back({"its magic is damaged", one_byte});
  std::vector<uint8_t> zeroed = whole;
  std::fill(zeroed.begin(), zeroed.begin() + 8, 0);
  damaged.push_back({"the rest of its header is the tier's", zeroed});
  std::vector<uint8_t> header_gone = whole;
  std::fill(header_gone.begin(), header_gone.begin() + 4096, 0xee);
  damaged.push_back({"its first slot is the tier's", header_gone});
  for (const auto& [why, bytes] : damaged) {
    SCOPED_TRACE(why);
    for (const std::string& old : RenamedAside(path_)) std::filesystem::remove(old);
    WriteFile(path_, bytes);
    auto tier = MakeDiskTier(Options());
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    const std::vector<std::string> aside = RenamedAside(path_);
    ASSERT_EQ(aside.size(), 1u);
    EXPECT_EQ(ReadFile(aside[0]), bytes);  // kept as it was, for whoever looks into it
    const std::string& note = (*tier)->open_note();
    EXPECT_NE(note.find("created"), std::string::npos) << note;
    EXPECT_NE(note.find(why), std::string::npos) << note;
    EXPECT_NE(note.find("renamed it to " + aside[0]), std::string::npos) << note;
    EXPECT_EQ((*tier)->stats().pages, 0);
    const auto pages = WritePages(**tier, 3);
    ExpectAll(**tier, pages);
    tier->reset();
    // The fresh file is the tier's own: the next open reopens it.
    auto again = Open(Options());
    EXPECT_NE(again->open_note().find("reopened with 3 pages"), std::string::npos)
        << again->open_note();
    EXPECT_EQ(RenamedAside(path_).size(), 1u);
  }
  for (const std::string& old : RenamedAside(path_)) std::filesystem::remove(old);
}

TEST_P(PersistTest, SymbolicLinksAreRefusedAndTheirTargetsUntouched) {
  const std::string target = path_ + ".target";
  const std::string link = path_ + ".link";
  const std::string text = "a user's file\n";
  WriteFile(target, {text.begin(), text.end()});
  std::filesystem::remove(link);
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  DiskTierOptions options = Options();
  options.path = link;
  auto tier = MakeDiskTier(options);
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.status().message().find(link + " is a symbolic link"), std::string::npos)
      << tier.status().message();
  EXPECT_EQ(ReadFile(target), std::vector<uint8_t>(text.begin(), text.end()));
  // A link to a tier file of our own is refused too, and a dangling link creates nothing.
  { Open(Options()); }
  std::filesystem::remove(link);
  ASSERT_EQ(::symlink(path_.c_str(), link.c_str()), 0);
  EXPECT_FALSE(MakeDiskTier(options).ok());
  std::filesystem::remove(link);
  std::filesystem::remove(target);
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_FALSE(MakeDiskTier(options).ok());
  EXPECT_FALSE(std::filesystem::exists(target));
  std::filesystem::remove(link);
}

TEST_P(PersistTest, ASecondOpenOfTheSamePathIsRefusedWhileTheFirstIsOpen) {
  auto first = Open(Options());
  ASSERT_NE(first, nullptr);
  const auto pages = WritePages(*first, 6);
  ExpectRefusedInBothModes(StatusCode::kIoError, path_ + " is in use");
  ExpectAll(*first, pages);  // the refused opens changed nothing
  first.reset();
  auto again = Open(Options());
  ASSERT_NE(again, nullptr);
  ExpectAll(*again, pages);
}

// Pages 0..15 written and the tier closed; returns each page's slot offset.
std::map<PageKey, int64_t> WriteSixteen(const DiskTierOptions& options,
                                        std::map<PageKey, std::vector<uint8_t>>& pages) {
  std::map<PageKey, int64_t> offsets;
  auto tier = MakeDiskTier(options);
  EXPECT_TRUE(tier.ok());
  std::vector<PageWrite> writes;
  for (PageKey k = 0; k < 16; ++k) pages[k] = PageBytes(k + 1000, kPageBytes);
  for (auto& [k, bytes] : pages) writes.push_back({k, bytes});
  EXPECT_TRUE((*tier)->Put(writes).ok());
  for (PageKey k = 0; k < 16; ++k) {
    offsets[k] = DiskSlotOffset(*Info(**tier).SlotOf(k), Info(**tier).slot_bytes());
  }
  return offsets;
}

TEST_P(PersistTest, TornOrCorruptSlotsAreMissesForThosePagesOnly) {
  std::map<PageKey, std::vector<uint8_t>> pages;
  const auto offsets = WriteSixteen(Options(), pages);
  const uint8_t junk[3] = {0xde, 0xad, 0x00};
  Poke(path_, offsets.at(3) + kv_internal::kSlotHeaderBytes + 777, junk, 3);  // payload
  Poke(path_, offsets.at(7) + offsetof(SlotHeader, generation), junk, 3);     // record
  // The file cut inside the last slot, as a crash while extending it would leave it.
  const PageKey last = std::max_element(offsets.begin(), offsets.end(), [](auto& a, auto& b) {
                         return a.second < b.second;
                       })->first;
  ASSERT_EQ(::truncate(path_.c_str(), offsets.at(last) + 2000), 0);

  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->pages_reloaded(), 14);  // the record of 7 and the cut slot do not count
  EXPECT_FALSE(tier->Contains(7));
  EXPECT_FALSE(tier->Contains(last));
  std::vector<uint8_t> out(kPageBytes);
  for (PageKey k = 0; k < 16; ++k) {
    const Status s = GetOne(*tier, k, out);
    if (k == 3) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_EQ(out, std::vector<uint8_t>(kPageBytes, 0));
    } else if (k == 7 || k == last) {
      EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    } else {
      EXPECT_TRUE(s.ok()) << k << ": " << s.ToString();
      EXPECT_EQ(out, pages[k]);
    }
  }
  // The damaged pages can be written again and read back.
  ASSERT_TRUE(PutOne(*tier, 3, pages[3]).ok());
  ASSERT_TRUE(GetOne(*tier, 3, out).ok());
  EXPECT_EQ(out, pages[3]);
}

TEST_P(PersistTest, EvictionIsLeastRecentlyUsedFirst) {
  const int64_t slot = DiskSlotBytes(kPageBytes);
  DiskTierOptions options = Options();
  options.capacity_bytes = 4 * slot;
  options.evict_lru = true;
  std::vector<std::vector<uint8_t>> pages;
  for (PageKey k = 0; k < 8; ++k) pages.push_back(PageBytes(k, kPageBytes));
  {
    auto tier = Open(options);
    for (PageKey k = 0; k < 4; ++k) ASSERT_TRUE(PutOne(*tier, k, pages[k]).ok());
    std::vector<uint8_t> out(kPageBytes);
    ASSERT_TRUE(GetOne(*tier, 0, out).ok());  // 0 is now the most recently used
    ASSERT_TRUE(PutOne(*tier, 4, pages[4]).ok());
    EXPECT_FALSE(tier->Contains(1));
    EXPECT_TRUE(tier->Contains(0));
    const PageWrite two[] = {{5, pages[5]}, {6, pages[6]}};
    ASSERT_TRUE(tier->Put(two).ok());
    EXPECT_EQ(tier->Keys(), (std::vector<PageKey>{0, 4, 5, 6}));
    EXPECT_EQ(tier->stats().evictions, 3);
    const PageWrite five[] = {{0, pages[0]}, {1, pages[1]}, {2, pages[2]}, {3, pages[3]},
                              {7, pages[7]}};
    EXPECT_EQ(tier->Put(five).code(), StatusCode::kResourceExhausted);
  }
  // Without evict_lru, pages found at open are still evicted (oldest written first), and the
  // pages this tier wrote are kept until erased.
  options.evict_lru = false;
  auto tier = Open(options);
  EXPECT_EQ(tier->Keys(), (std::vector<PageKey>{0, 4, 5, 6}));
  ASSERT_TRUE(PutOne(*tier, 1, pages[1]).ok());
  ASSERT_TRUE(PutOne(*tier, 2, pages[2]).ok());
  std::vector<PageKey> keys = tier->Keys();
  ASSERT_EQ(keys.size(), 4u);
  EXPECT_EQ(keys[0], 5u);  // the evictable ones first, coldest first
  EXPECT_EQ(keys[1], 6u);
  EXPECT_EQ(std::set<PageKey>(keys.begin() + 2, keys.end()), (std::set<PageKey>{1, 2}));
  ASSERT_TRUE(PutOne(*tier, 3, pages[3]).ok());
  ASSERT_TRUE(PutOne(*tier, 7, pages[7]).ok());
  EXPECT_EQ(PutOne(*tier, 0, pages[0]).code(), StatusCode::kResourceExhausted);
  std::vector<uint8_t> out(kPageBytes);
  for (PageKey k : {1, 2, 3, 7}) {
    ASSERT_TRUE(GetOne(*tier, k, out).ok());
    EXPECT_EQ(out, pages[k]);
  }
}

TEST_P(PersistTest, ScratchTierStartsEmptyAndIsDeleted) {
  { WritePages(*Open(Options()), 4); }
  DiskTierOptions options = Options();
  options.persistent = false;
  {
    auto tier = Open(options);
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->open_note(), "started empty: a scratch tier starts empty");
    EXPECT_EQ(tier->stats().pages, 0);
  }
  EXPECT_FALSE(std::filesystem::exists(path_));
}

// A file size limit makes the OS fail a write the way a full disk does: the error names the
// path and the OS's reason, and none of the batch is stored. Run in a child, whose limit ends
// with it.
TEST_P(PersistTest, WriteErrorsAreReportedAsTheOsNamesThem) {
  auto tier = Open(Options());
  ASSERT_NE(tier, nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::vector<std::vector<uint8_t>> pages;
    std::vector<PageWrite> writes;
    for (PageKey k = 0; k < 20; ++k) pages.push_back(PageBytes(k, kPageBytes));
    for (PageKey k = 0; k < 20; ++k) writes.push_back({k, pages[k]});
    const Status s = tier->Put(writes);
    const bool named = s.code() == StatusCode::kIoError &&
                       s.message().find(path_) != std::string::npos &&
                       s.message().find(std::strerror(EFBIG)) != std::string::npos;
    ::_exit(named && !tier->Contains(0) && tier->stats().pages == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A child writes pages in a loop (into a small tier, so slots are overwritten) and is killed
// with SIGKILL at a random moment; the next open must find only pages that read back exactly as
// written, or miss them. Three rounds, each child continuing the file of the last.
TEST_P(PersistTest, KillMinus9MidWriteLeavesOnlyExactPages) {
  constexpr int64_t kBigPage = 256 << 10;
  // Cheap contents (splitmix64 words), so that the child spends its time in write calls.
  auto content = [](PageKey key) {
    std::vector<uint8_t> bytes(kBigPage);
    for (size_t i = 0; i < bytes.size(); i += 8) {
      uint64_t z = key * 0x9E3779B97F4A7C15ull + i;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      std::memcpy(bytes.data() + i, &z, 8);
    }
    return bytes;
  };
  DiskTierOptions options = Options(kModelA, kBigPage);
  options.capacity_bytes = 48 * DiskSlotBytes(kBigPage);
  options.evict_lru = true;
  int64_t total_ok = 0, total_lost = 0;
  for (int round = 0; round < 3; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto tier = MakeDiskTier(options);
      if (!tier.ok()) ::_exit(2);
      std::vector<std::vector<uint8_t>> pages(8);
      for (PageKey key = static_cast<PageKey>(round) << 32;; key += 8) {
        std::vector<PageWrite> writes;
        for (int i = 0; i < 8; ++i) {
          pages[i] = content(key + i);
          writes.push_back({key + i, pages[i]});
        }
        if (!(*tier)->Put(writes).ok()) ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 70 * round));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped on its own: " << status;

    auto tier = Open(options);
    ASSERT_NE(tier, nullptr);
    std::vector<uint8_t> out(kBigPage);
    for (PageKey key : tier->Keys()) {
      const Status s = GetOne(*tier, key, out);
      if (s.ok()) {
        ASSERT_EQ(out, content(key)) << "page " << key << " came back with other bytes";
        ++total_ok;
      } else {
        ASSERT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
        ++total_lost;
      }
    }
  }
  EXPECT_GT(total_ok, 0);
  // A torn write loses at most the batch in flight when the child died.
  EXPECT_LE(total_lost, 3 * 8);
  std::printf("kill -9 rounds: %lld pages read back exactly, %lld torn pages missed\n",
              static_cast<long long>(total_ok), static_cast<long long>(total_lost));
}

INSTANTIATE_TEST_SUITE_P(Buffered, PersistTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Direct, PersistTest, ::testing::Values(true));

}  // namespace
}  // namespace kvl
