// RAM and disk KV tiers: round trips, capacity, coalescing, corruption (a bad page is DATA_LOSS
// for that page alone, never wrong bytes), async reads, concurrency, and a random-operation
// property test against a plain map.
#include "kvl/kv_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv/tiers/disk_tier.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

using kv_internal::DiskTierInfo;
using kv_internal::kSlotHeaderBytes;

std::unique_ptr<KvTier> Disk(const std::string& name, int64_t page_bytes, int64_t capacity_bytes,
                             bool direct = false) {
  auto tier = MakeDiskTier({.path = TempPath(name),
                            .capacity_bytes = capacity_bytes,
                            .page_bytes = page_bytes,
                            .direct_io = direct,
                            .persistent = false});
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(tier).value() : nullptr;
}

const DiskTierInfo& Info(const KvTier& tier) { return dynamic_cast<const DiskTierInfo&>(tier); }

// Writes `count` pages (keys first..first+count-1) in one batch and reads them back in one batch.
void RoundTrip(KvTier& tier, PageKey first, int count, const std::vector<size_t>& sizes,
               bool compressible) {
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (int i = 0; i < count; ++i)
    pages.push_back(PageBytes(first + i, sizes[i % sizes.size()], compressible && i % 2 == 0));
  for (int i = 0; i < count; ++i) writes.push_back({first + i, pages[i]});
  ASSERT_TRUE(tier.Put(writes).ok());
  std::vector<std::vector<uint8_t>> outs;
  std::vector<PageRead> reads;
  for (int i = 0; i < count; ++i) outs.emplace_back(pages[i].size(), 0xAB);
  for (int i = count - 1; i >= 0; --i) reads.push_back({first + i, outs[i]});  // any order
  const std::vector<Status> results = tier.Get(reads);
  ASSERT_EQ(results.size(), reads.size());
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int i = 0; i < count; ++i) EXPECT_EQ(outs[i], pages[i]) << "page " << first + i;
}

// ---------------------------------------------------------------------------------------- RAM

class RamTierTest : public ::testing::TestWithParam<bool> {};  // param: compress

TEST_P(RamTierTest, RoundTripsManyPagesOfOddSizes) {
  auto tier = MakeRamTier({.capacity_bytes = 64 << 20, .compress = GetParam()});
  RoundTrip(*tier, 1, 300, {1, 7, 63, 4095, 4097, 20480, 13, 0}, /*compressible=*/true);
  const TierStats s = tier->stats();
  EXPECT_EQ(s.pages, 300);
  EXPECT_EQ(s.puts, 300);
  EXPECT_EQ(s.gets, 300);
  EXPECT_EQ(s.bytes_written, s.bytes_read);
  EXPECT_EQ(s.checksum_failures, 0);
  if (GetParam()) {
    EXPECT_LT(s.bytes_used, s.bytes_written);  // half the pages compress well
  } else {
    EXPECT_EQ(s.bytes_used, s.bytes_written);
  }
}

TEST_P(RamTierTest, CompressedPagesCountStoredBytes) {
  auto tier = MakeRamTier({.capacity_bytes = 1 << 20, .compress = GetParam()});
  const auto page = PageBytes(5, 65536, /*compressible=*/true);
  ASSERT_TRUE(PutOne(*tier, 5, page).ok());
  if (GetParam()) {
    EXPECT_LT(tier->stats().bytes_used, 65536 / 10);
    EXPECT_EQ(tier->name(), "ram:zstd");
  } else {
    EXPECT_EQ(tier->stats().bytes_used, 65536);
    EXPECT_EQ(tier->name(), "ram");
  }
  // Incompressible pages are stored as they are, never larger.
  const auto noise = PageBytes(6, 65536);
  ASSERT_TRUE(PutOne(*tier, 6, noise).ok());
  std::vector<uint8_t> out(65536);
  ASSERT_TRUE(GetOne(*tier, 6, out).ok());
  EXPECT_EQ(out, noise);
}

