// The pager's parts on their own, on a model-free pool: the page table's counts of held pages
// follow each change of fate (and skip pages awaiting restore); the tier mover writes a page
// leaving the pool into a tier and reads it back bit-identically, refuses a full tier without
// touching the page, and writes only the checkpoint layers of a checkpointed page; the layer
// streamer stages a step's pages and hands attention their rows, and a read that fails makes the
// page read as dropped for that step only (the step's scratch is the streamer's, not the page's).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "kv/lattice/kv_layer_streamer.h"
#include "kv/lattice/kv_tier_mover.h"
#include "kvl/kv_page_table.h"
#include "kvl/kv_tier.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

constexpr int32_t kBlock = 4;

// A pool of `num_blocks` blocks with sequence 0 admitted at `tokens` tokens, its blocks filled
// with distinct bytes, and the pager's parts over it.
class PartsHarness {
 public:
  explicit PartsHarness(KvBlockLayout layout, int32_t tokens = 2 * kBlock + 1,
                        int64_t num_blocks = 8) {
    KvManagerOptions o;
    o.layout = layout;
    o.budget_bytes = num_blocks * layout.block_bytes();
    o.max_seqs = 2;
    manager_ = std::move(KvManager::Create(o).value());
    storage_ = std::move(KvBlockStorage::Create(layout, manager_->num_blocks()).value());
    tokens_.resize(static_cast<size_t>(tokens));
    std::iota(tokens_.begin(), tokens_.end(), 100);
    const KvSeqStep step{0, tokens_};
    const KvPlan plan = manager_->Plan(std::span(&step, 1));
    EXPECT_TRUE(plan.fits);
    manager_->Commit(plan);
    for (BlockId b = 0; b < manager_->num_blocks(); ++b) {
      uint8_t* bytes = storage_->bytes(b);
      for (int64_t i = 0; i < layout.block_bytes(); ++i) {
        bytes[i] = static_cast<uint8_t>(7 * b + 13 * i + 1);
      }
    }
    table_ = std::make_unique<KvPageTable>(*manager_, o.max_seqs);
    table_->Bind(0, &pages_);
    mover_ = std::make_unique<KvTierMover>(*manager_, *storage_);
    streamer_ = std::make_unique<KvLayerStreamer>(*manager_, *storage_, *table_, *mover_);
  }

  BlockId block(int64_t index) const { return manager_->block_table(0)[static_cast<size_t>(index)]; }
  std::vector<uint8_t> KvBytes(BlockId b) {
    const KvBlockLayout& l = storage_->layout();
    return {storage_->bytes(b), storage_->bytes(b) + l.kv_bytes()};
  }
  // Page `index` of sequence 0 leaves the pool into `tier`, as the pager demotes one.
  void Demote(int64_t index, KvTier* tier) {
    KvPage& page = table_->At(0, index);
    ASSERT_TRUE(mover_->KeepInTier(0, index, block(index), tier, /*residual=*/false, &page));
    manager_->Detach(0, index, /*lossless=*/true);
    page.fate = KvPageFate::kInTier;
    table_->Hold(page);
  }

  KvManager& manager() { return *manager_; }
  KvBlockStorage& storage() { return *storage_; }
  KvPageTable& table() { return *table_; }
  KvTierMover& mover() { return *mover_; }
  KvLayerStreamer& streamer() { return *streamer_; }

 private:
  std::vector<int32_t> tokens_;
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  KvSequencePages pages_;
  std::unique_ptr<KvPageTable> table_;
  std::unique_ptr<KvTierMover> mover_;
  std::unique_ptr<KvLayerStreamer> streamer_;
};

KvBlockLayout SmallLayout() { return KvBlockLayout{kBlock, /*num_layers=*/2, /*kv_dim=*/4}; }

TEST(KvPageTableTest, HeldCountsFollowFatesAndSkipPagesAwaitingRestore) {
  PartsHarness h(SmallLayout());
  KvPageTable& t = h.table();
  EXPECT_EQ(t.FateOf(0, 5), KvPageFate::kResident);  // past the record: in the pool
  KvPage& streamed = t.At(0, 1);
  EXPECT_EQ(t.Bound(0).pages.size(), 2u);
  streamed.fate = KvPageFate::kInTier;
  streamed.in_place = true;
  t.Hold(streamed);
  KvPage& compressed = t.At(0, 0);
  compressed.fate = KvPageFate::kCompressed;
  t.Hold(compressed);
  KvPage waiting;
  waiting.fate = KvPageFate::kCheckpointed;
  waiting.awaiting_restore = true;
  t.Hold(waiting);
  EXPECT_EQ(t.held().streamed, 1);
  EXPECT_EQ(t.held().in_place, 1);
  EXPECT_EQ(t.held().compressed, 1);
  EXPECT_EQ(t.held().rebuilt, 0);  // awaiting restore: not part of the sequence's KV yet
  t.Unhold(streamed);
  EXPECT_EQ(t.held().streamed, 0);
  EXPECT_EQ(t.held().in_place, 0);
  EXPECT_EQ(t.FateOf(0, 0), KvPageFate::kCompressed);

  compressed.checkpoint_missing = true;
  KvPageTable::MakeResident(compressed);
  EXPECT_EQ(compressed.fate, KvPageFate::kResident);
  EXPECT_TRUE(compressed.checkpoint_missing);  // outlives every fate
  EXPECT_TRUE(t.CheckpointMissing(0, 0));
  EXPECT_FALSE(t.CheckpointMissing(0, 1));
}

