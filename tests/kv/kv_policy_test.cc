#include "kvl/kv_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

namespace kvl {
namespace {

// Page costs of a 16-token page of an MHA model (stories15M-like) and a GQA one (TinyLlama-like):
// for GQA the residual checkpoint (d_model) is larger than K+V (2 * kv_dim).
PageCostProfile Mha() {
  PageCostProfile p;
  p.kv_bytes = 16 * 6 * 2 * 288 * 4;
  p.residual_bytes = 16 * 6 * 288 * 4;
  p.recompute_residual_ms = 0.05;
  p.recompute_tokens_ms = 0.4;
  p.compress_ms = 0.01;
  p.ram_gbps = 10;
  p.disk_read_gbps = 2;
  p.disk_write_gbps = 1;
  p.disk_latency_ms = 0.1;
  p.has_disk_tier = true;
  // As calibrate measures it: 64 rebuilt rows riding in a decode step add half of what the
  // page's separate rebuild takes (its weights already stream for the step).
  p.decode_idle = DecodeIdleCurve{};
  p.decode_idle.Add({0, 1.0, 0.5, 64, 1.0 + 64 * (0.5 * 0.05 / 16)});
  p.block_tokens = 16;
  return p;
}

PageCostProfile Gqa() {
  PageCostProfile p = Mha();
  p.kv_bytes = 16 * 22 * 2 * 256 * 4;
  p.residual_bytes = 16 * 22 * 2048 * 4;  // 4x the K+V
  p.recompute_residual_ms = 2.0;
  p.recompute_tokens_ms = 40.0;
  return p;
}

// The cost the decision priced for one action (costs are indexed by KvAction).
const KvActionCost& CostOf(const KvDecision& d, KvAction action) {
  return d.costs[static_cast<size_t>(action)];
}

// The cheapest action among the allowed ones and `unlocked`: what the policy would pick if the
// rule that forbids `unlocked` did not exist. A rule is only tested where it changes this.
KvAction CheapestWith(const KvDecision& d, std::initializer_list<KvAction> unlocked) {
  KvAction best = KvAction::kKeep;
  double best_ms = std::numeric_limits<double>::infinity();
  for (const KvActionCost& c : d.costs) {
    const bool candidate =
        c.allowed || std::find(unlocked.begin(), unlocked.end(), c.action) != unlocked.end();
    if (candidate && c.total_ms < best_ms) {
      best = c.action;
      best_ms = c.total_ms;
    }
  }
  return best;
}

// A page with nowhere to go: no tier, and a long context behind it that makes re-running its
// tokens expensive. Under pressure only compression or eviction is cheap.
PageCostProfile Stranded(PageCostProfile p) {
  p.has_disk_tier = false;
  p.has_ram_tier = false;
  p.recompute_tokens_ms = 500;
  return p;
}

// A page unlikely to be read again: an idle one, next read (if at all) far ahead, with a 6%
// chance of a revival.
PageHistory ColdPage() {
  PageHistory h;
  h.first_position = 64;
  h.reuse = {/*next_read_steps=*/200, /*reads_left=*/0.06, /*order_in_step=*/0};
  h.attention_mass = 0.001;
  return h;
}

TEST(KvPolicyTest, WithoutMemoryPressureKeepWins) {
  const KvDecision d = ChooseKvAction(ColdPage(), Mha(), {});
  EXPECT_EQ(d.action, KvAction::kKeep);
  // Keep wins on cost, not on the tie rule: every other action costs something even here.
  for (const KvActionCost& c : d.costs) {
    if (c.action != KvAction::kKeep) EXPECT_GT(c.total_ms, 0.0) << KvActionName(c.action);
  }
  // With pressure the same cold page leaves the pool, so the case above is a real choice.
  KvPolicyOptions pressed;
  pressed.memory_price_ms_per_mib = 50;
  EXPECT_NE(ChooseKvAction(ColdPage(), Mha(), pressed).action, KvAction::kKeep);
}

TEST(KvPolicyTest, LosslessNeverCompressesOrEvicts) {
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.memory_price_ms_per_mib = 1e6;  // extreme pressure
  for (const PageCostProfile& p : {Stranded(Mha()), Stranded(Gqa())}) {
    const KvDecision d = ChooseKvAction(ColdPage(), p, o);
    // Here a lossy action is the cheapest, so only the quality rule keeps it out.
    const KvAction lossy_best =
        CheapestWith(d, {KvAction::kCompressInt8, KvAction::kCompressInt4, KvAction::kEvict});
    EXPECT_FALSE(IsLossless(lossy_best)) << d.Explain();
    EXPECT_TRUE(IsLossless(d.action)) << KvActionName(d.action);
    for (KvAction lossy : {KvAction::kCompressInt8, KvAction::kCompressInt4, KvAction::kEvict}) {
      EXPECT_FALSE(CostOf(d, lossy).allowed) << KvActionName(lossy);
      EXPECT_EQ(CostOf(d, lossy).why_not, "lossy (--kv-quality lossless)") << KvActionName(lossy);
    }
    EXPECT_NE(d.Explain().find("not allowed: lossy"), std::string::npos);
  }
}

// Lossless decode under pressure, for a page likely to be read again soon (so bringing it back
// matters): where the residual and the transfer paths compete.
KvPolicyOptions LosslessDecodeUnderPressure() {
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.memory_price_ms_per_mib = 50;
  o.phase = Phase::kDecode;
  return o;
}

PageHistory WarmPage() {
  PageHistory warm = ColdPage();
  warm.reuse = {4, 0.55, 0};  // an idle page likelier than not to be found again soon
  return warm;
}

TEST(KvPolicyTest, ResidualRecomputeDependsOnTheModelsBytes) {
  const KvPolicyOptions o = LosslessDecodeUnderPressure();
  const PageHistory warm = WarmPage();
  // MHA: the checkpoint is half the K+V and cheap to rebuild -> recompute from residuals.
  const KvDecision mha = ChooseKvAction(warm, Mha(), o);
  EXPECT_EQ(mha.action, KvAction::kRecomputeResidual) << mha.Explain();
  // GQA: the checkpoint is 4x the K+V it stands for: moving K+V itself is cheaper.
  const KvDecision gqa = ChooseKvAction(warm, Gqa(), o);
  EXPECT_EQ(gqa.action, KvAction::kDemoteRam) << gqa.Explain();
  // A page nobody is likely to read again still goes to RAM, not to a recompute: moving its K+V
  // twice costs less than re-running its tokens even weighted by a low chance of reuse.
  const KvDecision cold = ChooseKvAction(ColdPage(), Gqa(), o);
  EXPECT_EQ(cold.action, KvAction::kDemoteRam) << cold.Explain();
  EXPECT_LT(CostOf(cold, KvAction::kDemoteRam).total_ms,
            CostOf(cold, KvAction::kRecomputeTokens).total_ms);
}

// A preempted sequence's pages leave one by one, each the cheapest way as measured: with the RAM
// tier measured at 2.4x its profile (the engine's correction on stories15M) and recomputing 16
// tokens cheap, the sequence's first page is recomputed (no context to attend over) and a deep
// one demoted (its recompute attends over 1024 earlier tokens): a mix no fixed policy makes.
TEST(KvPolicyTest, ACorrectedTransferSendsACheapPageToRecomputeAndADeepOneToTheTier) {
  PageCostProfile p;
  p.block_tokens = 16;
  p.kv_bytes = 16 * 6 * 2 * 288 * 4;  // 221 KB: 0.022 ms each way at 10 GB/s
  p.ram_gbps = 10;
  p.recompute_tokens_ms = 0.06;
  p.recompute_tokens_context_ms = 1e-4;  // per earlier token
  p.has_ram_tier = true;
  // As the planner offers a preempted page: it must leave (no keep), and losslessly.
  p.available_actions = (1u << static_cast<int>(KvAction::kDemoteRam)) |
                        (1u << static_cast<int>(KvAction::kRecomputeTokens));
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.phase = Phase::kPrefill;
  PageHistory first;
  first.first_position = 0;
  PageHistory deep;
  deep.first_position = 1024;

  // On the profile alone the tier wins both: 0.044 ms against 0.06 ms and more.
  EXPECT_EQ(ChooseKvAction(first, p, o).action, KvAction::kDemoteRam);
  EXPECT_EQ(ChooseKvAction(deep, p, o).action, KvAction::kDemoteRam);

  BringBackFeedback feedback(kNumKvActions);
  feedback.Seed(static_cast<size_t>(KvAction::kDemoteRam), 2.4);
  o.feedback = &feedback;
  // Corrected, the transfer back costs 0.053 ms (+ 0.022 ms to write): above the first page's
  // recompute, below the deep page's (0.06 + 0.1024 ms).
  const KvDecision at_first = ChooseKvAction(first, p, o);
  EXPECT_EQ(at_first.action, KvAction::kRecomputeTokens) << at_first.Explain();
  EXPECT_NEAR(CostOf(at_first, KvAction::kDemoteRam).bring_back_ms, 2.4 * 221184 / 1e7, 1e-9);
  const KvDecision at_deep = ChooseKvAction(deep, p, o);
  EXPECT_EQ(at_deep.action, KvAction::kDemoteRam) << at_deep.Explain();
  // A recompute measured slow as well sends the first page back to the tier.
  feedback.Seed(static_cast<size_t>(KvAction::kRecomputeTokens), 2.0);
  EXPECT_EQ(ChooseKvAction(first, p, o).action, KvAction::kDemoteRam);
}

// The engine's measured bring-back times correct the profile's: an action found slower than
// predicted costs more, and can lose the choice it won on the profile alone.
TEST(KvPolicyTest, MeasuredCorrectionsScaleBringBackAndCanChangeTheChoice) {
  KvPolicyOptions o = LosslessDecodeUnderPressure();
  const PageHistory warm = WarmPage();
  // On the MHA profile rebuilding from checkpoints wins (see the test above), narrowly.
  const KvDecision before = ChooseKvAction(warm, Mha(), o);
  ASSERT_EQ(before.action, KvAction::kRecomputeResidual) << before.Explain();
  const KvActionCost& was = CostOf(before, KvAction::kRecomputeResidual);
  EXPECT_EQ(was.model_bring_back_ms, was.bring_back_ms);

  // The rebuild measured 2x slower than the profile says (a busy machine).
  BringBackFeedback feedback(kNumKvActions);
  for (int i = 0; i < 4; ++i) {
    feedback.Observe(static_cast<size_t>(KvAction::kRecomputeResidual), 1.0, 2.0);
  }
  o.feedback = &feedback;
  const KvDecision after = ChooseKvAction(warm, Mha(), o);
  const KvActionCost& is = CostOf(after, KvAction::kRecomputeResidual);
  EXPECT_DOUBLE_EQ(is.bring_back_ms, 2 * was.bring_back_ms);
  EXPECT_DOUBLE_EQ(is.hidden_ms, 2 * was.hidden_ms);  // the same work, in the step in the same share
  EXPECT_DOUBLE_EQ(is.model_bring_back_ms, was.bring_back_ms);
  // Actions without measurements keep the profile's price.
  EXPECT_DOUBLE_EQ(CostOf(after, KvAction::kDemoteRam).bring_back_ms,
                   CostOf(before, KvAction::kDemoteRam).bring_back_ms);
  // At twice its price the rebuild loses to moving the K+V through RAM.
  EXPECT_EQ(after.action, KvAction::kDemoteRam) << after.Explain();
  EXPECT_NE(after.Explain().find("x 2.00 measured"), std::string::npos) << after.Explain();
}

TEST(KvPolicyTest, DecodePricesARebuildAtItsMarginalCostInTheStep) {
  KvPolicyOptions o;
  o.memory_price_ms_per_mib = 50;
  PageHistory hot = ColdPage();
  hot.reuse = {0, 1, 0};  // read at the next step
  PageCostProfile p = Mha();
  // A page rebuilt from checkpoints rides in the decode step that reads it: it costs what its
  // rows add to that step (measured), which lowers its cost, not the time a rebuild of its own
  // takes (the prediction the engine checks at a restore); moving bytes (demotion) and
  // recomputing from tokens (a prefill chunk at resume) cost the same in either phase.
  o.phase = Phase::kDecode;
  const KvActionCost decode = CostOf(ChooseKvAction(hot, p, o), KvAction::kRecomputeResidual);
  o.phase = Phase::kPrefill;
  const KvActionCost prefill = CostOf(ChooseKvAction(hot, p, o), KvAction::kRecomputeResidual);
  EXPECT_LT(decode.total_ms, prefill.total_ms);
  EXPECT_EQ(decode.bring_back_ms, prefill.bring_back_ms);
  EXPECT_NEAR(decode.hidden_ms, 0.5 * p.recompute_residual_ms, 1e-12);
  EXPECT_EQ(prefill.hidden_ms, 0);
  for (KvAction a : {KvAction::kDemoteRam, KvAction::kRecomputeTokens}) {
    o.phase = Phase::kDecode;
    const KvActionCost in_decode = CostOf(ChooseKvAction(hot, p, o), a);
    o.phase = Phase::kPrefill;
    EXPECT_EQ(in_decode.total_ms, CostOf(ChooseKvAction(hot, p, o), a).total_ms) << KvActionName(a);
    EXPECT_EQ(in_decode.hidden_ms, 0) << KvActionName(a);
  }
  // Rows that cost the step more than a rebuild of its own: nothing hidden, never a surcharge.
  p.decode_idle = DecodeIdleCurve{};
  p.decode_idle.Add({0, 1.0, 0.5, 64, 1.0 + 64 * (2 * p.recompute_residual_ms / 16)});
  o.phase = Phase::kDecode;
  EXPECT_EQ(CostOf(ChooseKvAction(hot, p, o), KvAction::kRecomputeResidual).hidden_ms, 0);
  // Not measured (a profile of version 5, idle fractions only): priced as a rebuild of its own.
  p.decode_idle = DecodeIdleCurve::Flat(0.6);
  const double unmeasured = CostOf(ChooseKvAction(hot, p, o), KvAction::kRecomputeResidual).total_ms;
  o.phase = Phase::kPrefill;
  EXPECT_EQ(unmeasured, CostOf(ChooseKvAction(hot, p, o), KvAction::kRecomputeResidual).total_ms);
}

TEST(KvPolicyTest, DecodeIdleCurveInterpolatesItsTimingsAndHoldsTheEnds) {
  DecodeIdleCurve curve;
  EXPECT_EQ(curve.FractionAt(100), 0);  // nothing measured: nothing hidden
  // As measured on stories15M: the step grows with the context much faster than the batch.
  ASSERT_TRUE(curve.Add({16, 0.17, 0.073}));
  ASSERT_TRUE(curve.Add({128, 0.31, 0.071}));
  ASSERT_TRUE(curve.Add({512, 1.0, 0.13}));
  EXPECT_FALSE(curve.Add({512, 2.0, 0.2}));  // not above the last context
  EXPECT_FALSE(curve.Add({100, 2.0, 0.2}));
  EXPECT_DOUBLE_EQ(curve.FractionAt(16), 1 - 0.073 / 0.17);
  EXPECT_DOUBLE_EQ(curve.FractionAt(128), 1 - 0.071 / 0.31);
  // Held at the ends.
  EXPECT_DOUBLE_EQ(curve.FractionAt(0), curve.FractionAt(16));
  EXPECT_DOUBLE_EQ(curve.FractionAt(-5), curve.FractionAt(16));
  EXPECT_DOUBLE_EQ(curve.FractionAt(4096), 1 - 0.13 / 1.0);
  // Between two points both timings are interpolated, and the fraction taken from them (not
  // the fractions interpolated).
  const double step = 0.31 + 0.5 * (1.0 - 0.31), batch = 0.071 + 0.5 * (0.13 - 0.071);
  EXPECT_DOUBLE_EQ(curve.FractionAt(320), 1 - batch / step);
  EXPECT_GT(curve.FractionAt(320), curve.FractionAt(128));
  EXPECT_LT(curve.FractionAt(320), curve.FractionAt(512));
  // Full at kMaxDecodeIdlePoints.
  ASSERT_TRUE(curve.Add({1024, 2.0, 0.2}));
  EXPECT_FALSE(curve.Add({2048, 4.0, 0.3}));
  EXPECT_DOUBLE_EQ(DecodeIdleCurve::Flat(0.25).FractionAt(7), 0.25);
  EXPECT_DOUBLE_EQ(DecodeIdleCurve::Flat(0.25).FractionAt(70000), 0.25);
  EXPECT_EQ(curve.RebuildRowMsAt(100), -1);  // step times without rebuilt rows: not measured
}

TEST(KvPolicyTest, DecodePricesARebuildAtTheStepsContext) {
  PageCostProfile p = Mha();
  p.block_tokens = 16;
  p.recompute_residual_ms = 1.0;
  p.decode_idle = DecodeIdleCurve{};
  // 64 rows add 0.64 ms to a step at a short context, 0.32 ms at a long one (its attention, not
  // the rows, grows: the rows' share of the step's arithmetic shrinks).
  ASSERT_TRUE(p.decode_idle.Add({16, 1.0, 0.5, 64, 1.64}));
  ASSERT_TRUE(p.decode_idle.Add({512, 2.0, 0.1, 64, 2.32}));
  EXPECT_DOUBLE_EQ(p.decode_idle.RebuildRowMsAt(16), 0.01);
  EXPECT_DOUBLE_EQ(p.decode_idle.RebuildRowMsAt(264), 0.0075);  // interpolated
  KvPolicyOptions o;
  o.phase = Phase::kDecode;
  PageHistory page = ColdPage();
  page.first_position = 0;
  auto in_step_ms = [&] {
    const KvActionCost c = CostOf(ChooseKvAction(page, p, o), KvAction::kRecomputeResidual);
    return p.recompute_residual_ms - c.hidden_ms;  // what the page's rows cost the step
  };
  // The step's context given: the price there, wherever the page sits.
  o.step_context = 16;
  EXPECT_NEAR(in_step_ms(), 0.16, 1e-12);
  o.step_context = 512;
  EXPECT_NEAR(in_step_ms(), 0.08, 1e-12);
  o.step_context = 264;
  EXPECT_NEAR(in_step_ms(), 0.12, 1e-12);
  // Unknown: the page's end, the least context of a step that reads all of it.
  o.step_context = -1;
  EXPECT_NEAR(in_step_ms(), 0.16, 1e-12);
  page.first_position = 496;
  EXPECT_NEAR(in_step_ms(), 0.08, 1e-12);
}

TEST(KvPolicyTest, RecomputeFromTokensPricesThePagesPositionAndItsShareOfTheCall) {
  PageCostProfile p = Gqa();
  p.recompute_tokens_ms = 10;            // the page's own tokens
  p.recompute_tokens_context_ms = 0.01;  // per position before it
  p.recompute_tokens_call_ms = 64;       // a forward call's fixed part
  p.block_tokens = 16;
  p.recompute_batch_tokens = 512;
  PageHistory early = ColdPage();
  early.first_position = 0;
  PageHistory late = ColdPage();
  late.first_position = 4096;
  KvPolicyOptions o;
  o.phase = Phase::kPrefill;
  const double early_ms = CostOf(ChooseKvAction(early, p, o), KvAction::kRecomputeTokens).bring_back_ms;
  const double late_ms = CostOf(ChooseKvAction(late, p, o), KvAction::kRecomputeTokens).bring_back_ms;
  EXPECT_DOUBLE_EQ(early_ms, 10 + 64.0 * 16 / 512);
  EXPECT_DOUBLE_EQ(late_ms, 10 + 0.01 * 4096 + 64.0 * 16 / 512);
  // Alone in its call, a page pays all of it.
  p.recompute_batch_tokens = 0;
  EXPECT_DOUBLE_EQ(RecomputeTokensMs(p, 0), 10 + 64);
  // One token's weight in a forward run: its share of the page's own work plus its attention
  // over the positions before it, without the call's fixed part. A decode token 4096 deep
  // weighs 10/16 + 0.01 * 4096 / 16 = 3.185 ms, five times a token at the start.
  EXPECT_DOUBLE_EQ(RecomputeTokenMs(p, 0), 10.0 / 16);
  EXPECT_DOUBLE_EQ(RecomputeTokenMs(p, 4096), (10 + 0.01 * 4096) / 16);
  p.block_tokens = 0;
  EXPECT_EQ(RecomputeTokenMs(p, 4096), 0.0);  // no page size: no price (the caller splits by tokens)
  // Transfers are latency + bytes / bandwidth, and no bandwidth is no way, not a free one.
  EXPECT_DOUBLE_EQ(TransferMs(2e6, 2.0, 0.5), 0.5 + 1.0);
  EXPECT_TRUE(std::isinf(TransferMs(1, 0, 0)));
}

TEST(KvPolicyTest, SinksAndRecentPagesAreNeverEvicted) {
  KvPolicyOptions o;
  o.quality = KvQuality::kAggressive;
  o.memory_price_ms_per_mib = 1e9;
  const PageCostProfile p = Stranded(Mha());
  PageHistory sink = ColdPage();
  sink.is_sink = true;
  PageHistory recent = ColdPage();
  recent.in_recent_window = true;
  // For both, eviction is still the cheapest on cost: only the rule keeps them.
  for (const auto& [page, why] : {std::pair{sink, "attention sink"}, {recent, "recent window"}}) {
    const KvDecision d = ChooseKvAction(page, p, o);
    EXPECT_EQ(CheapestWith(d, {KvAction::kEvict}), KvAction::kEvict) << why << "\n" << d.Explain();
    EXPECT_NE(d.action, KvAction::kEvict) << why;
    EXPECT_EQ(CostOf(d, KvAction::kEvict).why_not, why);
  }
  // A cold page with no tier and an expensive recompute, under extreme pressure in aggressive
  // mode, is evicted.
  EXPECT_EQ(ChooseKvAction(ColdPage(), p, o).action, KvAction::kEvict);
}

TEST(KvPolicyTest, DiskNeedsADiskTier) {
  PageCostProfile p = Mha();
  EXPECT_TRUE(CostOf(ChooseKvAction(ColdPage(), p, {}), KvAction::kDemoteDisk).allowed);
  p.has_disk_tier = false;
  const KvDecision d = ChooseKvAction(ColdPage(), p, {});
  EXPECT_FALSE(CostOf(d, KvAction::kDemoteDisk).allowed);
  EXPECT_NE(CostOf(d, KvAction::kDemoteDisk).why_not.find("no disk tier"), std::string::npos);
}

// Redis is priced from what its link measured: a page read over a slow link (1 Gbit/s, 0.4 ms
// latency and a tail) costs more than over loopback, and the policy picks the tier whose
// bring-back is cheapest; without a Redis tier demote-redis is refused with the flag named.
TEST(KvPolicyTest, RedisIsPricedFromItsLinkAndNeedsARedisTier) {
  PageCostProfile p = Mha();
  p.has_disk_tier = false;
  p.has_ram_tier = false;
  p.recompute_tokens_ms = 50;  // a page that is dear to recompute: some tier must win
  p.recompute_residual_ms = 50;
  // The page has to leave (keeping it is dear), losslessly.
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.memory_price_ms_per_mib = 1e6;
  const KvDecision none = ChooseKvAction(ColdPage(), p, o);
  EXPECT_FALSE(CostOf(none, KvAction::kDemoteRedis).allowed);
  EXPECT_NE(CostOf(none, KvAction::kDemoteRedis).why_not.find("--kv-tier redis://"),
            std::string::npos);
  p.has_redis_tier = true;
  p.redis_read_gbps = p.redis_write_gbps = 0.124;  // 1 Gbit/s
  p.redis_latency_ms = p.redis_write_latency_ms = 0.4;
  const double link_ms = CostOf(ChooseKvAction(ColdPage(), p, o), KvAction::kDemoteRedis).bring_back_ms;
  EXPECT_NEAR(link_ms, 0.4 + static_cast<double>(p.kv_bytes) / 0.124e6, 1e-9);
  EXPECT_EQ(ChooseKvAction(ColdPage(), p, o).action, KvAction::kDemoteRedis);
  PageCostProfile loopback = p;
  loopback.redis_read_gbps = loopback.redis_write_gbps = 2.0;
  loopback.redis_latency_ms = loopback.redis_write_latency_ms = 0.05;
  EXPECT_LT(CostOf(ChooseKvAction(ColdPage(), loopback, o), KvAction::kDemoteRedis).bring_back_ms,
            link_ms / 5);
  // Beside a disk tier, the cheaper of the two is chosen: the disk here (2 GB/s, 0.1 ms).
  p.has_disk_tier = true;
  EXPECT_EQ(ChooseKvAction(ColdPage(), p, o).action, KvAction::kDemoteDisk);
  // An unmeasured Redis (no bandwidth) is never chosen.
  p.has_disk_tier = false;
  p.redis_read_gbps = 0;
  EXPECT_NE(ChooseKvAction(ColdPage(), p, o).action, KvAction::kDemoteRedis);
}

// P(reuse) is the reuse forecast's: certain for a page its running or preempted reader will
// read again, the survival table's revival probability for an idle one (falling with the pause,
// rising with the page's revivals), never the old constant formula of recency and frequency.
TEST(KvPolicyTest, ReuseProbabilityComesFromTheForecast) {
  KvIdleReuseHistory none;
  KvReuseInput running;
  running.running_reader = true;
  running.reads_left = 40;
  EXPECT_EQ(ReuseProbability(ForecastReuse(running, none)), 1.0);
  // Its last step behind it, the page is an idle one: read again only by a prefix hit, 1/2 by
  // an empty history (Laplace's rule).
  running.reads_left = 0;
  EXPECT_EQ(ReuseProbability(ForecastReuse(running, none)), 0.5);
  KvReuseInput waiting;
  waiting.waiting_reader = true;
  waiting.reads_left = -1;  // unknown: at least one read at the resume
  EXPECT_EQ(ReuseProbability(ForecastReuse(waiting, none)), 1.0);
  // The old formula gave a page just read 0.05 + 0.55 = 0.6, and one read 16 times with an
  // eighth of the attention 0.05 + 0.55 + 0.15 + 0.25 = 1, whether its sequence had steps left
  // or not.
  PageHistory page;
  EXPECT_EQ(ReuseProbability(page), 1.0);  // the default: read at the next step
  page.attention_mass = 0.125;
  page.reuse = ForecastReuse(running, none);
  EXPECT_EQ(ReuseProbability(page), 0.5);

  // Idle pages: ten went idle at step 0; two were read again after 2 steps, none after longer.
  KvIdleReuseHistory h;
  for (int i = 0; i < 10; ++i) h.PageWentIdle(0);
  h.PageRevived(0, 2);
  h.PageRevived(0, 2);
  KvReuseInput idle;
  idle.step = 50;
  double last = 1.0;
  for (int64_t idle_steps : {1, 3, 20, 50}) {
    idle.idle_steps = idle_steps;
    const double p = ReuseProbability(ForecastReuse(idle, h));
    EXPECT_EQ(p, h.RevivalProbability(50, idle_steps, 1, 0)) << idle_steps;
    EXPECT_LE(p, last) << idle_steps;  // a longer pause: never likelier
    last = p;
  }
  idle.idle_steps = 1;
  const double before_any_revival_ended = ReuseProbability(ForecastReuse(idle, h));
  idle.idle_steps = 3;
  EXPECT_LT(ReuseProbability(ForecastReuse(idle, h)), before_any_revival_ended);
  // A page whose own pauses ended in reads (an opening shared by request after request) is
  // likelier than one with none.
  idle.idle_periods = 4;
  const double never = ReuseProbability(ForecastReuse(idle, h));
  idle.revivals = 3;
  EXPECT_GT(ReuseProbability(ForecastReuse(idle, h)), never);
  // Sinks and the recent window are never acted on: certain.
  PageHistory sink;
  sink.reuse = ForecastReuse(idle, h);
  sink.is_sink = true;
  EXPECT_EQ(ReuseProbability(sink), 1.0);
}

// The quality prices are named defaults the engine's flags set: each one reaches the cost terms
// of its preset, and bad values are refused naming the flag.
TEST(KvPolicyTest, QualityPricesAreNamedSetAndValidated) {
  const KvQualityPrices defaults;
  EXPECT_EQ(defaults.MsPerKld(KvQuality::kBalanced), 1e4);
  EXPECT_EQ(defaults.MsPerKld(KvQuality::kAggressive), 1e3);
  EXPECT_EQ(defaults.MsPerEvictedMass(KvQuality::kBalanced), 5000);
  EXPECT_EQ(defaults.MsPerEvictedMass(KvQuality::kAggressive), 200);
  EXPECT_TRUE(defaults.Validate().ok());
  const PageCostProfile p = Stranded(Mha());
  KvPolicyOptions o;
  o.quality = KvQuality::kBalanced;
  const KvDecision d = ChooseKvAction(WarmPage(), p, o);
  EXPECT_DOUBLE_EQ(CostOf(d, KvAction::kCompressInt8).quality_cost_ms, p.int8_kld * 1e4);
  EXPECT_DOUBLE_EQ(CostOf(d, KvAction::kEvict).quality_cost_ms, 0.55 * (0.01 + 0.001) * 5000);
  o.quality_prices.balanced_ms_per_kld = 2e4;
  o.quality_prices.balanced_ms_per_evicted_mass = 100;
  const KvDecision set = ChooseKvAction(WarmPage(), p, o);
  EXPECT_DOUBLE_EQ(CostOf(set, KvAction::kCompressInt8).quality_cost_ms, p.int8_kld * 2e4);
  EXPECT_DOUBLE_EQ(CostOf(set, KvAction::kEvict).quality_cost_ms, 0.55 * (0.01 + 0.001) * 100);
  o.quality = KvQuality::kAggressive;  // aggressive's own prices, untouched
  EXPECT_DOUBLE_EQ(CostOf(ChooseKvAction(WarmPage(), p, o), KvAction::kCompressInt8).quality_cost_ms,
                   p.int8_kld * 1e3);

  KvQualityPrices bad;
  bad.aggressive_ms_per_evicted_mass = -1;
  EXPECT_NE(bad.Validate().message().find("--kv-price-evict-aggressive must be a finite price"),
            std::string::npos);
  bad = {};
  bad.balanced_ms_per_kld = std::numeric_limits<double>::infinity();
  EXPECT_NE(bad.Validate().message().find("--kv-price-kld-balanced"), std::string::npos);
  bad = {};
  bad.aggressive_ms_per_kld = 2e4;  // above balanced's 1e4
  EXPECT_NE(bad.Validate().message().find("--kv-price-kld-aggressive (20000) is above"),
            std::string::npos);
  const std::string line = defaults.Describe();
  for (const char* flag : {"--kv-price-kld-balanced", "--kv-price-kld-aggressive",
                           "--kv-price-evict-balanced", "--kv-price-evict-aggressive"}) {
    EXPECT_NE(line.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(line.find("balanced 5000"), std::string::npos) << line;
}

TEST(KvPolicyTest, ParsesFlags) {
  EXPECT_TRUE(ParseKvPolicy("auto")->automatic);
  EXPECT_EQ(ParseKvPolicy("recompute-residual")->fixed, KvAction::kRecomputeResidual);
  EXPECT_EQ(ParseKvPolicy("demote")->fixed, KvAction::kDemoteRam);
  EXPECT_EQ(ParseKvPolicy("demote-redis")->fixed, KvAction::kDemoteRedis);
  EXPECT_EQ(KvActionName(KvAction::kDemoteRedis), "demote-redis");
  EXPECT_FALSE(ParseKvPolicy("delete").ok());
  EXPECT_NE(ParseKvPolicy("delete").status().message().find("demote-redis"), std::string::npos);
  EXPECT_EQ(*ParseKvQuality("lossless"), KvQuality::kLossless);
  EXPECT_FALSE(ParseKvQuality("best").ok());
}

}  // namespace
}  // namespace kvl