TEST_P(RamTierTest, UnknownKeyIsNotFound) {
  auto tier = MakeRamTier({.capacity_bytes = 1 << 20, .compress = GetParam()});
  std::vector<uint8_t> out(16);
  EXPECT_EQ(GetOne(*tier, 42, out).code(), StatusCode::kNotFound);
  EXPECT_FALSE(tier->Contains(42));
}

TEST_P(RamTierTest, WrongReadSizeIsInvalidArgument) {
  auto tier = MakeRamTier({.capacity_bytes = 1 << 20, .compress = GetParam()});
  ASSERT_TRUE(PutOne(*tier, 1, PageBytes(1, 100)).ok());
  std::vector<uint8_t> out(99);
  EXPECT_EQ(GetOne(*tier, 1, out).code(), StatusCode::kInvalidArgument);
}

TEST_P(RamTierTest, PutReplacesTheSameKey) {
  auto tier = MakeRamTier({.capacity_bytes = 1 << 20, .compress = GetParam()});
  ASSERT_TRUE(PutOne(*tier, 9, PageBytes(1, 1000)).ok());
  const auto second = PageBytes(2, 300);
  ASSERT_TRUE(PutOne(*tier, 9, second).ok());
  std::vector<uint8_t> out(300);
  ASSERT_TRUE(GetOne(*tier, 9, out).ok());
  EXPECT_EQ(out, second);
  EXPECT_EQ(tier->stats().pages, 1);
  EXPECT_EQ(tier->stats().bytes_used, 300);
  // A key given twice in one batch keeps the last page.
  const auto a = PageBytes(3, 50), b = PageBytes(4, 50);
  const PageWrite writes[] = {{10, a}, {10, b}};
  ASSERT_TRUE(tier->Put(writes).ok());
  out.resize(50);
  ASSERT_TRUE(GetOne(*tier, 10, out).ok());
  EXPECT_EQ(out, b);
}

TEST(RamTierTest, ExhaustionStoresNothingAndEraseFreesSpace) {
  auto tier = MakeRamTier({.capacity_bytes = 1000});
  const auto p600 = PageBytes(1, 600), p300 = PageBytes(2, 300), p500 = PageBytes(3, 500);
  ASSERT_TRUE(PutOne(*tier, 1, p600).ok());
  const PageWrite batch[] = {{2, p300}, {3, p500}};
  const Status full = tier->Put(batch);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("800 bytes"), std::string::npos) << full.message();
  EXPECT_NE(full.message().find("400 are free"), std::string::npos) << full.message();
  EXPECT_FALSE(tier->Contains(2));
  EXPECT_FALSE(tier->Contains(3));
  EXPECT_EQ(tier->stats().pages, 1);
  EXPECT_EQ(tier->stats().bytes_used, 600);

  const PageKey erase[] = {1};
  tier->Erase(erase);
  EXPECT_FALSE(tier->Contains(1));
  EXPECT_EQ(tier->stats().bytes_used, 0);
  ASSERT_TRUE(tier->Put(batch).ok());
  EXPECT_EQ(tier->stats().bytes_used, 800);
  // Replacing a page may use the space the old version frees.
  ASSERT_TRUE(PutOne(*tier, 3, PageBytes(4, 700)).ok());
  EXPECT_EQ(tier->stats().bytes_used, 1000);
}