TEST(KvTierMoverTest, APageKeptInATierComesBackBitIdenticalAndIsErasedWhenLetGo) {
  PartsHarness h(SmallLayout());
  std::unique_ptr<KvTier> ram = MakeRamTier(RamTierOptions{});
  h.mover().set_tiers({ram.get(), nullptr});
  EXPECT_EQ(h.mover().TierFor(KvAction::kDemoteRam), ram.get());
  EXPECT_EQ(h.mover().TierFor(KvAction::kDemoteDisk), nullptr);
  const BlockId block = h.block(0);
  const std::vector<uint8_t> before = h.KvBytes(block);
  KvPage page;
  ASSERT_TRUE(h.mover().KeepInTier(0, 0, block, ram.get(), /*residual=*/false, &page));
  EXPECT_EQ(page.tier, ram.get());
  EXPECT_NE(page.page_id, 0u);
  EXPECT_FALSE(page.content.valid());  // no store: the pager's own page
  EXPECT_TRUE(page.in_place);          // an uncompressed RAM tier is read where it lies
  EXPECT_EQ(ram->stats().pages, 2);    // one tier page per layer
  std::memset(h.storage().bytes(block), 0xAB, static_cast<size_t>(before.size()));
  ASSERT_TRUE(h.mover().ReadIntoBlock(block, page, /*residual=*/false).ok());
  EXPECT_EQ(h.KvBytes(block), before);
  page.fate = KvPageFate::kInTier;
  h.mover().LetGo(page);
  EXPECT_EQ(ram->stats().pages, 0);
}

TEST(KvTierMoverTest, AFullTierRefusesThePageAndLeavesItUntouched) {
  PartsHarness h(SmallLayout());
  std::unique_ptr<KvTier> ram = MakeRamTier(RamTierOptions{.capacity_bytes = 8});
  KvPage page;
  EXPECT_FALSE(h.mover().KeepInTier(0, 0, h.block(0), ram.get(), /*residual=*/false, &page));
  EXPECT_FALSE(h.mover().last_tier_error().ok());
  EXPECT_NE(h.mover().last_tier_error().message().find("ram"), std::string::npos)
      << h.mover().last_tier_error().message();
  EXPECT_EQ(page.tier, nullptr);
  EXPECT_EQ(page.page_id, 0u);
}

TEST(KvTierMoverTest, ACheckpointedPageKeepsOnlyItsCheckpointLayers) {
  KvBlockLayout layout{kBlock, /*num_layers=*/3, /*kv_dim=*/4};
  layout.residual_dim = 8;
  layout.checkpoint_every = 2;  // checkpoints at layers 0 and 2
  PartsHarness h(layout);
  std::unique_ptr<KvTier> ram = MakeRamTier(RamTierOptions{});
  const BlockId block = h.block(1);
  // Compared as bytes: the harness's fill is not meant as floats (some are NaN).
  const size_t checkpoint_bytes = sizeof(float) * kBlock * static_cast<size_t>(layout.residual_dim);
  auto checkpoint_layer = [&](int64_t layer) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(h.storage().residuals(block, layer));
    return std::vector<uint8_t>(bytes, bytes + checkpoint_bytes);
  };
  const std::vector<uint8_t> before = checkpoint_layer(2);
  KvPage page;
  ASSERT_TRUE(h.mover().KeepInTier(0, 1, block, ram.get(), /*residual=*/true, &page));
  EXPECT_FALSE(page.in_place);  // checkpoints are rebuilt from, never read as rows
  EXPECT_EQ(ram->stats().pages, 2);
  std::memset(h.storage().residuals(block, 2), 0xAB, checkpoint_bytes);
  ASSERT_TRUE(h.mover().ReadIntoBlock(block, page, /*residual=*/true).ok());
  EXPECT_EQ(checkpoint_layer(2), before);
  page.fate = KvPageFate::kCheckpointed;
  h.mover().LetGo(page);
  EXPECT_EQ(ram->stats().pages, 0);
}

