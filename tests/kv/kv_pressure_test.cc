// The KV pressure planner and the pager that applies its plans, on a model-free pool: which pages
// are candidates and in what order, what the rules allow, what staging allows, that a plan
// made against an older state of the pool is refused, and pages brought back into the pool
// (promotion) exactly, or left where they were when their read fails.
#include "kvl/kv_pressure.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "kvl/kv_tier.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

constexpr int32_t kBlock = 4;

class PlannerHarness {
 public:
  PlannerHarness(std::string_view policy, bool ram_tier, int64_t staged_pages,
                 int64_t num_blocks = 16, int64_t sink_tokens = 4, int64_t recent_tokens = 4,
                 bool ram_zstd = false) {
    KvManagerOptions o;
    o.layout = KvBlockLayout{kBlock, /*num_layers=*/2, /*kv_dim=*/4};
    o.budget_bytes = num_blocks * o.layout.block_bytes();
    o.max_seqs = 4;
    kv_ = std::move(KvManager::Create(o).value());
    storage_ = std::move(KvBlockStorage::Create(o.layout, kv_->num_blocks()).value());
    pager_ = std::make_unique<KvPager>(*kv_, *storage_, o.max_seqs, /*max_context=*/256);
    if (ram_tier) {
      ram_ = std::make_unique<FailingReadsTier>(MakeRamTier(RamTierOptions{.compress = ram_zstd}));
    }
    pager_->set_tiers({ram_.get(), nullptr});
    pager_->set_track_attention(true);
    pager_->ReserveStaging(staged_pages, /*compresses=*/true);
    KvPagingSetup setup;
    setup.policy = ParseKvPolicy(policy).value();
    setup.has_ram_tier = ram_ != nullptr;
    setup.int8_fits = true;
    setup.int4_fits = true;
    setup.block_tokens = kBlock;
    setup.sink_tokens = sink_tokens;
    setup.recent_tokens = recent_tokens;
    PageCostProfile prices;
    prices.kv_bytes = o.layout.kv_bytes();
    prices.ram_gbps = 10;
    rules_ = MakeKvPagingRules(setup, prices).value();
    planner_ = std::make_unique<KvPressurePlanner>(rules_, *kv_, *pager_);
  }

  // Admits sequence `seq` with `n` tokens; masses[b] is the attention mass of page b.
  void Admit(SeqId seq, int32_t n, const std::vector<float>& masses = {}) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    std::iota(tokens.begin(), tokens.end(), 1000 * seq);
    const KvSeqStep step{seq, tokens};
    const KvPlan plan = kv_->Plan(std::span(&step, 1));
    ASSERT_TRUE(plan.fits);
    kv_->Commit(plan);
    pages_[static_cast<size_t>(seq)] = std::make_unique<KvSequencePages>();
    pager_->StartSequence(seq, pages_[static_cast<size_t>(seq)].get());
    float* mass = pager_->AttentionMass(seq);
    for (size_t b = 0; b < masses.size(); ++b) mass[b * kBlock] = masses[b];
  }

  std::vector<int64_t> PlannedBlocks(const KvPagePlan& plan) const {
    std::vector<int64_t> blocks;
    for (const KvPageAction& a : plan.actions) blocks.push_back(a.block_index);
    return blocks;
  }

  KvManager& kv() { return *kv_; }
  KvPager& pager() { return *pager_; }
  KvPressurePlanner& planner() { return *planner_; }
  KvBlockStorage& storage() { return *storage_; }
  FailingReadsTier& ram() { return *ram_; }

 private:
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<FailingReadsTier> ram_;
  std::unique_ptr<KvPager> pager_;
  KvPagingRules rules_;
  std::unique_ptr<KvPressurePlanner> planner_;
  std::unique_ptr<KvSequencePages> pages_[4];
};