TEST_P(RamTierTest, GetAsyncEqualsGet) {
  auto tier = MakeRamTier({.capacity_bytes = 16 << 20, .compress = GetParam()});
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (PageKey k = 0; k < 32; ++k) pages.push_back(PageBytes(k, 1000 + k, k % 2 == 0));
  for (PageKey k = 0; k < 32; ++k) writes.push_back({k, pages[k]});
  ASSERT_TRUE(tier->Put(writes).ok());
  std::vector<std::vector<uint8_t>> sync_out, async_out;
  std::vector<PageRead> sync_reads, async_reads;
  for (PageKey k = 0; k < 34; ++k) {  // 32 and 33 are missing
    sync_out.emplace_back(1000 + k);
    async_out.emplace_back(1000 + k);
  }
  for (PageKey k = 0; k < 34; ++k) {
    sync_reads.push_back({k, sync_out[k]});
    async_reads.push_back({k, async_out[k]});
  }
  auto future = tier->GetAsync(async_reads);
  const std::vector<Status> sync = tier->Get(sync_reads);
  const std::vector<Status> async = future.get();
  ASSERT_EQ(sync.size(), async.size());
  for (size_t i = 0; i < sync.size(); ++i) EXPECT_EQ(sync[i].code(), async[i].code()) << i;
  EXPECT_EQ(sync_out, async_out);
  EXPECT_EQ(sync[33].code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Plain, RamTierTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Zstd, RamTierTest, ::testing::Values(true));

// --------------------------------------------------------------------------------------- disk

class DiskTierTest : public ::testing::TestWithParam<bool> {  // param: direct_io
 protected:
  std::unique_ptr<KvTier> Make(const std::string& name, int64_t page_bytes,
                               int64_t capacity_bytes) {
    return Disk(name + (GetParam() ? "_direct" : "_buffered"), page_bytes, capacity_bytes,
                GetParam());
  }
};

TEST_P(DiskTierTest, RoundTripsManyPagesOfOddSizes) {
  // Page sizes around the slot boundaries: 64-byte header + page fills a 4096 slot exactly at 4032.
  for (int64_t page_bytes : {1, 13, 4031, 4032, 4033, 20480}) {
    auto tier = Make("odd" + std::to_string(page_bytes), page_bytes,
                     200 * kv_internal::DiskSlotBytes(page_bytes));
    ASSERT_NE(tier, nullptr);
    RoundTrip(*tier, 1000, 150, {static_cast<size_t>(page_bytes)}, false);
    RoundTrip(*tier, 5000, 50, {static_cast<size_t>(page_bytes)}, true);
    EXPECT_EQ(tier->stats().pages, 200);
    EXPECT_EQ(tier->stats().checksum_failures, 0);
  }
}

TEST_P(DiskTierTest, UnknownKeyIsNotFoundAndWrongSizesAreInvalid) {
  auto tier = Make("notfound", 100, 1 << 20);
  std::vector<uint8_t> out(100);
  EXPECT_EQ(GetOne(*tier, 7, out).code(), StatusCode::kNotFound);
  EXPECT_EQ(PutOne(*tier, 7, PageBytes(7, 99)).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(tier->Contains(7));
  ASSERT_TRUE(PutOne(*tier, 7, PageBytes(7, 100)).ok());
  std::vector<uint8_t> small(50);
  EXPECT_EQ(GetOne(*tier, 7, small).code(), StatusCode::kInvalidArgument);
}

TEST_P(DiskTierTest, PutReplacesTheSameKey) {
  auto tier = Make("replace", 500, 1 << 20);
  ASSERT_TRUE(PutOne(*tier, 3, PageBytes(1, 500)).ok());
  const auto second = PageBytes(2, 500);
  ASSERT_TRUE(PutOne(*tier, 3, second).ok());
  std::vector<uint8_t> out(500);
  ASSERT_TRUE(GetOne(*tier, 3, out).ok());
  EXPECT_EQ(out, second);
  EXPECT_EQ(tier->stats().pages, 1);
}

TEST_P(DiskTierTest, ExhaustionStoresNothingAndEraseFreesSpace) {
  const int64_t slot = kv_internal::DiskSlotBytes(1000);
  auto tier = Make("full", 1000, 4 * slot + slot / 2);  // room for 4 pages
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().capacity_bytes, 4 * slot);
  std::vector<std::vector<uint8_t>> pages;
  for (PageKey k = 0; k < 6; ++k) pages.push_back(PageBytes(k, 1000));
  const PageWrite three[] = {{0, pages[0]}, {1, pages[1]}, {2, pages[2]}};
  ASSERT_TRUE(tier->Put(three).ok());
  const PageWrite two[] = {{3, pages[3]}, {4, pages[4]}};
  const Status full = tier->Put(two);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("need " + std::to_string(2 * slot) + " bytes"), std::string::npos)
      << full.message();
  EXPECT_FALSE(tier->Contains(3));
  EXPECT_FALSE(tier->Contains(4));
  EXPECT_EQ(tier->stats().pages, 3);

  // Replacing all four slots' worth when full reuses the replaced pages' slots.
  const PageWrite four[] = {{0, pages[5]}, {1, pages[4]}, {2, pages[3]}, {5, pages[0]}};
  ASSERT_TRUE(tier->Put(four).ok());
  std::vector<uint8_t> out(1000);
  ASSERT_TRUE(GetOne(*tier, 0, out).ok());
  EXPECT_EQ(out, pages[5]);
  ASSERT_TRUE(GetOne(*tier, 5, out).ok());
  EXPECT_EQ(out, pages[0]);

  const PageKey erase[] = {0, 1};
  tier->Erase(erase);
  EXPECT_EQ(tier->stats().pages, 2);
  ASSERT_TRUE(tier->Put(two).ok());
  EXPECT_EQ(tier->stats().bytes_used, 4 * slot);
}

