// The KV store: content ids given by the manager, pages filed under them in the tiers, lookups
// that verify what they find, cached pages evicted coldest first and pinned ones never.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "kv_test_util.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"

namespace kvl {
namespace {

using testing_kv::Make;
using testing_kv::Options;
using testing_kv::Range;
using testing_kv::Step;

constexpr int32_t kBlock = 4;
const KvBlockLayout kLayout{kBlock, /*num_layers=*/3, /*kv_dim=*/8};
const int64_t kLayerBytes = kLayout.layer_k_bytes() + kLayout.layer_v_bytes();

// A page's layer l: bytes that differ per page and per layer.
std::vector<uint8_t> PageLayer(int seed, int64_t layer) {
  std::vector<uint8_t> bytes(static_cast<size_t>(kLayerBytes));
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<uint8_t>(seed * 31 + layer * 7 + static_cast<int64_t>(i));
  }
  return bytes;
}

Status SavePage(KvStore& store, KvTier* tier, KvContentId id, std::span<const int32_t> tokens,
                int seed, bool pinned = false) {
  std::vector<std::vector<uint8_t>> layers;
  for (int64_t l = 0; l < kLayout.num_layers; ++l) layers.push_back(PageLayer(seed, l));
  return store.Save(
      tier, id, tokens,
      [&](int64_t l) -> std::span<const uint8_t> { return layers[static_cast<size_t>(l)]; },
      pinned);
}

std::vector<KvContentId> Chain(std::span<const int32_t> tokens, int64_t blocks) {
  std::vector<KvContentId> ids;
  KvContentId parent;
  for (int64_t b = 0; b < blocks; ++b) {
    parent = ChainContentId(parent, tokens.subspan(static_cast<size_t>(b * kBlock), kBlock), 7);
    ids.push_back(parent);
  }
  return ids;
}

TEST(KvContentIdTest, TheManagerGivesEveryFullBlockItsChainId) {
  auto m = Make(Options(4, 16));
  const std::vector<int32_t> tokens = Range(10, 14);  // 3 full blocks and a partial one
  Step(*m, 0, tokens);
  std::vector<KvContentId> chain;
  m->ContentChain(tokens, 3, &chain);
  ASSERT_EQ(chain.size(), 3u);
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(chain[static_cast<size_t>(b)].valid());
    EXPECT_EQ(m->ContentOf(0, b), chain[static_cast<size_t>(b)]);
  }
  EXPECT_FALSE(m->ContentOf(0, 3).valid());  // the partial block has none
  // The id names the whole prefix, not the block's tokens alone.
  const std::vector<int32_t> other = testing_kv::Concat(Range(99, 4), Range(14, 4));
  std::vector<KvContentId> other_chain;
  m->ContentChain(other, 2, &other_chain);
  EXPECT_NE(other_chain[1], chain[1]);
  // Freed, the blocks keep their ids for the store until they are reused.
  const BlockId first = m->block_table(0)[0];
  m->Free(0);
  EXPECT_EQ(m->FreeBlockContent(first), chain[0]);
  const std::span<const int32_t> held = m->BlockTokens(first);
  EXPECT_TRUE(std::equal(held.begin(), held.end(), tokens.begin()));
}

TEST(KvContentIdTest, LosslessDetachKeepsIdentityLossyDetachEndsIt) {
  auto m = Make(Options(4, 32));
  Step(*m, 0, Range(0, 9));
  m->Detach(0, 0, /*lossless=*/true);
  Step(*m, 0, Range(9, 8));  // fills blocks 2 and 3 while block 0 is in a tier
  EXPECT_TRUE(m->ContentOf(0, 2).valid());
  EXPECT_TRUE(m->ContentOf(0, 3).valid());
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  // The detached block stays cached in the pool until reused, and the blocks filled after it
  // were indexed (their parent is in the pool): the whole prefix is found.
  EXPECT_EQ(m->MatchPrefix(Range(0, 17)), 16);

  Step(*m, 1, Range(100, 9));
  m->Detach(1, 0, /*lossless=*/false);
  Step(*m, 1, Range(109, 8));
  EXPECT_TRUE(m->ContentOf(1, 1).valid());   // filled before the lossy detach
  EXPECT_FALSE(m->ContentOf(1, 2).valid());  // computed against a lossy context
  EXPECT_FALSE(m->ContentOf(1, 3).valid());
  EXPECT_TRUE(m->CheckInvariants().ok());
}

