// How the disk tier reads: a page's layers (put in one batch) come back in one read request; one
// layer of many pages is a request per page, all in flight at once through io_uring where the
// kernel allows it, with the same bytes as one preadv after another; a damaged page is DATA_LOSS
// either way; and the read queue itself on short files and bad descriptors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "kv/tiers/disk_read_queue.h"
#include "kv/tiers/disk_tier.h"
#include "kvl/kv_tier.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

using kv_internal::DiskReadQueue;
using kv_internal::DiskReadRequest;
using kv_internal::DiskTierInfo;

// TinyLlama's shape: 22 layers, a layer page of 16 tokens x 256 K and V floats.
constexpr int kLayers = 22;
constexpr int64_t kLayerBytes = 16 * 256 * 2 * 4;

struct ReadMode {
  bool direct;
  bool io_uring;
};

std::string ModeSuffix(ReadMode mode) {
  return std::string(mode.direct ? "Direct" : "Buffered") + (mode.io_uring ? "IoUring" : "Preadv");
}
std::string ModeName(const ::testing::TestParamInfo<ReadMode>& info) {
  return ModeSuffix(info.param);
}

class DiskTierReadsTest : public ::testing::TestWithParam<ReadMode> {
 protected:
  std::unique_ptr<DiskKvTier> Make(const std::string& name, int64_t page_bytes, int64_t slots) {
    auto tier = MakeDiskTier({.path = TempPath(name + ModeSuffix(GetParam())),
                              .capacity_bytes = slots * kv_internal::DiskSlotBytes(page_bytes),
                              .page_bytes = page_bytes,
                              .direct_io = GetParam().direct,
                              .persistent = false,
                              .io_uring = GetParam().io_uring});
    EXPECT_TRUE(tier.ok()) << tier.status().ToString();
    return tier.ok() ? std::move(tier).value() : nullptr;
  }
  static const DiskTierInfo& Info(const KvTier& tier) {
    return dynamic_cast<const DiskTierInfo&>(tier);
  }
};

// The key of one layer of one KV page, as the pager makes them.
PageKey LayerKey(uint64_t page, int layer) { return page << 8 | static_cast<uint64_t>(layer); }

// Puts a page's layers in one batch (as the pager and the KV store do); returns their bytes.
std::vector<std::vector<uint8_t>> PutPage(KvTier& tier, uint64_t page, int num_layers = kLayers) {
  std::vector<std::vector<uint8_t>> layers;
  for (int l = 0; l < num_layers; ++l) layers.push_back(PageBytes(LayerKey(page, l), kLayerBytes));
  std::vector<PageWrite> writes;
  for (int l = 0; l < num_layers; ++l) writes.push_back({LayerKey(page, l), layers[l]});
  EXPECT_TRUE(tier.Put(writes).ok());
  return layers;
}

TEST_P(DiskTierReadsTest, APagesLayersComeBackInOneRequest) {
  auto tier = Make("one_request", kLayerBytes, 12 * kLayers);
  ASSERT_NE(tier, nullptr);
  // Eight pages, then every other one let go: the free space is in holes of one page each, so a
  // new page's layers must still land together.
  for (uint64_t p = 0; p < 8; ++p) PutPage(*tier, p);
  for (uint64_t p = 0; p < 8; p += 2) {
    std::vector<PageKey> keys;
    for (int l = 0; l < kLayers; ++l) keys.push_back(LayerKey(p, l));
    tier->Erase(keys);
  }
  for (uint64_t p : {100, 101, 102}) {
    const std::vector<std::vector<uint8_t>> layers = PutPage(*tier, p);
    std::vector<std::vector<uint8_t>> outs(kLayers, std::vector<uint8_t>(kLayerBytes, 0xAB));
    std::vector<PageRead> reads;
    for (int l = kLayers - 1; l >= 0; --l) reads.push_back({LayerKey(p, l), outs[l]});
    const int64_t before = tier->stats().read_ops;
    for (const Status& s : tier->Get(reads)) ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(tier->stats().read_ops - before, 1) << "page " << p;
    EXPECT_EQ(outs, layers) << "page " << p;
  }
}

TEST_P(DiskTierReadsTest, OneLayerOfManyPagesIsARequestPerPageWithTheSameBytes) {
  // More reads than one ring holds in flight, and (O_DIRECT) than one wave's bounce buffer.
  constexpr int kPages = 150;
  constexpr int kFewLayers = 3;
  auto tier = Make("layer_of_pages", kLayerBytes, kPages * kFewLayers);
  ASSERT_NE(tier, nullptr);
  std::vector<std::vector<std::vector<uint8_t>>> pages;
  for (uint64_t p = 0; p < kPages; ++p) pages.push_back(PutPage(*tier, p, kFewLayers));
  for (int layer = 0; layer < kFewLayers; ++layer) {
    std::vector<std::vector<uint8_t>> outs(kPages, std::vector<uint8_t>(kLayerBytes, 0xAB));
    std::vector<PageRead> reads;
    for (uint64_t p = 0; p < kPages; ++p) reads.push_back({LayerKey(p, layer), outs[p]});
    const int64_t before = tier->stats().read_ops;
    const std::vector<Status> results = tier->GetAsync(reads).get();
    for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(tier->stats().read_ops - before, kPages) << "layer " << layer;
    for (uint64_t p = 0; p < kPages; ++p) {
      ASSERT_EQ(outs[p], pages[p][static_cast<size_t>(layer)]) << "page " << p << " layer " << layer;
    }
  }
  // The tier says how it read; asked for io_uring, it is either used or refused with a reason.
  const std::string path = Info(*tier).read_path();
  if (GetParam().io_uring) {
    EXPECT_TRUE(Info(*tier).io_uring_active() || path.find("preadv (") == 0) << path;
  } else {
    EXPECT_FALSE(Info(*tier).io_uring_active());
    EXPECT_EQ(path, "preadv (io_uring not asked for)");
  }
}