TEST_P(DiskTierTest, BatchesCoalesceIntoOneSyscall) {
  auto tier = Make("coalesce", 20480, 256 << 20);
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (PageKey k = 0; k < 64; ++k) pages.push_back(PageBytes(k, 20480));
  for (PageKey k = 0; k < 64; ++k) writes.push_back({k * 7919, pages[k]});  // keys in any order
  ASSERT_TRUE(tier->Put(writes).ok());
  EXPECT_EQ(tier->stats().write_ops, 1);

  std::vector<std::vector<uint8_t>> outs(64, std::vector<uint8_t>(20480));
  std::vector<PageRead> reads;
  std::vector<int> order(64);
  for (int i = 0; i < 64; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  for (int i : order) reads.push_back({static_cast<PageKey>(i) * 7919, outs[i]});
  for (const Status& s : tier->Get(reads)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tier->stats().read_ops, 1);
  EXPECT_EQ(outs, pages);

  // Every other page: 32 runs of one slot each.
  std::vector<PageRead> sparse;
  for (int i = 0; i < 64; i += 2) sparse.push_back({static_cast<PageKey>(i) * 7919, outs[i]});
  for (const Status& s : tier->Get(sparse)) ASSERT_TRUE(s.ok());
  EXPECT_EQ(tier->stats().read_ops, 1 + 32);
}

TEST_P(DiskTierTest, FreedSlotsAreReusedAsConsecutiveRuns) {
  auto tier = Make("reuse", 100, 64 * kv_internal::DiskSlotBytes(100));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (PageKey k = 0; k < 64; ++k) pages.push_back(PageBytes(k, 100));
  for (PageKey k = 0; k < 64; ++k) writes.push_back({k, pages[k]});
  ASSERT_TRUE(tier->Put(writes).ok());
  // Free slots 10..19 and a scattered few; a batch of 10 then lands in the run 10..19.
  std::vector<PageKey> erase = {3, 40, 50};
  for (PageKey k = 10; k < 20; ++k) erase.push_back(k);
  tier->Erase(erase);
  const int64_t ops_before = tier->stats().write_ops;
  std::vector<PageWrite> batch;
  for (PageKey k = 100; k < 110; ++k) batch.push_back({k, pages[k - 100]});
  ASSERT_TRUE(tier->Put(batch).ok());
  EXPECT_EQ(tier->stats().write_ops - ops_before, 1);
  for (PageKey k = 100; k < 110; ++k)
    EXPECT_EQ(*Info(*tier).SlotOf(k), static_cast<int64_t>(k - 90));
}

// Opens the tier's page file separately, as a disk fault would, and changes bytes in place.
void Poke(const std::string& path, int64_t offset, const void* bytes, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes, n, offset), static_cast<ssize_t>(n));
  ::close(fd);
}
uint8_t Peek(const std::string& path, int64_t offset) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  uint8_t byte = 0;
  EXPECT_EQ(::pread(fd, &byte, 1, offset), 1);
  ::close(fd);
  return byte;
}

