// Paging a running sequence in the KvManager (Detach, Reattach), raw blocks lent out of the pool,
// and the compressed-page slabs built on them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "kvl/compressed_slabs.h"
#include "kv_test_util.h"
#include "kvl/kv_manager.h"

namespace kvl {
namespace {

using testing_kv::Make;
using testing_kv::Options;
using testing_kv::Range;
using testing_kv::Step;

void ExpectInvariants(const KvManager& m) {
  const Status status = m.CheckInvariants();
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(KvPagingTest, DetachFreesTheBlockAndLeavesAHole) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 14));  // blocks 0..3, the last partial
  EXPECT_EQ(m->stats().blocks_free, 4);
  const BlockId block1 = m->block_table(0)[1];
  EXPECT_FALSE(m->IsPaged(0));
  m->Detach(0, 1);
  ExpectInvariants(*m);
  EXPECT_TRUE(m->IsPaged(0));
  EXPECT_EQ(m->block_table(0)[1], kNoBlock);
  EXPECT_EQ(m->refcount(block1), 0);
  EXPECT_EQ(m->stats().blocks_free, 5);
  EXPECT_EQ(m->num_tokens(0), 14);  // the tokens stay: only the page left
  // The sequence goes on appending; its block count follows its tokens, the hole included.
  Step(*m, 0, Range(100, 6));
  EXPECT_EQ(m->block_table(0).size(), 5u);
  ExpectInvariants(*m);
  m->Free(0);
  ExpectInvariants(*m);
  EXPECT_EQ(m->stats().blocks_free, 8);
  EXPECT_EQ(m->stats().blocks_used_peak, 4);  // the detached block made room for the 5th
}

TEST(KvPagingTest, DetachedPrefixStaysFindableButPagedBlocksGetNoIdentity) {
  auto m = Make(Options(4, 16));
  Step(*m, 0, Range(0, 9));  // 2 full blocks, indexed
  m->Detach(0, 0);           // the block stays cached for others
  EXPECT_EQ(m->MatchPrefix(Range(0, 9)), 8);
  Step(*m, 0, Range(9, 8));  // fills block 2 and 3 after paging: not indexed
  ExpectInvariants(*m);
  const std::vector<int32_t> tokens = m->tokens(0);
  EXPECT_EQ(m->MatchPrefix(std::vector<int32_t>(tokens.begin(), tokens.end())), 8);
}

TEST(KvPagingTest, OnlyFullNonLastResidentBlocksDetach) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 8));
  EXPECT_DEATH(m->Detach(0, 1), "only a full block other than the last");
  m->Detach(0, 0);
  EXPECT_DEATH(m->Detach(0, 0), "already detached");
  EXPECT_DEATH(m->Fork(0, 1), "Fork of a paged sequence");
}

TEST(KvPagingTest, RawBlocksAreUsedButBelongToNoSequence) {
  auto m = Make(Options(4, 3));
  const BlockId a = m->AcquireRawBlock();
  const BlockId b = m->AcquireRawBlock();
  ASSERT_NE(a, kNoBlock);
  ASSERT_NE(b, kNoBlock);
  EXPECT_EQ(m->stats().blocks_raw, 2);
  EXPECT_EQ(m->stats().blocks_used, 2);
  ExpectInvariants(*m);
  // A plan sees only what is left.
  EXPECT_FALSE(testing_kv::PlanOne(*m, 0, Range(0, 5)).fits);
  Step(*m, 0, Range(0, 4));
  EXPECT_EQ(m->AcquireRawBlock(), kNoBlock);
  m->ReleaseRawBlock(a);
  ExpectInvariants(*m);
  EXPECT_EQ(m->stats().blocks_raw, 1);
  EXPECT_EQ(m->stats().blocks_free, 1);
}

TEST(KvPagingTest, RawBlockTakesACachedPrefixAndEvictsIt) {
  auto m = Make(Options(4, 2));
  Step(*m, 0, Range(0, 5));
  m->Free(0);
  EXPECT_EQ(m->MatchPrefix(Range(0, 5)), 4);
  ASSERT_NE(m->AcquireRawBlock(), kNoBlock);
  ASSERT_NE(m->AcquireRawBlock(), kNoBlock);
  EXPECT_EQ(m->MatchPrefix(Range(0, 5)), 0);  // the cached block became slab memory
  ExpectInvariants(*m);
}