TEST(KvPressurePlannerTest, ReliefTakesTheColdestPagesButNeverSinksRecentOrTheLastPage) {
  // 7 pages (the last one partial): page 0 holds the sinks, page 5 is the recent window, page 6
  // is being written. Pages 1-4 are candidates, coldest (least attention mass) first.
  PlannerHarness h("evict", /*ram_tier=*/false, /*staged_pages=*/0);
  h.Admit(0, 26, {0.9f, 0.4f, 0.1f, 0.3f, 0.2f, 0.0f, 0.0f});
  KvPagePlan plan;
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, /*blocks_short=*/3, Phase::kDecode,
                         &plan);
  EXPECT_EQ(h.PlannedBlocks(plan), (std::vector<int64_t>{2, 4, 3}));
  for (const KvPageAction& a : plan.actions) EXPECT_EQ(a.action, KvAction::kEvict);
  EXPECT_EQ(plan.blocks_to_free, 3);

  // Asking for more than there are candidates plans every candidate and no more.
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 10, Phase::kDecode, &plan);
  EXPECT_EQ(h.PlannedBlocks(plan), (std::vector<int64_t>{2, 4, 3, 1}));
}

TEST(KvPressurePlannerTest, ReliefTakesPagesOfTheSequenceWithFewestStepsLeftFirst) {
  // Two sequences of 7 pages each (candidates: pages 1-4). A page that leaves a running sequence
  // is read from its tier at each step the sequence still takes, so the one that ends sooner gives
  // its pages first, whatever their attention mass; within it, the coldest first.
  PlannerHarness h("demote", /*ram_tier=*/true, /*staged_pages=*/8, /*num_blocks=*/32);
  h.Admit(0, 26, {0.9f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f});
  h.Admit(1, 26, {0.9f, 0.4f, 0.1f, 0.3f, 0.2f, 0.0f, 0.0f});
  KvPagePlan plan;
  const std::vector<KvPlannedSeq> running = {{0, 1, /*steps_left=*/300}, {1, 2, /*steps_left=*/5}};
  h.planner().PlanRelief(running, /*blocks_short=*/5, Phase::kDecode, &plan);
  std::vector<std::pair<SeqId, int64_t>> planned;
  for (const KvPageAction& a : plan.actions) planned.push_back({a.seq, a.block_index});
  EXPECT_EQ(planned,
            (std::vector<std::pair<SeqId, int64_t>>{{1, 2}, {1, 4}, {1, 3}, {1, 1}, {0, 1}}));
  // Steps left unknown: the coldest pages first, across sequences.
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}, {1, 2}}, 2, Phase::kDecode, &plan);
  for (const KvPageAction& a : plan.actions) EXPECT_EQ(a.seq, 0);
}

TEST(KvPressurePlannerTest, ApplyingFreesBlocksAndMarksEachActionApplied) {
  PlannerHarness h("evict", false, 0);
  h.Admit(0, 26, {0.9f, 0.4f, 0.1f, 0.3f, 0.2f});
  const int64_t free_before = h.kv().stats().blocks_free;
  KvPagePlan plan;
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 2, Phase::kDecode, &plan);
  EXPECT_EQ(h.pager().Apply(plan), 2);
  EXPECT_TRUE(plan.actions[0].applied && plan.actions[1].applied);
  EXPECT_EQ(h.kv().stats().blocks_free, free_before + 2);
  EXPECT_EQ(h.pager().FateOf(0, 2), KvPageFate::kEvicted);
  EXPECT_EQ(h.pager().FateOf(0, 4), KvPageFate::kEvicted);
  EXPECT_EQ(h.pager().FateOf(0, 3), KvPageFate::kResident);
  EXPECT_TRUE(h.kv().CheckInvariants().ok());
}

TEST(KvPressurePlannerTest, StalePlansAreRefused) {
  PlannerHarness h("evict", false, 0);
  h.Admit(0, 26);
  KvPagePlan plan;
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 1, Phase::kDecode, &plan);
  ASSERT_EQ(plan.actions.size(), 1u);
  h.Admit(1, 5);  // the pool changed after planning
  EXPECT_DEATH(h.pager().Apply(plan), "older state");
}

