// The KV pressure planner and the pager that applies its plans, on a model-free pool: which pages
// are candidates and in what order, what the rules allow, what staging allows, and that a plan
// made against an older state of the pool is refused.
#include "kvl/kv_pressure.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "kvl/kv_tier.h"

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
    if (ram_tier) ram_ = MakeRamTier(RamTierOptions{.compress = ram_zstd});
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

 private:
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<KvTier> ram_;
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
  // The cold page's reuse probability is the lower.
  PageHistory hot, cold;
  hot.steps_since_access = h.pager().StepsSinceRead(seq, 1);
  hot.accesses = h.pager().PageReads(seq, 1);
  cold.steps_since_access = h.pager().StepsSinceRead(seq, 2);
  cold.accesses = h.pager().PageReads(seq, 2);
  EXPECT_LT(ReuseProbability(cold), ReuseProbability(hot));
}

}  // namespace
}  // namespace kvl