TEST(KvPagingTest, ReattachFillsTheHoleAndRestoreIdentityMakesThePageFindableAgain) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 14));  // blocks 0..3, the last partial
  const KvContentId content = m->ContentOf(0, 1);
  ASSERT_TRUE(content.valid());
  m->Detach(0, 1, /*lossless=*/true);
  // Another sequence takes every free block, the detached page's cached one included, and goes.
  Step(*m, 1, Range(1000, 20));
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 4);  // block 1's instance is gone
  EXPECT_EQ(m->FindContent(content), kNoBlock);
  m->Free(1);
  const int64_t free_before = m->stats().blocks_free;
  const uint64_t version = m->state_version();
  const BlockId next = m->next_free_block();
  const BlockId block = m->Reattach(0, 1);
  ASSERT_NE(block, kNoBlock);
  EXPECT_EQ(block, next);
  EXPECT_EQ(m->block_table(0)[1], block);
  EXPECT_EQ(m->refcount(block), 1);
  EXPECT_EQ(m->stats().blocks_free, free_before - 1);
  EXPECT_GT(m->state_version(), version);
  ExpectInvariants(*m);
  // No identity until the bytes are there.
  EXPECT_EQ(m->FindContent(content), kNoBlock);
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 4);
  m->RestoreIdentity(0, 1);
  ExpectInvariants(*m);
  EXPECT_EQ(m->FindContent(content), block);
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 8);
  EXPECT_TRUE(m->IsPaged(0));  // blocks filled while it was out keep no identity
  // It can leave again, and the sequence goes on.
  m->Detach(0, 1, /*lossless=*/true);
  Step(*m, 0, Range(14, 6));
  ExpectInvariants(*m);
  m->Free(0);
  ExpectInvariants(*m);
  EXPECT_EQ(m->stats().blocks_free, 8);
}

TEST(KvPagingTest, AReattachGivenBackBeforeItsBytesCameLeavesNothingFindable) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 14));
  const KvContentId content = m->ContentOf(0, 1);
  m->Detach(0, 1, /*lossless=*/true);
  Step(*m, 1, Range(1000, 20));  // evicts the detached page's cached block
  m->Free(1);
  const BlockId block = m->Reattach(0, 1);
  ASSERT_NE(block, kNoBlock);
  const int64_t cached = m->stats().blocks_cached;
  // A read that failed: the block goes back with no identity, first in line for reuse.
  m->Detach(0, 1, /*lossless=*/true);
  ExpectInvariants(*m);
  EXPECT_EQ(m->block_table(0)[1], kNoBlock);
  EXPECT_EQ(m->FindContent(content), kNoBlock);
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 4);
  EXPECT_EQ(m->stats().blocks_cached, cached);
  EXPECT_EQ(m->next_free_block(), block);
}

TEST(KvPagingTest, ReattachWithNoFreeBlockChangesNothing) {
  auto m = Make(Options(4, 4));
  Step(*m, 0, Range(0, 14));  // 4 blocks: the whole pool
  m->Detach(0, 1, /*lossless=*/true);
  Step(*m, 1, Range(1000, 3));  // takes the freed block
  EXPECT_EQ(m->next_free_block(), kNoBlock);
  const uint64_t version = m->state_version();
  EXPECT_EQ(m->Reattach(0, 1), kNoBlock);
  EXPECT_EQ(m->state_version(), version);
  EXPECT_EQ(m->block_table(0)[1], kNoBlock);
  ExpectInvariants(*m);
  EXPECT_DEATH(m->Reattach(0, 0), "block is not detached");
  EXPECT_DEATH(m->Reattach(0, 3), "only a full block other than the last");
}

// Random detach / reattach / append / raw-block traffic keeps every invariant.
TEST(KvPagingTest, RandomPagingKeepsInvariants) {
  auto m = Make(Options(4, 24));
  std::mt19937 rng(7);
  std::vector<BlockId> raw;
  std::vector<int32_t> next(4, 0);
  int64_t reattached = 0;
  for (int op = 0; op < 2000; ++op) {
    const SeqId seq = static_cast<SeqId>(rng() % 4);
    switch (rng() % 5) {
      case 0:
      case 1: {
        const int32_t n = 1 + static_cast<int32_t>(rng() % 6);
        const std::vector<int32_t> tokens = Range(next[static_cast<size_t>(seq)] + seq * 100000, n);
        const KvSeqStep step{seq, tokens};
        const KvPlan plan = m->Plan(std::span(&step, 1));
        if (plan.fits) {
          m->Commit(plan);
          next[static_cast<size_t>(seq)] += n;
        }
        break;
      }
      case 2:
        if (m->Contains(seq)) {
          const auto& table = m->block_table(seq);
          const int64_t b = static_cast<int64_t>(rng() % table.size());
          if (b + 1 < static_cast<int64_t>(table.size()) && table[static_cast<size_t>(b)] != kNoBlock) {
            m->Detach(seq, b);
          }
        }
        break;
      case 3:
        if (rng() % 3 == 0 && m->Contains(seq)) {
          // A page brought back: its identity restored, or (a failed read) given back at once.
          const auto& table = m->block_table(seq);
          const auto hole = std::find(table.begin(), table.end(), kNoBlock);
          if (hole == table.end()) break;
          const int64_t b = hole - table.begin();
          if (m->Reattach(seq, b) == kNoBlock) break;
          ++reattached;
          if (rng() % 4 == 0) {
            m->Detach(seq, b, /*lossless=*/true);
          } else {
            m->RestoreIdentity(seq, b);
          }
        } else if (rng() % 2 == 0) {
          const BlockId b = m->AcquireRawBlock();
          if (b != kNoBlock) raw.push_back(b);
        } else if (!raw.empty()) {
          m->ReleaseRawBlock(raw.back());
          raw.pop_back();
        }
        break;
      case 4:
        if (m->Contains(seq) && rng() % 4 == 0) {
          m->Free(seq);
          next[static_cast<size_t>(seq)] = 0;
        }
        break;
    }
    const Status status = m->CheckInvariants();
    ASSERT_TRUE(status.ok()) << "op " << op << ": " << status.ToString();
  }
  EXPECT_GT(reattached, 20);  // the case it exists for really happened
}