TEST(KvPressurePlannerTest, TierActionsOnlyWhileStagingHasRoom) {
  // Fixed demote with room for 2 streamed pages: two pages go to the (compressed, so staged) RAM
  // tier, the third is kept (lossless: nothing else is allowed), so relief plans only 2 although
  // 3 were asked for.
  PlannerHarness h("demote", /*ram_tier=*/true, /*staged_pages=*/2, 16, 4, 4, /*ram_zstd=*/true);
  h.Admit(0, 26);
  KvPagePlan plan;
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 3, Phase::kDecode, &plan);
  ASSERT_EQ(plan.actions.size(), 2u);
  EXPECT_EQ(plan.actions[0].action, KvAction::kDemoteRam);
  EXPECT_EQ(h.pager().Apply(plan), 2);
  EXPECT_EQ(h.pager().staged_pages_held(), 2);
  // The staging is full now: nothing more can be streamed.
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 1, Phase::kDecode, &plan);
  EXPECT_TRUE(plan.actions.empty());
}

TEST(KvPressurePlannerTest, PagesReadInPlaceFromRamNeedNoStaging) {
  // An uncompressed RAM tier is read where it lies: with no staging at all, relief still demotes
  // all 3 pages asked for, and none of them counts as staged.
  PlannerHarness h("demote", /*ram_tier=*/true, /*staged_pages=*/0);
  h.Admit(0, 26);
  KvPagePlan plan;
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 3, Phase::kDecode, &plan);
  ASSERT_EQ(plan.actions.size(), 3u);
  EXPECT_EQ(h.pager().Apply(plan), 3);
  EXPECT_EQ(h.pager().stats().streamed_pages, 3);
  EXPECT_EQ(h.pager().stats().in_place_pages, 3);
  EXPECT_EQ(h.pager().staged_pages_held(), 0);
}

TEST(KvPressurePlannerTest, PreemptionKeepsALosslessPagedSequenceAndRecomputesALossyOne) {
  PlannerHarness h("demote", true, 4);
  h.Admit(0, 13);  // 3 full pages
  KvPagePlan plan;
  h.planner().PlanPreemption({0, 1}, 13, Phase::kDecode, &plan);
  ASSERT_EQ(plan.actions.size(), 3u);
  for (const KvPageAction& a : plan.actions) EXPECT_EQ(a.action, KvAction::kDemoteRam);

  h.Admit(1, 26);
  KvPagePlan relief;
  h.planner().PlanRelief(std::vector<KvPlannedSeq>{{1, 2}}, 1, Phase::kDecode, &relief);
  ASSERT_EQ(h.pager().Apply(relief), 1);
  ASSERT_TRUE(h.kv().IsPaged(1));
  ASSERT_FALSE(h.kv().IsLossy(1));
  // Demoted pages are bit-exact: the pages computed since are exact too and are kept; the page
  // already in the tier is let go (recomputed, or found again in the store).
  h.planner().PlanPreemption({1, 2}, 26, Phase::kDecode, &plan);
  ASSERT_EQ(plan.actions.size(), 6u);
  const int64_t detached = relief.actions[0].block_index;
  for (const KvPageAction& a : plan.actions) {
    EXPECT_EQ(a.action, a.block_index == detached ? KvAction::kRecomputeTokens
                                                   : KvAction::kDemoteRam)
        << a.block_index;
  }

  // An evicted page makes the sequence lossy: everything is recomputed.
  PlannerHarness lossy("evict", true, 4);
  lossy.Admit(0, 26);
  lossy.planner().PlanRelief(std::vector<KvPlannedSeq>{{0, 1}}, 1, Phase::kDecode, &relief);
  ASSERT_EQ(lossy.pager().Apply(relief), 1);
  ASSERT_TRUE(lossy.kv().IsLossy(0));
  lossy.planner().PlanPreemption({0, 1}, 26, Phase::kDecode, &plan);
  ASSERT_EQ(plan.actions.size(), 6u);
  for (const KvPageAction& a : plan.actions) EXPECT_EQ(a.action, KvAction::kRecomputeTokens);
}