// Layer `layer`'s K and V rows of a block, as attention reads them.
std::vector<uint8_t> LayerRows(KvBlockStorage& storage, BlockId block, int64_t layer) {
  const KvBlockLayout& l = storage.layout();
  const uint8_t* k = storage.key_bytes(block, layer);
  return {k, k + l.layer_k_bytes() + l.layer_v_bytes()};
}

std::vector<uint8_t> RowsBytes(const KvCache::Rows& rows, const KvBlockLayout& l) {
  const auto* k = reinterpret_cast<const uint8_t*>(rows.k);
  const auto* v = reinterpret_cast<const uint8_t*>(rows.v);
  std::vector<uint8_t> out(k, k + l.layer_k_bytes());
  out.insert(out.end(), v, v + l.layer_v_bytes());
  return out;
}

TEST(KvLayerStreamerTest, AFailedReadDropsThePageForItsStepOnly) {
  PartsHarness h(SmallLayout());
  // zstd: not read in place, so the page is staged and prefetched.
  FailingReadsTier tier(MakeRamTier(RamTierOptions{.compress = true}));
  h.streamer().Reserve(2);
  const std::vector<uint8_t> layer0 = LayerRows(h.storage(), h.block(0), 0);
  const std::vector<uint8_t> layer1 = LayerRows(h.storage(), h.block(0), 1);
  h.Demote(0, &tier);
  const KvPage& page = h.table().Existing(0, 0);
  const KvBlockLayout& l = h.storage().layout();
  const SeqId seq = 0;

  for (int step = 0; step < 3; ++step) {
    tier.fail_reads = step == 1;
    h.streamer().BeginStep(std::span(&seq, 1));
    for (int64_t layer = 0; layer < l.num_layers; ++layer) {
      EXPECT_EQ(h.streamer().BeginLayer(layer).rows, 0);  // nothing to rebuild
      const KvCache::Rows rows = h.streamer().Rows(page, 0, 0, layer, 0);
      if (step == 1) {
        EXPECT_EQ(rows.kind, KvCache::Rows::Kind::kDropped) << layer;
      } else {
        ASSERT_EQ(rows.kind, KvCache::Rows::Kind::kDense) << step;
        EXPECT_EQ(RowsBytes(rows, l), layer == 0 ? layer0 : layer1) << step << " " << layer;
      }
    }
    const std::span<const SeqId> failed = h.streamer().EndStep();
    EXPECT_EQ(std::vector<SeqId>(failed.begin(), failed.end()),
              step == 1 ? std::vector<SeqId>{0} : std::vector<SeqId>{})
        << step;
  }
  EXPECT_EQ(h.streamer().stats().stream_read_failures, 2);  // both layers of step 1
  EXPECT_EQ(h.streamer().stats().layers_streamed, 3 * l.num_layers);
}

TEST(KvLayerStreamerTest, APageReadInPlaceThatItsTierLetGoReadsAsDropped) {
  PartsHarness h(SmallLayout());
  std::unique_ptr<KvTier> ram = MakeRamTier(RamTierOptions{});
  const std::vector<uint8_t> layer1 = LayerRows(h.storage(), h.block(0), 1);
  h.Demote(0, ram.get());
  const KvPage& page = h.table().Existing(0, 0);
  ASSERT_TRUE(page.in_place);
  EXPECT_EQ(h.table().held().in_place, 1);
  const SeqId seq = 0;
  // Read in place needs no staging.
  h.streamer().BeginStep(std::span(&seq, 1));
  h.streamer().BeginLayer(0);
  h.streamer().BeginLayer(1);
  const KvCache::Rows rows = h.streamer().Rows(page, 0, 0, 1, 0);
  ASSERT_EQ(rows.kind, KvCache::Rows::Kind::kDense);
  EXPECT_EQ(RowsBytes(rows, h.storage().layout()), layer1);
  EXPECT_TRUE(h.streamer().EndStep().empty());

  // The tier lets the page go between steps (as it may an evictable store page).
  const PageKey keys[] = {KvTierMover::LayerKeyOf(page, 0), KvTierMover::LayerKeyOf(page, 1)};
  ram->Erase(keys);
  h.streamer().BeginStep(std::span(&seq, 1));
  h.streamer().BeginLayer(0);
  EXPECT_EQ(h.streamer().Rows(page, 0, 0, 0, 0).kind, KvCache::Rows::Kind::kDropped);
  const std::span<const SeqId> failed = h.streamer().EndStep();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0], 0);
}

}  // namespace
}  // namespace kvl
