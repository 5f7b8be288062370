#include "kvl/kv_policy.h"

#include <gtest/gtest.h>

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

PageHistory ColdPage() {
  PageHistory h;
  h.first_position = 64;
  h.steps_since_access = 200;
  h.accesses = 1;
  h.attention_mass = 0.001;
  return h;
}

TEST(KvPolicyTest, WithoutMemoryPressureKeepWins) {
  const KvDecision d = ChooseKvAction(ColdPage(), Mha(), {});
  EXPECT_EQ(d.action, KvAction::kKeep);
}

TEST(KvPolicyTest, LosslessNeverCompressesOrEvicts) {
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.memory_price_ms_per_mib = 1e6;  // extreme pressure
  for (const PageCostProfile& p : {Mha(), Gqa()}) {
    const KvDecision d = ChooseKvAction(ColdPage(), p, o);
    EXPECT_TRUE(IsLossless(d.action)) << KvActionName(d.action);
    EXPECT_FALSE(d.costs[static_cast<size_t>(KvAction::kEvict)].allowed);
    EXPECT_FALSE(d.costs[static_cast<size_t>(KvAction::kCompressInt8)].allowed);
    EXPECT_NE(d.Explain().find("not allowed: lossy"), std::string::npos);
  }
}

TEST(KvPolicyTest, ResidualRecomputeDependsOnTheModelsBytes) {
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.memory_price_ms_per_mib = 50;
  o.phase = Phase::kDecode;
  // A page likely to be read again soon, so bringing it back matters.
  PageHistory warm = ColdPage();
  warm.steps_since_access = 4;
  // MHA: the checkpoint is half the K+V and cheap to rebuild -> recompute from residuals.
  const KvDecision mha = ChooseKvAction(warm, Mha(), o);
  EXPECT_EQ(mha.action, KvAction::kRecomputeResidual) << mha.Explain();
  // GQA: the checkpoint is 4x the K+V it stands for: moving K+V itself is cheaper.
  const KvDecision gqa = ChooseKvAction(warm, Gqa(), o);
  EXPECT_EQ(gqa.action, KvAction::kDemoteRam) << gqa.Explain();
  // A page nobody is likely to read again is dropped losslessly: nothing to pay now.
  const KvAction cold = ChooseKvAction(ColdPage(), Gqa(), o).action;
  EXPECT_TRUE(cold == KvAction::kRecomputeTokens || cold == KvAction::kRecomputeResidual ||
              cold == KvAction::kDemoteRam)
      << KvActionName(cold);
}

TEST(KvPolicyTest, PrefillPricesRecomputeHigherThanDecode) {
  KvPolicyOptions o;
  o.memory_price_ms_per_mib = 50;
  PageHistory hot = ColdPage();
  hot.steps_since_access = 0;
  o.phase = Phase::kDecode;
  const double decode = ChooseKvAction(hot, Mha(), o).costs[5].bring_back_ms;
  o.phase = Phase::kPrefill;
  const double prefill = ChooseKvAction(hot, Mha(), o).costs[5].bring_back_ms;
  EXPECT_LT(decode, prefill);
}

TEST(KvPolicyTest, SinksAndRecentPagesAreNeverEvicted) {
  KvPolicyOptions o;
  o.quality = KvQuality::kAggressive;
  o.memory_price_ms_per_mib = 1e9;
  PageCostProfile p = Mha();
  p.has_disk_tier = false;
  p.has_ram_tier = false;
  p.recompute_tokens_ms = 500;  // a long context behind the page makes re-running it expensive
  PageHistory sink = ColdPage();
  sink.is_sink = true;
  PageHistory recent = ColdPage();
  recent.in_recent_window = true;
  EXPECT_NE(ChooseKvAction(sink, p, o).action, KvAction::kEvict);
  EXPECT_NE(ChooseKvAction(recent, p, o).action, KvAction::kEvict);
  // A cold page with no tier and an expensive recompute, under extreme pressure in aggressive
  // mode, is evicted.
  EXPECT_EQ(ChooseKvAction(ColdPage(), p, o).action, KvAction::kEvict);
}

TEST(KvPolicyTest, DiskNeedsADiskTier) {
  PageCostProfile p = Mha();
  p.has_disk_tier = false;
  const KvDecision d = ChooseKvAction(ColdPage(), p, {});
  EXPECT_FALSE(d.costs[static_cast<size_t>(KvAction::kDemoteDisk)].allowed);
}

TEST(KvPolicyTest, ReuseProbabilityFallsWithAgeAndRisesWithUse) {
  PageHistory h = ColdPage();
  double last = 2.0;
  for (int64_t age : {0, 8, 32, 128, 1024}) {
    h.steps_since_access = age;
    const double p = ReuseProbability(h);
    EXPECT_LT(p, last);
    EXPECT_GE(p, 0.0);
    last = p;
  }
  PageHistory used = ColdPage();
  used.accesses = 50;
  used.attention_mass = 0.2;
  EXPECT_GT(ReuseProbability(used), ReuseProbability(ColdPage()));
}

TEST(KvPolicyTest, ParsesFlags) {
  EXPECT_TRUE(ParseKvPolicy("auto")->automatic);
  EXPECT_EQ(ParseKvPolicy("recompute-residual")->fixed, KvAction::kRecomputeResidual);
  EXPECT_EQ(ParseKvPolicy("demote")->fixed, KvAction::kDemoteRam);
  EXPECT_FALSE(ParseKvPolicy("delete").ok());
  EXPECT_EQ(*ParseKvQuality("lossless"), KvQuality::kLossless);
  EXPECT_FALSE(ParseKvQuality("best").ok());
}

}  // namespace
}  // namespace kvl