TEST(KvPagingRulesTest, FixedPoliciesNeedWhatTheyUseAndLossyOnesOverrideLossless) {
  PageCostProfile prices;
  KvPagingSetup setup;
  setup.policy = ParseKvPolicy("demote").value();
  EXPECT_EQ(MakeKvPagingRules(setup, prices).status().code(), StatusCode::kInvalidArgument);
  setup.policy = ParseKvPolicy("demote-disk").value();
  setup.has_ram_tier = true;
  EXPECT_EQ(MakeKvPagingRules(setup, prices).status().code(), StatusCode::kInvalidArgument);
  setup.policy = ParseKvPolicy("compress-int4").value();
  setup.int4_fits = false;
  EXPECT_EQ(MakeKvPagingRules(setup, prices).status().code(), StatusCode::kInvalidArgument);
  setup.int4_fits = true;
  const KvPagingRules rules = MakeKvPagingRules(setup, prices).value();
  EXPECT_EQ(rules.quality, KvQuality::kAggressive);
  EXPECT_TRUE(rules.pages_running_sequences);
  // auto, lossless, with no tier: nothing may move while sequences run.
  KvPagingSetup bare;
  EXPECT_FALSE(MakeKvPagingRules(bare, prices).value().pages_running_sequences);
  // Residual checkpoints: asked for, or under auto where they are no bigger than K+V.
  EXPECT_TRUE(KeepsResidualCheckpoints(ParseKvPolicy("auto").value(), true, 64, 32));
  EXPECT_FALSE(KeepsResidualCheckpoints(ParseKvPolicy("auto").value(), true, 2048, 256));
  EXPECT_FALSE(KeepsResidualCheckpoints(ParseKvPolicy("auto").value(), false, 64, 32));
}

// `auto`'s checkpoints are kept only where its prices would rebuild a page from them rather than
// demote it (KvMemory::CreatePool): the same page, the RAM tier fast or slow against the rebuild.
TEST(KvPressurePlannerTest, CheckpointsAreKeptOnlyWhereARebuildIsPricedBelowDemotion) {
  PageCostProfile p;
  p.block_tokens = 16;
  p.kv_bytes = 16 * 6 * 2 * 288 * 4;      // an MHA page: the checkpoints are half its K+V
  p.residual_bytes = 16 * 6 * 288 * 4;
  p.ram_gbps = 10;                        // 221 KB back in 0.022 ms
  p.recompute_residual_ms = 0.2;          // the rebuild alone takes longer: demotion wins
  EXPECT_FALSE(ResidualRebuildBeatsDemotion(p));
  p.ram_gbps = 0.1;                       // 2.2 ms to read K+V back, 1.1 ms for the checkpoints
  EXPECT_TRUE(ResidualRebuildBeatsDemotion(p));
  // A tier with no measured bandwidth prices neither way: the shape rule stands.
  p.ram_gbps = 0;
  EXPECT_TRUE(ResidualRebuildBeatsDemotion(p));
}

// The same choice weighs the engine's measured corrections (seeded from the profile's written-back
// ones) as the running pool will: a RAM tier measured 3x slower than its profile turns a narrow
// win of demotion into one of the rebuild, and a rebuild measured 2x slower turns it back.
TEST(KvPressurePlannerTest, CheckpointsAreKeptWhereTheCorrectedPricesFavourARebuild) {
  PageCostProfile p;
  p.block_tokens = 16;
  p.kv_bytes = 16 * 6 * 2 * 288 * 4;  // 0.022 ms each way at 10 GB/s
  p.residual_bytes = 16 * 6 * 288 * 4;
  p.ram_gbps = 10;
  p.recompute_residual_ms = 0.05;     // 0.011 + 0.011 + 0.05 = 0.072 ms against 0.044 ms
  EXPECT_FALSE(ResidualRebuildBeatsDemotion(p));
  BringBackFeedback feedback(kNumKvActions);
  EXPECT_FALSE(ResidualRebuildBeatsDemotion(p, &feedback));  // no correction yet: the profile's
  feedback.Seed(static_cast<size_t>(KvAction::kDemoteRam), 3.0);  // 0.066 + 0.022 ms
  EXPECT_TRUE(ResidualRebuildBeatsDemotion(p, &feedback));
  feedback.Seed(static_cast<size_t>(KvAction::kRecomputeResidual), 2.0);  // 0.011 + 0.122 ms
  EXPECT_FALSE(ResidualRebuildBeatsDemotion(p, &feedback));
}