class CorruptionTest : public DiskTierTest {
 protected:
  static constexpr int64_t kPageBytes = 5000;
  static constexpr int kPages = 16;

  void SetUp() override {
    path_ = TempPath(std::string("corrupt_") + (GetParam() ? "direct" : "buffered"));
    auto tier = MakeDiskTier({.path = path_,
                              .capacity_bytes = 1 << 20,
                              .page_bytes = kPageBytes,
                              .direct_io = GetParam(),
                              .persistent = false});
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(tier).value();
    std::vector<PageWrite> writes;
    for (PageKey k = 0; k < kPages; ++k) pages_.push_back(PageBytes(k + 100, kPageBytes));
    for (PageKey k = 0; k < kPages; ++k) writes.push_back({k + 100, pages_[k]});
    ASSERT_TRUE(tier_->Put(writes).ok());
  }

  int64_t SlotOffset(PageKey key) const {
    return kv_internal::DiskSlotOffset(*Info(*tier_).SlotOf(key), Info(*tier_).slot_bytes());
  }

  // Reads every page in one batch; returns the statuses and checks the good pages' bytes.
  std::vector<Status> ReadAll() {
    outs_.assign(kPages, std::vector<uint8_t>(kPageBytes, 0xEE));
    std::vector<PageRead> reads;
    for (PageKey k = 0; k < kPages; ++k) reads.push_back({k + 100, outs_[k]});
    std::vector<Status> results = tier_->Get(reads);
    for (int k = 0; k < kPages; ++k) {
      if (results[k].ok()) {
        EXPECT_EQ(outs_[k], pages_[k]) << "page " << k + 100;
      } else {
        EXPECT_EQ(outs_[k], std::vector<uint8_t>(kPageBytes, 0))
            << "a failed page's output is zeroed";
      }
    }
    return results;
  }

  std::string path_;
  std::unique_ptr<KvTier> tier_;
  std::vector<std::vector<uint8_t>> pages_;
  std::vector<std::vector<uint8_t>> outs_;
};

TEST_P(CorruptionTest, FlippedDataByteIsDataLossForThatPageOnly) {
  const PageKey victim = 107;
  const int64_t offset = SlotOffset(victim) + kSlotHeaderBytes + 1234;
  const uint8_t flipped = Peek(path_, offset) ^ 0x01;
  Poke(path_, offset, &flipped, 1);
  const std::vector<Status> results = ReadAll();
  for (int k = 0; k < kPages; ++k) {
    if (k + 100 == static_cast<int>(victim)) {
      EXPECT_EQ(results[k].code(), StatusCode::kDataLoss);
      EXPECT_NE(results[k].message().find("page 107"), std::string::npos) << results[k].message();
      EXPECT_NE(results[k].message().find("slot"), std::string::npos) << results[k].message();
    } else {
      EXPECT_TRUE(results[k].ok()) << results[k].ToString();
    }
  }
  EXPECT_EQ(tier_->stats().checksum_failures, 1);
}

TEST_P(CorruptionTest, WrongKeyInHeaderIsDataLoss) {
  const PageKey victim = 112;
  const uint64_t other_key = 113;
  Poke(path_, SlotOffset(victim) + 8, &other_key, sizeof other_key);  // SlotHeader::key
  const std::vector<Status> results = ReadAll();
  for (int k = 0; k < kPages; ++k) {
    EXPECT_EQ(results[k].code(),
              k + 100 == static_cast<int>(victim) ? StatusCode::kDataLoss : StatusCode::kOk);
  }
  EXPECT_NE(results[12].message().find("key 113"), std::string::npos) << results[12].message();
}