TEST(CompressedSlabsTest, SlotsPackIntoPoolBlocksAndSlabsGoBackWhenEmpty) {
  KvManagerOptions o = Options(16, 6);
  o.layout = KvBlockLayout{16, 2, 64};
  o.budget_bytes = 6 * o.layout.block_bytes();
  auto m = Make(o);
  auto storage = std::move(KvBlockStorage::Create(o.layout, m->num_blocks()).value());
  CompressedSlabs slabs(*m, *storage);
  // f32 block: 2 x 2 x 16 x 64 x 4 = 16 KiB; an int8 layer of 16 x 64 is ~2.5 KiB.
  const int64_t slot8 = slabs.slot_bytes(KvCodecType::kInt8);
  EXPECT_EQ(slot8 % 64, 0);
  EXPECT_EQ(slabs.slots_per_slab(KvCodecType::kInt8), o.layout.block_bytes() / slot8);
  EXPECT_GT(slabs.slots_per_slab(KvCodecType::kInt4), slabs.slots_per_slab(KvCodecType::kInt8));

  std::vector<SlabSlot> a, b;
  ASSERT_TRUE(slabs.Allocate(KvCodecType::kInt8, 2, &a));
  EXPECT_EQ(slabs.num_slabs(), 1);
  EXPECT_EQ(m->stats().blocks_raw, 1);
  const int64_t per_slab = slabs.slots_per_slab(KvCodecType::kInt8);
  ASSERT_TRUE(slabs.Allocate(KvCodecType::kInt8, per_slab, &b));
  EXPECT_EQ(slabs.num_slabs(), 2);
  // Every slot is distinct, 64-byte aligned and inside its slab.
  std::vector<uint8_t*> seen;
  for (const auto* list : {&a, &b}) {
    for (const SlabSlot& s : *list) {
      uint8_t* p = slabs.SlotData(KvCodecType::kInt8, s);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
      EXPECT_LE(p + slot8, storage->bytes(s.slab) + o.layout.block_bytes());
      for (uint8_t* q : seen) EXPECT_NE(p, q);
      seen.push_back(p);
      std::memset(p, 0xAB, static_cast<size_t>(slot8));  // writable, no overlap (ASan)
    }
  }
  EXPECT_EQ(slabs.bytes_used(), static_cast<int64_t>(seen.size()) * slot8);
  slabs.Free(KvCodecType::kInt8, b);
  slabs.Free(KvCodecType::kInt8, a);
  EXPECT_EQ(slabs.num_slabs(), 0);
  EXPECT_EQ(m->stats().blocks_raw, 0);
  EXPECT_EQ(m->stats().blocks_free, 6);
  ExpectInvariants(*m);
}

TEST(CompressedSlabsTest, AllocationThatCannotGetASlabTakesNothing) {
  KvManagerOptions o = Options(16, 1);
  o.layout = KvBlockLayout{16, 2, 64};
  o.budget_bytes = o.layout.block_bytes();
  auto m = Make(o);
  auto storage = std::move(KvBlockStorage::Create(o.layout, m->num_blocks()).value());
  CompressedSlabs slabs(*m, *storage);
  std::vector<SlabSlot> slots;
  const int64_t per_slab = slabs.slots_per_slab(KvCodecType::kInt4);
  EXPECT_FALSE(slabs.Allocate(KvCodecType::kInt4, per_slab + 1, &slots));
  EXPECT_TRUE(slots.empty());
  EXPECT_EQ(m->stats().blocks_raw, 0);
  EXPECT_TRUE(slabs.Allocate(KvCodecType::kInt4, per_slab, &slots));
}

}  // namespace
}  // namespace kvl