TEST(KvPressurePlannerTest, MemoryPriceIsTheCheapestWayOutScaledByTheDemandOnThePool) {
  // A RAM tier at 10 GB/s is the cheapest lossless way out: a 256-byte page (4 tokens x 2 layers
  // x 4 channels x K,V x f32) comes back in 256 / 1e7 ms.
  PlannerHarness h("auto", /*ram_tier=*/true, /*staged_pages=*/4);
  const double per_mib = (256.0 / 1e7) / (256.0 / (1024.0 * 1024.0));
  const int64_t blocks = h.kv().num_blocks();
  EXPECT_NEAR(h.planner().MemoryPriceMsPerMib(1, 0), per_mib * (1.0 + 1.0 / blocks), 1e-12);
  // More pages short, or a budget consumed faster, make every resident byte dearer.
  EXPECT_GT(h.planner().MemoryPriceMsPerMib(8, 0), h.planner().MemoryPriceMsPerMib(1, 0));
  EXPECT_GT(h.planner().MemoryPriceMsPerMib(1, 2.0), h.planner().MemoryPriceMsPerMib(1, 0));
  // With nowhere to go and nothing measured, the price is the named default, not 0.
  PlannerHarness stranded("auto", /*ram_tier=*/false, /*staged_pages=*/0);
  EXPECT_GT(stranded.planner().MemoryPriceMsPerMib(1, 0), 0);
}

TEST(KvPressurePlannerTest, PagesAttentionStopsReadingGrowCold) {
  // Page 1 gets a uniform share of every step's attention; page 2 got weight once, long ago.
  PlannerHarness h("auto", /*ram_tier=*/true, /*staged_pages=*/4, /*num_blocks=*/16,
                   /*sink_tokens=*/0, /*recent_tokens=*/0);
  h.Admit(0, 16);
  const SeqId seq = 0;
  const std::vector<SeqId> seqs = {seq};
  for (int step = 0; step < 10; ++step) {
    h.pager().BeginStep(seqs);
    float* mass = h.pager().AttentionMass(seq);
    // What a step's forward pass adds: 1 in all, here half on page 1's tokens.
    for (int t = 0; t < kBlock; ++t) mass[kBlock + t] += 0.5f / kBlock;
    if (step == 0) {
      for (int t = 0; t < kBlock; ++t) mass[2 * kBlock + t] += 0.5f / kBlock;
    }
    h.pager().EndStep();
  }
  h.pager().BeginStep(seqs);
  EXPECT_EQ(h.pager().StepsSinceRead(seq, 1), 0);
  EXPECT_EQ(h.pager().PageReads(seq, 1), 10);
  EXPECT_EQ(h.pager().StepsSinceRead(seq, 2), 9);
  EXPECT_EQ(h.pager().PageReads(seq, 2), 1);
  h.pager().EndStep();
  // Both are read at each step the sequence takes (full attention): the same reuse forecast;
  // what the cold page loses by leaving is priced by its smaller attention mass.
  EXPECT_LT(h.pager().PageMass(seq, 2), h.pager().PageMass(seq, 1));
}

}  // namespace
}  // namespace kvl