TEST_P(CorruptionTest, SwappedSlotsFailTheSeededChecksum) {
  // A whole slot copied over another (header and all) still names the wrong key.
  std::vector<uint8_t> slot(static_cast<size_t>(Info(*tier_).slot_bytes()));
  const int fd = ::open(path_.c_str(), O_RDWR);
  ASSERT_EQ(::pread(fd, slot.data(), slot.size(), SlotOffset(101)),
            static_cast<ssize_t>(slot.size()));
  ASSERT_EQ(::pwrite(fd, slot.data(), slot.size(), SlotOffset(102)),
            static_cast<ssize_t>(slot.size()));
  ::close(fd);
  const std::vector<Status> results = ReadAll();
  EXPECT_TRUE(results[1].ok());
  EXPECT_EQ(results[2].code(), StatusCode::kDataLoss);
}

TEST_P(CorruptionTest, TruncatedFileFailsCleanly) {
  const int64_t cut = SlotOffset(110) + kSlotHeaderBytes + 100;  // inside page 110
  ASSERT_EQ(::truncate(path_.c_str(), cut), 0);
  const std::vector<Status> results = ReadAll();
  for (int k = 0; k < kPages; ++k) {
    const int64_t slot_offset = SlotOffset(k + 100);
    if (slot_offset + kSlotHeaderBytes + kPageBytes <= cut) {
      EXPECT_TRUE(results[k].ok()) << results[k].ToString();
    } else {
      EXPECT_TRUE(results[k].code() == StatusCode::kDataLoss ||
                  results[k].code() == StatusCode::kIoError)
          << results[k].ToString();
    }
  }
  ASSERT_EQ(::truncate(path_.c_str(), 0), 0);
  for (const Status& s : ReadAll()) EXPECT_FALSE(s.ok());
}

TEST_P(DiskTierTest, GetAsyncEqualsGet) {
  auto tier = Make("async", 3000, 8 << 20);
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (PageKey k = 0; k < 40; ++k) pages.push_back(PageBytes(k, 3000));
  for (PageKey k = 0; k < 40; ++k) writes.push_back({k, pages[k]});
  ASSERT_TRUE(tier->Put(writes).ok());
  std::vector<std::vector<uint8_t>> sync_out(42, std::vector<uint8_t>(3000)), async_out = sync_out;
  std::vector<PageRead> sync_reads, async_reads;
  for (PageKey k = 0; k < 42; ++k) {
    sync_reads.push_back({k, sync_out[k]});
    async_reads.push_back({k, async_out[k]});
  }
  auto future = tier->GetAsync(async_reads);
  const std::vector<Status> sync = tier->Get(sync_reads);
  const std::vector<Status> async = future.get();
  for (size_t i = 0; i < sync.size(); ++i) EXPECT_EQ(sync[i].code(), async[i].code()) << i;
  EXPECT_EQ(sync_out, async_out);
  EXPECT_EQ(async[41].code(), StatusCode::kNotFound);
  // Futures still pending at destruction are completed, not broken.
  std::vector<std::future<std::vector<Status>>> pending;
  for (int i = 0; i < 4; ++i) pending.push_back(tier->GetAsync(async_reads));
  tier.reset();
  for (auto& f : pending) EXPECT_TRUE(f.get()[0].ok());
}

TEST_P(DiskTierTest, DirectIoWorksOrFallsBackCleanly) {
  auto tier = Make("mode", 8192, 1 << 20);
  ASSERT_NE(tier, nullptr);
  const bool direct = Info(*tier).direct_io_active();
  if (GetParam()) {
    if (direct) {
      EXPECT_EQ(tier->name(), "disk:direct");
    } else {
      EXPECT_NE(tier->name().find("O_DIRECT refused"), std::string::npos) << tier->name();
    }
  } else {
    EXPECT_FALSE(direct);
    EXPECT_EQ(tier->name(), "disk");
  }
  RoundTrip(*tier, 1, 20, {8192}, false);
}

