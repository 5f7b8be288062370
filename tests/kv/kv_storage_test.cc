// KvBlockStorage layout and copies; PagedKvCache row lookup through block tables.
#include <gtest/gtest.h>

#include <vector>

#include "kv_test_util.h"
#include "kvl/kv_manager.h"

namespace kvl {
namespace {

using testing_kv::Make;
using testing_kv::Options;
using testing_kv::Range;
using testing_kv::Step;

// Each layer's K rows are followed by its V rows (one layer of a page moves to a tier as one span),
// then come the residual checkpoints of every layer.
TEST(KvBlockStorageTest, EachBlockIsOneAlignedRegionOfLayersThenResiduals) {
  const KvBlockLayout layout{4, 3, 5, 7};
  auto storage = KvBlockStorage::Create(layout, 6);
  ASSERT_TRUE(storage.ok()) << storage.status().ToString();
  KvBlockStorage& s = **storage;
  EXPECT_EQ(s.num_blocks(), 6);
  // (2 x 3 x 4 x 5 + 3 x 4 x 7) floats = 816 bytes, padded to 832 (64-byte aligned blocks).
  const int64_t stride = 832;
  for (BlockId b = 0; b < 6; ++b) {
    const uint8_t* block = s.bytes(b);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u);
    EXPECT_EQ(block - s.bytes(0), b * stride);
    for (int64_t l = 0; l < 3; ++l) {
      EXPECT_EQ(reinterpret_cast<const uint8_t*>(s.keys(b, l)) - block, 2 * l * 4 * 5 * 4);
      EXPECT_EQ(reinterpret_cast<const uint8_t*>(s.values(b, l)) - block, (2 * l + 1) * 4 * 5 * 4);
      EXPECT_EQ(reinterpret_cast<const uint8_t*>(s.residuals(b, l)) - block,
                (6 * 4 * 5 + l * 4 * 7) * 4);
    }
  }
}

TEST(KvBlockStorageTest, CopyBlockCopiesKeysAndValuesOfEveryLayerOnly) {
  const KvBlockLayout layout{4, 3, 5};
  auto storage = KvBlockStorage::Create(layout, 4);
  ASSERT_TRUE(storage.ok());
  KvBlockStorage& s = **storage;
  const int64_t per_layer = 4 * 5;
  for (BlockId b = 0; b < 4; ++b) {
    for (int64_t l = 0; l < 3; ++l) {
      for (int64_t i = 0; i < per_layer; ++i) {
        s.keys(b, l)[i] = static_cast<float>(b * 1000 + l * 100 + i);
        s.values(b, l)[i] = -static_cast<float>(b * 1000 + l * 100 + i);
      }
    }
  }
  s.CopyBlock(1, 2);
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t i = 0; i < per_layer; ++i) {
      EXPECT_EQ(s.keys(2, l)[i], 1000 + l * 100 + i);
      EXPECT_EQ(s.values(2, l)[i], -(1000 + l * 100 + i));
      EXPECT_EQ(s.keys(3, l)[i], 3000 + l * 100 + i);  // neighbours untouched
      EXPECT_EQ(s.keys(1, l)[i], 1000 + l * 100 + i);
    }
  }
}

TEST(KvBlockStorageTest, CreateRejectsEmptyAndImpossibleSizes) {
  auto empty = KvBlockStorage::Create(KvBlockLayout{4, 3, 5}, 0);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  // 2^40 blocks of 2^20 floats: no machine has that; the message gives the size.
  auto huge = KvBlockStorage::Create(KvBlockLayout{16, 1 << 10, 64}, int64_t{1} << 40);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("GiB"), std::string::npos) << huge.status().message();
  // 4 PiB fits in 64 bits but not in any address space: std::bad_alloc becomes a Status.
  auto too_big = KvBlockStorage::Create(KvBlockLayout{16, 64, 1024}, int64_t{1} << 30);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("GiB"), std::string::npos);
}

// -ctk / -ctv q8_0 | q4_0: a row is kv_dim / 32 blocks (34 or 18 bytes each), rows of a block
// sit at that stride, and a kv_dim the blocks do not divide is refused.
TEST(KvBlockLayoutTest, QuantizedCacheTypesAreSizedByRowBytes) {
  EXPECT_EQ(ParseKvCacheType("q8_0").value(), DType::kQ8_0);
  EXPECT_EQ(ParseKvCacheType("q4_0").value(), DType::kQ4_0);
  EXPECT_FALSE(ParseKvCacheType("q4_1").ok());
  const KvBlockLayout layout{16, 3, 64, 0, DType::kQ8_0, DType::kQ4_0};
  EXPECT_EQ(layout.k_row_bytes(), 2 * 34);
  EXPECT_EQ(layout.v_row_bytes(), 2 * 18);
  EXPECT_EQ(layout.block_bytes(), 3 * 16 * (68 + 36));
  KvManagerOptions o;
  o.layout = layout;
  o.budget_bytes = 4 * layout.block_bytes();
  auto manager = std::move(KvManager::Create(o).value());
  auto storage = std::move(KvBlockStorage::Create(layout, manager->num_blocks()).value());
  const std::vector<int32_t> tokens(20, 5);
  const KvSeqStep step{0, tokens};
  manager->Commit(manager->Plan(std::span(&step, 1)));
  PagedKvCache cache(*manager, *storage);
  const KvCache::Rows rows = cache.RowsAt(0, 2, 3);
  const BlockId block = manager->block_table(0)[0];
  EXPECT_EQ(rows.type, DType::kQ8_0);
  EXPECT_EQ(rows.k_q, storage->key_bytes(block, 2) + 3 * 68);
  EXPECT_EQ(rows.v_q, storage->value_bytes(block, 2) + 3 * 36);
  EXPECT_EQ(rows.k, nullptr);
  EXPECT_EQ(rows.k_half, nullptr);
  EXPECT_EQ(rows.count, 13);
  o.layout.kv_dim = 48;
  EXPECT_EQ(KvManager::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(PagedKvCacheTest, RowsAtFollowsTheBlockTableAcrossBoundaries) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 3));  // takes block 0 so that seq 1 does not start at block 0
  Step(*m, 1, Range(50, 10));
  auto storage = KvBlockStorage::Create(m->options().layout, m->num_blocks());
  ASSERT_TRUE(storage.ok());
  PagedKvCache cache(*m, **storage);
  EXPECT_EQ(cache.kv_dim(), 4);
  EXPECT_EQ(cache.num_layers(), 2);
  const std::vector<BlockId>& table = m->block_table(1);
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t pos = 0; pos < 10; ++pos) {
      const KvCache::Rows rows = cache.RowsAt(1, layer, pos);
      const BlockId block = table[pos / 4];
      EXPECT_EQ(rows.k, (*storage)->keys(block, layer) + (pos % 4) * 4);
      EXPECT_EQ(rows.v, (*storage)->values(block, layer) + (pos % 4) * 4);
      EXPECT_EQ(rows.count, 4 - pos % 4);
      EXPECT_EQ(rows.stride, 4);
      rows.k[0] = static_cast<float>(pos + 100 * layer);
    }
  }
  // Reading whole runs gives back every position in order.
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t pos = 0; pos < 10;) {
      const KvCache::Rows rows = cache.RowsAt(1, layer, pos);
      for (int64_t i = 0; i < rows.count && pos < 10; ++i, ++pos) {
        EXPECT_EQ(rows.k[i * rows.stride], static_cast<float>(pos + 100 * layer));
      }
    }
  }
  EXPECT_DEATH(cache.RowsAt(1, 0, 10), "");
}

}  // namespace
}  // namespace kvl