namespace kvl {
namespace {

// Every byte of the block's K/V, from its block index and `seed`: what a page held before it
// left, to compare with what comes back.
std::vector<uint8_t> FillBlock(KvBlockStorage& storage, BlockId block, int seed) {
  const int64_t bytes = storage.layout().kv_bytes();
  for (int64_t i = 0; i < bytes; ++i) storage.bytes(block)[i] = static_cast<uint8_t>(seed * 31 + i);
  return {storage.bytes(block), storage.bytes(block) + bytes};
}

std::vector<uint8_t> BlockBytes(KvBlockStorage& storage, BlockId block) {
  return {storage.bytes(block), storage.bytes(block) + storage.layout().kv_bytes()};
}

TEST(KvPromotionTest, PagesComeBackMostStepsLeftFirstWithinWhatThePoolSpares) {
  PlannerHarness h("demote", /*ram_tier=*/true, /*staged_pages=*/8, /*num_blocks=*/32, 4, 4,
                   /*ram_zstd=*/true);
  h.Admit(0, 26);
  h.Admit(1, 26);
  const std::vector<KvPlannedSeq> running = {{0, 1, /*steps_left=*/5}, {1, 2, /*steps_left=*/300}};
  KvPagePlan relief;
  h.planner().PlanRelief(running, /*blocks_short=*/6, Phase::kDecode, &relief);
  ASSERT_EQ(h.pager().Apply(relief), 6);
  ASSERT_EQ(h.pager().stats().streamed_pages, 6);
  // Relief took sequence 0's pages first (fewest steps left); sequence 1's come back first.
  KvPagePlan plan;
  h.planner().PlanPromotion(running, /*blocks_to_spare=*/3, /*max_pages=*/8, &plan);
  std::vector<SeqId> seqs;
  for (const KvPageAction& a : plan.actions) seqs.push_back(a.seq);
  ASSERT_EQ(plan.actions.size(), 3u);
  const int64_t seq1_out = std::count_if(relief.actions.begin(), relief.actions.end(),
                                         [](const KvPageAction& a) { return a.seq == 1; });
  ASSERT_GT(seq1_out, 0);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seqs[static_cast<size_t>(i)], i < seq1_out ? 1 : 0) << i;
  }
  for (const KvPageAction& a : plan.actions) EXPECT_EQ(a.action, KvAction::kDemoteRam);
  // Bounded by max_pages; nothing with nothing to spare, nor for a sequence taking one more step.
  h.planner().PlanPromotion(running, 3, /*max_pages=*/1, &plan);
  EXPECT_EQ(plan.actions.size(), 1u);
  h.planner().PlanPromotion(running, /*blocks_to_spare=*/0, 8, &plan);
  EXPECT_TRUE(plan.actions.empty());
  h.planner().PlanPromotion(std::vector<KvPlannedSeq>{{0, 1, /*steps_left=*/1}}, 8, 8, &plan);
  EXPECT_TRUE(plan.actions.empty());
}

TEST(KvPromotionTest, APromotedPageHoldsItsExactBytesAndLeavesItsTier) {
  PlannerHarness h("demote", /*ram_tier=*/true, /*staged_pages=*/8, 32, 4, 4, /*ram_zstd=*/true);
  h.Admit(0, 26);
  std::vector<std::vector<uint8_t>> before;
  for (int64_t b = 0; b < 7; ++b) {
    before.push_back(FillBlock(h.storage(), h.kv().block_table(0)[static_cast<size_t>(b)],
                               static_cast<int>(b)));
  }
  const std::vector<KvPlannedSeq> running = {{0, 1, 100}};
  KvPagePlan relief;
  h.planner().PlanRelief(running, 3, Phase::kDecode, &relief);
  ASSERT_EQ(h.pager().Apply(relief), 3);
  // The freed blocks are written over, as a reuse would.
  for (BlockId b = 0; b < h.kv().num_blocks(); ++b) {
    if (h.kv().refcount(b) == 0) {
      std::fill_n(h.storage().bytes(b), h.storage().layout().kv_bytes(), 0xAB);
    }
  }
  const int64_t tier_pages = h.ram().stats().pages;
  KvPagePlan plan;
  h.planner().PlanPromotion(running, 8, 8, &plan);
  ASSERT_EQ(plan.actions.size(), 3u);
  EXPECT_EQ(h.pager().PromoteBack(plan), 3);
  EXPECT_TRUE(h.kv().CheckInvariants().ok()) << h.kv().CheckInvariants().ToString();
  for (const KvPageAction& a : plan.actions) {
    EXPECT_TRUE(a.applied);
    EXPECT_EQ(h.pager().FateOf(0, a.block_index), KvPageFate::kResident);
    const BlockId block = h.kv().block_table(0)[static_cast<size_t>(a.block_index)];
    ASSERT_NE(block, kNoBlock);
    EXPECT_EQ(BlockBytes(h.storage(), block), before[static_cast<size_t>(a.block_index)])
        << a.block_index;
  }
  const KvPagerStats st = h.pager().stats();
  EXPECT_EQ(st.streamed_pages, 0);
  EXPECT_EQ(st.promoted_back_pages, 3);
  EXPECT_EQ(h.pager().staged_pages_held(), 0);
  EXPECT_LT(h.ram().stats().pages, tier_pages);  // the pager's own pages are erased
}