class KvStoreTest : public ::testing::Test {
 protected:
  KvStoreTest()
      : ram_(MakeRamTier({.capacity_bytes = 64 * kLayerBytes})),
        ram2_(MakeRamTier({.capacity_bytes = 64 * kLayerBytes})),
        store_(kLayout, kLayerBytes, {{ram_.get(), false, 0.1}, {ram2_.get(), true, 1.0}}) {}

  std::unique_ptr<KvTier> ram_;
  std::unique_ptr<KvTier> ram2_;
  KvStore store_;
};

TEST_F(KvStoreTest, LookupWalksTheChainAcrossTiersAndStopsAtTheFirstMiss) {
  const std::vector<int32_t> tokens = Range(0, 5 * kBlock);
  const std::vector<KvContentId> ids = Chain(tokens, 5);
  auto tok = [&](int b) { return std::span(tokens).subspan(static_cast<size_t>(b * kBlock), kBlock); };
  ASSERT_TRUE(SavePage(store_, ram_.get(), ids[0], tok(0), 0).ok());
  ASSERT_TRUE(SavePage(store_, ram2_.get(), ids[1], tok(1), 1).ok());  // only the slower tier
  ASSERT_TRUE(SavePage(store_, ram_.get(), ids[2], tok(2), 2).ok());
  ASSERT_TRUE(SavePage(store_, ram_.get(), ids[4], tok(4), 4).ok());  // after a gap: unusable
  std::vector<KvTier*> where;
  EXPECT_EQ(store_.Lookup(ids, tokens, &where), 3);
  ASSERT_EQ(where.size(), 3u);
  EXPECT_EQ(where[0], ram_.get());
  EXPECT_EQ(where[1], ram2_.get());
  EXPECT_EQ(where[2], ram_.get());
  EXPECT_EQ(store_.stats(0).hit_blocks, 2);
  EXPECT_EQ(store_.stats(1).hit_blocks, 1);

  // Load gives back exactly the bytes saved.
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(static_cast<size_t>(kLayerBytes)));
  ASSERT_TRUE(store_.Load(ram2_.get(), ids[1], [&](int64_t l) -> std::span<uint8_t> {
    return out[static_cast<size_t>(l)];
  }).ok());
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(out[static_cast<size_t>(l)], PageLayer(1, l));
}

TEST_F(KvStoreTest, AnIdentityThatDoesNotMatchIsAMiss) {
  const std::vector<int32_t> tokens = Range(0, 2 * kBlock);
  const std::vector<KvContentId> ids = Chain(tokens, 2);
  // Filed under block 0's id but with other tokens (what a 64-bit key collision would look
  // like): the identity page does not match, and the lookup finds nothing.
  const std::vector<int32_t> wrong = Range(500, kBlock);
  ASSERT_TRUE(SavePage(store_, ram_.get(), ids[0], wrong, 0).ok());
  std::vector<KvTier*> where;
  EXPECT_EQ(store_.Lookup(ids, tokens, &where), 0);
  EXPECT_EQ(store_.stats(0).identity_mismatches, 1);
  // A damaged identity page is a miss too.
  ram_->Erase(std::vector<PageKey>{KvStore::IdentityKey(ids[0])});
  std::vector<uint8_t> junk(static_cast<size_t>(kLayerBytes), 0xab);
  ASSERT_TRUE(ram_->Put(std::vector<PageWrite>{{KvStore::IdentityKey(ids[0]), junk}}).ok());
  EXPECT_EQ(store_.Lookup(ids, tokens, &where), 0);
  EXPECT_EQ(store_.stats(0).identity_mismatches, 2);
}