TEST_P(DiskTierTest, ScratchPageFileIsDeletedWithTheTier) {
  const std::string path = TempPath(std::string("deleted_") + (GetParam() ? "direct" : "buffered"));
  auto tier = MakeDiskTier({.path = path,
                            .capacity_bytes = 1 << 20,
                            .page_bytes = 10,
                            .direct_io = GetParam(),
                            .persistent = false});
  ASSERT_TRUE(tier.ok());
  EXPECT_TRUE(std::filesystem::exists(path));
  tier->reset();
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Four threads each Put and Get their own keys (and read the shared ones) at the same time.
void ConcurrentPutGet(KvTier& tier, size_t page_bytes) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 25; ++round) {
        std::vector<std::vector<uint8_t>> pages;
        std::vector<PageWrite> writes;
        for (int i = 0; i < 8; ++i)
          pages.push_back(PageBytes(t * 1000 + round * 8 + i, page_bytes, i % 2));
        for (int i = 0; i < 8; ++i)
          writes.push_back({static_cast<PageKey>(t * 1000 + round * 8 + i), pages[i]});
        if (!tier.Put(writes).ok()) ++failures;
        std::vector<std::vector<uint8_t>> outs(8, std::vector<uint8_t>(page_bytes));
        std::vector<PageRead> reads;
        for (int i = 0; i < 8; ++i) reads.push_back({writes[i].key, outs[i]});
        const std::vector<Status> results =
            round % 2 ? tier.GetAsync(reads).get() : tier.Get(reads);
        for (int i = 0; i < 8; ++i) {
          if (!results[i].ok() || outs[i] != pages[i]) ++failures;
        }
        if (round % 5 == 4) {
          std::vector<PageKey> keys;
          for (int i = 0; i < 8; i += 2) keys.push_back(writes[i].key);
          tier.Erase(keys);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tier.stats().checksum_failures, 0);
  EXPECT_EQ(tier.stats().pages, 4 * (25 * 8 - 5 * 4));
}

TEST(TierConcurrencyTest, RamFromFourThreads) {
  auto tier = MakeRamTier({.capacity_bytes = 64 << 20, .compress = true});
  ConcurrentPutGet(*tier, 3000);
}

TEST_P(DiskTierTest, ConcurrentPutGetFromFourThreads) {
  auto tier = Make("threads", 3000, 1000 * kv_internal::DiskSlotBytes(3000));
  ConcurrentPutGet(*tier, 3000);
}

INSTANTIATE_TEST_SUITE_P(Buffered, DiskTierTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Direct, DiskTierTest, ::testing::Values(true));
INSTANTIATE_TEST_SUITE_P(Buffered, CorruptionTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Direct, CorruptionTest, ::testing::Values(true));

TEST(DiskTierOptionsTest, BadOptionsAreInvalidArgument) {
  const std::string dir = ::testing::TempDir();
  auto no_page =
      MakeDiskTier({.path = TempPath("opt"), .capacity_bytes = 1 << 20, .page_bytes = 0});
  EXPECT_EQ(no_page.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_page.status().message().find("page_bytes"), std::string::npos);
  auto small = MakeDiskTier({.path = TempPath("opt"), .capacity_bytes = 4095, .page_bytes = 10});
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("less than one slot"), std::string::npos)
      << small.status().message();
  auto no_dir = MakeDiskTier(
      {.path = dir + "/no_such_dir_kvl/pages", .capacity_bytes = 1 << 20, .page_bytes = 10});
  EXPECT_EQ(no_dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_dir.status().message().find("does not exist"), std::string::npos);
  auto no_path = MakeDiskTier({.path = "", .capacity_bytes = 1 << 20, .page_bytes = 10});
  EXPECT_EQ(no_path.status().code(), StatusCode::kInvalidArgument);
  auto is_dir = MakeDiskTier({.path = dir, .capacity_bytes = 1 << 20, .page_bytes = 10});
  EXPECT_EQ(is_dir.status().code(), StatusCode::kInvalidArgument);
  // Something that is not a regular file is refused before it is opened, and so never written or
  // deleted. A FIFO of our own stands in for a device: a test must never point at /dev files.
  const std::string fifo = dir + "/kvl_tier_fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto device = MakeDiskTier({.path = fifo, .capacity_bytes = 1 << 20, .page_bytes = 10});
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("not a regular file"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(fifo));
  std::filesystem::remove(fifo);
}