TEST(KvPromotionTest, AFailedReadLeavesThePageInItsTierAndTheBlockInThePool) {
  PlannerHarness h("demote", /*ram_tier=*/true, /*staged_pages=*/8, 32, 4, 4, /*ram_zstd=*/true);
  h.Admit(0, 26);
  const std::vector<KvPlannedSeq> running = {{0, 1, 100}};
  KvPagePlan relief;
  h.planner().PlanRelief(running, 2, Phase::kDecode, &relief);
  ASSERT_EQ(h.pager().Apply(relief), 2);
  const int64_t free_before = h.kv().stats().blocks_free;
  const int64_t cached_before = h.kv().stats().blocks_cached;
  const int64_t tier_pages = h.ram().stats().pages;
  h.ram().fail_reads = true;
  KvPagePlan plan;
  h.planner().PlanPromotion(running, 8, 8, &plan);
  ASSERT_EQ(plan.actions.size(), 2u);
  EXPECT_EQ(h.pager().PromoteBack(plan), 0);
  for (const KvPageAction& a : plan.actions) {
    EXPECT_FALSE(a.applied);
    EXPECT_TRUE(a.failed);
    EXPECT_EQ(h.pager().FateOf(0, a.block_index), KvPageFate::kInTier);
    EXPECT_EQ(h.kv().block_table(0)[static_cast<size_t>(a.block_index)], kNoBlock);
  }
  EXPECT_TRUE(h.kv().CheckInvariants().ok()) << h.kv().CheckInvariants().ToString();
  EXPECT_EQ(h.kv().stats().blocks_free, free_before);
  EXPECT_EQ(h.kv().stats().blocks_cached, cached_before);  // nothing findable in those blocks
  EXPECT_EQ(h.pager().stats().streamed_pages, 2);
  EXPECT_EQ(h.pager().stats().stream_read_failures, 2);
  EXPECT_EQ(h.ram().stats().pages, tier_pages);  // still there to be streamed
  // Once reads succeed again, they come back.
  h.ram().fail_reads = false;
  h.planner().PlanPromotion(running, 8, 8, &plan);
  EXPECT_EQ(h.pager().PromoteBack(plan), 2);
  EXPECT_EQ(h.pager().stats().streamed_pages, 0);
}

TEST(KvPromotionTest, EvictedPagesNeverComeBack) {
  // Their exact bytes are gone (as a compressed page's are): only tier and checkpoint pages are
  // candidates.
  PlannerHarness h("evict", /*ram_tier=*/false, /*staged_pages=*/0, 32);
  h.Admit(0, 26);
  const std::vector<KvPlannedSeq> running = {{0, 1, 100}};
  KvPagePlan relief;
  h.planner().PlanRelief(running, 2, Phase::kDecode, &relief);
  ASSERT_EQ(h.pager().Apply(relief), 2);
  KvPagePlan plan;
  h.planner().PlanPromotion(running, 8, 8, &plan);
  EXPECT_TRUE(plan.actions.empty());
}

}  // namespace
}  // namespace kvl