TEST(KvStoreEvictionTest, CachedPagesGoColdestFirstPinnedOnesNever) {
  // Room for 3 pages of 4 tier pages each (3 layers and the identity).
  auto ram = MakeRamTier({.capacity_bytes = 12 * kLayerBytes});
  KvStore store(kLayout, kLayerBytes, {{ram.get(), false, 0.1}});
  const std::vector<int32_t> tokens = Range(0, 6 * kBlock);
  const std::vector<KvContentId> ids = Chain(tokens, 6);
  auto tok = [&](int b) { return std::span(tokens).subspan(static_cast<size_t>(b * kBlock), kBlock); };
  ASSERT_TRUE(SavePage(store, ram.get(), ids[0], tok(0), 0, /*pinned=*/true).ok());
  ASSERT_TRUE(SavePage(store, ram.get(), ids[1], tok(1), 1).ok());
  ASSERT_TRUE(SavePage(store, ram.get(), ids[2], tok(2), 2).ok());
  // A fourth page evicts the coldest cached one (1), never the pinned one (0).
  ASSERT_TRUE(SavePage(store, ram.get(), ids[3], tok(3), 3).ok());
  EXPECT_TRUE(ram->Contains(KvStore::IdentityKey(ids[0])));
  EXPECT_FALSE(ram->Contains(KvStore::IdentityKey(ids[1])));
  EXPECT_TRUE(ram->Contains(KvStore::IdentityKey(ids[2])));
  EXPECT_EQ(ram->stats().evictions, 4);  // one page: its 3 layers and its identity
  // Pinned twice (a second sequence), unpinned once: still pinned.
  ASSERT_TRUE(SavePage(store, ram.get(), ids[0], tok(0), 0, /*pinned=*/true).ok());
  store.Unpin(ram.get(), ids[0]);
  ASSERT_TRUE(SavePage(store, ram.get(), ids[4], tok(4), 4).ok());
  EXPECT_TRUE(ram->Contains(KvStore::IdentityKey(ids[0])));
  store.Unpin(ram.get(), ids[0]);
  // Unpinned, it joins the eviction order at the hot end: two pages later it is the coldest.
  ASSERT_TRUE(SavePage(store, ram.get(), ids[5], tok(5), 5).ok());  // evicts 3
  EXPECT_TRUE(ram->Contains(KvStore::IdentityKey(ids[0])));
  ASSERT_TRUE(SavePage(store, ram.get(), ids[1], tok(1), 1).ok());  // evicts 4
  ASSERT_TRUE(SavePage(store, ram.get(), ids[2], tok(2), 2).ok());  // evicts 0
  EXPECT_FALSE(ram->Contains(KvStore::IdentityKey(ids[0])));
  EXPECT_TRUE(ram->Contains(KvStore::IdentityKey(ids[5])));
  // Only pinned pages left and no room: the Put is refused, nothing is evicted.
  auto full = MakeRamTier({.capacity_bytes = 4 * kLayerBytes});
  KvStore pinned_store(kLayout, kLayerBytes, {{full.get(), false, 0.1}});
  ASSERT_TRUE(SavePage(pinned_store, full.get(), ids[0], tok(0), 0, true).ok());
  EXPECT_EQ(SavePage(pinned_store, full.get(), ids[1], tok(1), 1).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(pinned_store.stats(0).errors, 1);
}

// The tier evicts key by key and a lookup reads (and so warms) only the identity: under pressure
// a page loses its layers and keeps its identity. Found by its identity alone, such a page sent a
// sequence to read it in place, fail, be recomputed, and find it again, forever (the livelock of
// `kvl serve -np 1 --kv-budget 2MiB --kv-tier ram:8MiB`). A page is found only whole, and a
// partial one is written afresh.
TEST(KvStoreEvictionTest, APageMissingALayerIsNotFoundAndIsWrittenAfresh) {
  // Room for 2 pages of 4 tier pages each (3 layers and the identity).
  auto ram = MakeRamTier({.capacity_bytes = 8 * kLayerBytes});
  KvStore store(kLayout, kLayerBytes, {{ram.get(), false, 0.1}});
  const std::vector<int32_t> tokens = Range(0, 3 * kBlock);
  const std::vector<KvContentId> ids = Chain(tokens, 3);
  auto tok = [&](int b) { return std::span(tokens).subspan(static_cast<size_t>(b * kBlock), kBlock); };
  ASSERT_TRUE(SavePage(store, ram.get(), ids[0], tok(0), 0).ok());
  ASSERT_TRUE(SavePage(store, ram.get(), ids[1], tok(1), 1).ok());
  // Page 0 looked up: its identity moves to the hot end, its layers stay the coldest keys.
  std::vector<KvTier*> where;
  ASSERT_EQ(store.Lookup(std::span(ids).first(1), tok(0), &where), 1);
  // Other keys need room, a layer at a time, until page 0's layer 0 (the coldest key) goes.
  for (PageKey key = 12345; ram->Contains(KvStore::LayerKey(ids[0], 0)); ++key) {
    ASSERT_LT(key, 12345u + 8);
    ASSERT_TRUE(ram->Put(std::vector<PageWrite>{{key, PageLayer(9, 0)}}).ok());
  }
  ASSERT_TRUE(ram->Contains(KvStore::IdentityKey(ids[0])));
  EXPECT_EQ(store.HoldsWhole(ram.get(), ids), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(store.Lookup(std::span(ids).first(1), tok(0), &where), 0);
  // Saved again, it is written whole (not taken as stored because its identity is there).
  ASSERT_TRUE(SavePage(store, ram.get(), ids[0], tok(0), 0).ok());
  EXPECT_TRUE(ram->Contains(KvStore::LayerKey(ids[0], 0)));
  EXPECT_EQ(store.Lookup(std::span(ids).first(1), tok(0), &where), 1);
  std::vector<std::vector<uint8_t>> read(static_cast<size_t>(kLayout.num_layers),
                                         std::vector<uint8_t>(static_cast<size_t>(kLayerBytes)));
  ASSERT_TRUE(store
                  .Load(ram.get(), ids[0],
                        [&](int64_t l) -> std::span<uint8_t> { return read[static_cast<size_t>(l)]; })
                  .ok());
  EXPECT_EQ(read[0], PageLayer(0, 0));
}

TEST(RamTierInPlaceTest, PeekHandsOutTheStoredBytesOnlyWhenUncompressed) {
  auto ram = MakeRamTier({.capacity_bytes = 1 << 20});
  auto zstd = MakeRamTier({.capacity_bytes = 1 << 20, .compress = true});
  EXPECT_TRUE(ram->reads_in_place());
  EXPECT_FALSE(zstd->reads_in_place());
  std::vector<uint8_t> page(256, 0);  // compressible
  page[3] = 9;
  for (KvTier* t : {ram.get(), zstd.get()}) {
    ASSERT_TRUE(t->Put(std::vector<PageWrite>{{42, page}}).ok());
  }
  const uint8_t* rows = ram->PeekPage(42, 256);
  ASSERT_NE(rows, nullptr);
  EXPECT_EQ(std::memcmp(rows, page.data(), page.size()), 0);
  EXPECT_EQ(ram->PeekPage(42, 128), nullptr);  // another size is not that page
  EXPECT_EQ(ram->PeekPage(43, 256), nullptr);
  EXPECT_EQ(zstd->PeekPage(42, 256), nullptr);
}

}  // namespace
}  // namespace kvl