TEST_P(DiskTierReadsTest, AFlippedByteIsDataLossForThatLayerOnly) {
  auto tier = Make("corrupt", kLayerBytes, 4 * kLayers);
  ASSERT_NE(tier, nullptr);
  const std::vector<std::vector<uint8_t>> layers = PutPage(*tier, 5);
  const PageKey victim = LayerKey(5, 9);
  const int64_t offset = kv_internal::DiskSlotOffset(*Info(*tier).SlotOf(victim),
                                                     Info(*tier).slot_bytes()) +
                         kv_internal::kSlotHeaderBytes + 777;
  const std::string path = TempPath("corrupt" + ModeSuffix(GetParam()));
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
  ::close(fd);
  std::vector<std::vector<uint8_t>> outs(kLayers, std::vector<uint8_t>(kLayerBytes, 0xAB));
  std::vector<PageRead> reads;
  for (int l = 0; l < kLayers; ++l) reads.push_back({LayerKey(5, l), outs[l]});
  const std::vector<Status> results = tier->Get(reads);
  for (int l = 0; l < kLayers; ++l) {
    if (LayerKey(5, l) == victim) {
      EXPECT_EQ(results[l].code(), StatusCode::kDataLoss) << results[l].ToString();
      EXPECT_EQ(outs[l], std::vector<uint8_t>(kLayerBytes, 0)) << "never wrong bytes";
    } else {
      EXPECT_TRUE(results[l].ok()) << "layer " << l << ": " << results[l].ToString();
      EXPECT_EQ(outs[l], layers[l]) << "layer " << l;
    }
  }
  EXPECT_EQ(tier->stats().checksum_failures, 1);
}

INSTANTIATE_TEST_SUITE_P(Modes, DiskTierReadsTest,
                         ::testing::Values(ReadMode{false, false}, ReadMode{false, true},
                                           ReadMode{true, false}, ReadMode{true, true}),
                         ModeName);

// ------------------------------------------------------------------------------ the read queue

class DiskReadQueueTest : public ::testing::TestWithParam<bool> {};  // param: io_uring

TEST_P(DiskReadQueueTest, ReadsToTheEndOfTheFileAndReportsErrors) {
  const std::string path = TempPath(std::string("queue_") + (GetParam() ? "uring" : "preadv"));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> file = PageBytes(1, 10000);
  ASSERT_EQ(::pwrite(fd, file.data(), file.size(), 0), static_cast<ssize_t>(file.size()));
  DiskReadQueue queue(GetParam());

  // Three reads: two inside the file (one scattered over two buffers), one across its end.
  std::vector<uint8_t> a(3000), b1(1000), b2(2000), c(4000, 0xEE);
  iovec iov_a{a.data(), a.size()};
  iovec iov_b[2] = {{b1.data(), b1.size()}, {b2.data(), b2.size()}};
  iovec iov_c{c.data(), c.size()};
  std::vector<DiskReadRequest> requests = {
      {.iov = &iov_a, .iov_count = 1, .offset = 0},
      {.iov = iov_b, .iov_count = 2, .offset = 4000},
      {.iov = &iov_c, .iov_count = 1, .offset = 8000},
  };
  EXPECT_GE(queue.ReadAll(fd, requests), 3);
  EXPECT_EQ(requests[0].bytes_read, 3000);
  EXPECT_EQ(requests[1].bytes_read, 3000);
  EXPECT_EQ(requests[2].bytes_read, 2000);  // the file ends 2000 bytes in
  for (const DiskReadRequest& r : requests) EXPECT_EQ(r.error, 0);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), file.begin()));
  EXPECT_TRUE(std::equal(b1.begin(), b1.end(), file.begin() + 4000));
  EXPECT_TRUE(std::equal(b2.begin(), b2.end(), file.begin() + 5000));
  EXPECT_TRUE(std::equal(c.begin(), c.begin() + 2000, file.begin() + 8000));
  ::close(fd);
  ::unlink(path.c_str());

  // A closed descriptor: the OS's reason, for every request.
  std::vector<uint8_t> d(100);
  iovec iov_d{d.data(), d.size()};
  std::vector<DiskReadRequest> bad = {{.iov = &iov_d, .iov_count = 1, .offset = 0}};
  queue.ReadAll(fd, bad);
  EXPECT_EQ(bad[0].error, EBADF);
  EXPECT_EQ(bad[0].bytes_read, 0);
}

INSTANTIATE_TEST_SUITE_P(Both, DiskReadQueueTest, ::testing::Values(false, true));

}  // namespace
}  // namespace kvl