// Random Put/Get/Erase sequences against a map, with a capacity small enough that batches are
// often refused: contents, Contains, NOT_FOUND and all-or-nothing exhaustion must all agree.
void PropertyTest(KvTier& tier, int64_t capacity_units, bool fixed_size, size_t page_bytes,
                  uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<PageKey, std::vector<uint8_t>> model;
  uint64_t version = 0;
  auto units = [&](const std::vector<uint8_t>& p) {
    return fixed_size ? 1 : static_cast<int64_t>(p.size());
  };
  for (int step = 0; step < 400; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      const int n = 1 + static_cast<int>(rng() % 6);
      std::map<PageKey, std::vector<uint8_t>> batch;
      std::vector<std::vector<uint8_t>> storage;
      std::vector<PageWrite> writes;
      for (int i = 0; i < n; ++i) {
        const PageKey key = rng() % 24;
        const size_t size = fixed_size ? page_bytes : 1 + rng() % page_bytes;
        storage.push_back(PageBytes(key * 1000 + ++version, size, rng() % 2));
      }
      for (int i = 0; i < n; ++i) {
        writes.push_back({rng() % 24, storage[i]});
        batch[writes.back().key] = storage[i];
      }
      int64_t used = 0;
      for (const auto& [k, p] : model) used += batch.count(k) ? 0 : units(p);
      for (const auto& [k, p] : batch) used += units(p);
      const Status s = tier.Put(writes);
      if (used <= capacity_units) {
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (auto& [k, p] : batch) model[k] = p;
      } else {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
      }
    } else if (op < 8) {
      std::vector<PageKey> keys;
      for (int i = 0; i < 1 + static_cast<int>(rng() % 8); ++i) keys.push_back(rng() % 26);
      std::vector<std::vector<uint8_t>> outs;
      for (PageKey k : keys)
        outs.emplace_back(model.count(k) ? model[k].size() : (fixed_size ? page_bytes : 5));
      std::vector<PageRead> reads;
      for (size_t i = 0; i < keys.size(); ++i) reads.push_back({keys[i], outs[i]});
      const std::vector<Status> results = tier.Get(reads);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (model.count(keys[i])) {
          ASSERT_TRUE(results[i].ok()) << results[i].ToString();
          ASSERT_EQ(outs[i], model[keys[i]]);
        } else {
          ASSERT_EQ(results[i].code(), StatusCode::kNotFound);
        }
      }
    } else {
      std::vector<PageKey> keys = {static_cast<PageKey>(rng() % 24),
                                   static_cast<PageKey>(rng() % 24)};
      tier.Erase(keys);
      for (PageKey k : keys) model.erase(k);
    }
    for (PageKey k = 0; k < 26; ++k)
      ASSERT_EQ(tier.Contains(k), model.count(k) != 0) << "step " << step;
    ASSERT_EQ(tier.stats().pages, static_cast<int64_t>(model.size()));
  }
}

TEST(TierPropertyTest, RamMatchesAMap) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    auto tier = MakeRamTier({.capacity_bytes = 6000});
    PropertyTest(*tier, 6000, false, 1000, seed);
  }
}

TEST(TierPropertyTest, DiskMatchesAMap) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    auto tier = Disk("property", 700, 10 * kv_internal::DiskSlotBytes(700));
    PropertyTest(*tier, 10, true, 700, seed);
  }
}

}  // namespace
}  // namespace kvl
