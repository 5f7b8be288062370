// The one KV budget (kvl/kv_budget.h): a RAM tier is carved from it (ram:SIZE that does not fit is
// an error naming both figures; ram:auto splits it), the default path without a tier keeps the
// pool it had, and a real workload under a small budget with a RAM tier keeps the process's
// memory beyond the weights and the fixed part within the budget, as measured from /proc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "fixed_prices.h"
#include "kvl/engine.h"
#include "kvl/kv_tier.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K at f16 (the default): 5 layers x 2 x 32 halves = 640 bytes a token, 10 KiB a page.
constexpr int64_t kTokenBytes = 640;
constexpr int64_t kBlockTokens = 16;

EngineOptions Options() {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = 512;
  o.max_seqs = 2;
  o.cost_profile = testing::FixedStoriesPrices(/*residual_ms=*/5, /*tokens_ms=*/50);
  return o;
}

// The message of Create's error, which must be INVALID_ARGUMENT (a tier the budget cannot hold).
std::string CreateError(const EngineOptions& o) {
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_FALSE(e.ok()) << "expected an error";
  if (e.ok()) return "";
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  return std::string(e.status().message());
}

TEST(KvBudgetTest, RamAutoIsParsedAsASizeToChoose) {
  StatusOr<TierSpec> spec = ParseTierSpec("ram:auto");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->kind, TierKind::kRam);
  EXPECT_EQ(spec->capacity_bytes, 0);
  spec = ParseTierSpec("ram:AUTO:zstd");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->compress);
  EXPECT_FALSE(ParseTierSpec("ram:automatic").ok());
}

TEST(KvBudgetTest, RamTierLargerThanTheBudgetNamesBoth) {
  EngineOptions o = Options();
  o.kv_budget_bytes = 256 << 10;
  o.kv_tiers = {"ram:1MiB"};
  const std::string error = CreateError(o);
  EXPECT_NE(error.find("1048576"), std::string::npos) << error;
  EXPECT_NE(error.find("262144"), std::string::npos) << error;
  EXPECT_NE(error.find("--kv-budget"), std::string::npos) << error;
}

TEST(KvBudgetTest, RamTierThatLeavesThePoolNoBlockNamesBoth) {
  // The tier alone fits, but not with a block of the pool and its staging beside it.
  EngineOptions o = Options();
  o.kv_budget_bytes = 256 << 10;
  o.kv_tiers = {"ram:" + std::to_string((256 << 10) - 4096)};
  const std::string error = CreateError(o);
  EXPECT_NE(error.find(std::to_string((256 << 10) - 4096)), std::string::npos) << error;
  EXPECT_NE(error.find("262144"), std::string::npos) << error;
}

TEST(KvBudgetTest, RamTierBeyondTheDefaultBudgetNamesBoth) {
  EngineOptions o = Options();
  o.kv_tiers = {"ram:2GiB"};
  const std::string error = CreateError(o);
  EXPECT_NE(error.find("2147483648"), std::string::npos) << error;
  EXPECT_NE(error.find("1073741824"), std::string::npos) << error;
}

TEST(KvBudgetTest, RamTierIsCarvedFromTheBudget) {
  EngineOptions o = Options();
  o.kv_budget_bytes = 2 << 20;
  o.kv_tiers = {"ram:512KiB"};
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineMetrics m = (*e)->Metrics();
  const KvBudgetSplit& s = m.kv_budget_split;
  EXPECT_TRUE(s.given);
  EXPECT_EQ(m.kv_budget_bytes, 2 << 20);
  // The tier holds 512 KiB of pages; the budget pays for them and for its map of them (a few
  // percent of 2 KiB layer pages).
  ASSERT_EQ(m.kv_tiers.size(), 1u);
  EXPECT_EQ(m.kv_tiers[0].capacity_bytes, 512 << 10);
  EXPECT_GT(s.ram_tier_bytes, 512 << 10) << s.Describe();
  EXPECT_LT(s.ram_tier_bytes, (512 << 10) + (512 << 10) / 8) << s.Describe();
  // The pool got the rest: at most the budget less the tier, within a block and the staging's
  // rounding of it.
  EXPECT_LE(s.total(), m.kv_budget_bytes) << s.Describe();
  EXPECT_LE(s.pool_bytes, (2 << 20) - s.ram_tier_bytes) << s.Describe();
  EXPECT_GE(s.pool_bytes + s.staging_bytes,
            (2 << 20) - s.ram_tier_bytes - kBlockTokens * kTokenBytes)
      << s.Describe();
  EXPECT_EQ(m.kv.kv_bytes_total, s.pool_bytes);
}

TEST(KvBudgetTest, RamAutoSplitsTheBudget) {
  EngineOptions o = Options();
  o.kv_budget_bytes = 4 << 20;
  o.kv_tiers = {"ram:auto"};
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineMetrics m = (*e)->Metrics();
  const KvBudgetSplit& s = m.kv_budget_split;
  EXPECT_TRUE(s.ram_tier_auto);
  // Both sides get a real share: the tier at least a quarter, the pool at least what it keeps.
  EXPECT_GE(s.ram_tier_bytes, (4 << 20) / 4) << s.Describe();
  EXPECT_GE(s.pool_bytes, (4 << 20) / 4) << s.Describe();
  EXPECT_LE(s.total(), 4 << 20) << s.Describe();
  EXPECT_GE(s.total(), (4 << 20) - 2 * kBlockTokens * kTokenBytes) << s.Describe();
  ASSERT_EQ(m.kv_tiers.size(), 1u);
  EXPECT_LT(m.kv_tiers[0].capacity_bytes, s.ram_tier_bytes);  // its map is paid for too
  EXPECT_GT(m.kv_tiers[0].capacity_bytes, s.ram_tier_bytes * 9 / 10);
}

TEST(KvBudgetTest, DefaultBudgetWithoutATierIsThePoolAsBefore) {
  // Every sequence's whole context at the default element type (f16), as before the one budget.
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(Options());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineMetrics m = (*e)->Metrics();
  EXPECT_EQ((*e)->options().cache_type_k, "f16");
  EXPECT_EQ((*e)->options().cache_type_v, "f16");
  EXPECT_EQ(m.kv.kv_bytes_total, 2 * 512 * kTokenBytes);
  EXPECT_FALSE(m.kv_budget_split.given);
  EXPECT_EQ(m.kv_budget_split.ram_tier_bytes, 0);
  EXPECT_EQ(m.kv_budget_bytes, m.kv_budget_split.total());
  // With a RAM tier and no --kv-budget, the tier comes out of the default budget too.
  EngineOptions with_tier = Options();
  with_tier.kv_tiers = {"ram:64MiB"};
  e = Engine::Create(with_tier);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineMetrics t = (*e)->Metrics();
  ASSERT_EQ(t.kv_tiers.size(), 1u);
  EXPECT_EQ(t.kv_tiers[0].capacity_bytes, 64 << 20);
  EXPECT_GT(t.kv_budget_split.ram_tier_bytes, 64 << 20);
  EXPECT_EQ(t.kv_budget_bytes, t.kv_budget_split.total());
  EXPECT_LE(t.kv_budget_bytes, int64_t{1} << 30);
}

TEST(KvBudgetTest, TheDraftModelsPoolIsCarvedFromTheBudget) {
  // stories260K drafting for itself: its pool is the target's shape, at f32 (the draft pool's).
  EngineOptions o = Options();
  o.kv_budget_bytes = 2 << 20;
  o.spec = "draft";
  o.draft_model_path = testing::Stories260KPath();
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineMetrics m = (*e)->Metrics();
  const KvBudgetSplit& s = m.kv_budget_split;
  EXPECT_GT(s.draft_bytes, 0) << s.Describe();
  EXPECT_LE(s.draft_bytes, (2 << 20) / 4) << s.Describe();  // at most a quarter of a given budget
  EXPECT_LE(s.pool_bytes + s.staging_bytes, (2 << 20) - s.draft_bytes) << s.Describe();
  EXPECT_LE(s.total(), 2 << 20) << s.Describe();
  EXPECT_GE(m.kv_held_bytes, s.pool_bytes + s.draft_bytes);
  // Without --kv-budget the draft pool is named in the default budget too.
  o.kv_budget_bytes = 0;
  e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const EngineMetrics d = (*e)->Metrics();
  EXPECT_GT(d.kv_budget_split.draft_bytes, 0);
  EXPECT_EQ(d.kv_budget_bytes, d.kv_budget_split.total());
  EXPECT_EQ(d.kv.kv_bytes_total, 2 * 512 * kTokenBytes);  // the target's pool as without a draft
}

// Distinct prompts of about 330 tokens: each fills 20 pages that the prefix cache keeps and the KV
// store files in the RAM tier when the pool needs their blocks.
std::vector<int32_t> Prompt(Engine& e, int i) {
  std::string text = "Story " + std::to_string(i) + ".";
  for (int round = 0; round < 6; ++round) {
    for (const std::string& p : testing::StoryPrompts()) {
      text += " " + p + (round % 2 == i % 2 ? "," : ".") + std::to_string(i * 7 + round);
    }
  }
  return e.tokenizer().Encode(text, /*add_bos=*/true);
}

TEST(KvBudgetTest, ProcessStaysWithinTheBudgetUnderAWorkloadWithARamTier) {
  EngineOptions o = Options();
  o.max_seqs = 4;
  o.kv_budget_bytes = 8 << 20;
  o.kv_tiers = {"ram:auto"};
  StatusOr<std::unique_ptr<Engine>> created = Engine::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Engine& e = **created;
  const EngineMetrics start = e.Metrics();
  ASSERT_GT(start.rss_minus_weights_bytes, 0) << "no /proc/self/status here";
  ASSERT_GT(start.kv_fixed_bytes, 0);
  const int64_t budget = start.kv_budget_bytes;
  ASSERT_EQ(budget, 8 << 20);

  // Requests in waves of four; the process's memory sampled as tokens arrive.
  int64_t peak_own = 0, peak_held = 0, peak_ram = 0, samples = 0, events = 0;
  auto sample = [&] {
    const EngineMetrics m = e.Metrics();
    peak_own = std::max(peak_own, m.rss_minus_weights_bytes - m.kv_fixed_bytes);
    peak_held = std::max(peak_held, m.kv_held_bytes);
    for (const KvTierMetrics& t : m.kv_tiers) peak_ram = std::max(peak_ram, t.bytes_used);
    ++samples;
  };
  constexpr int kRequests = 64;  // 64 x 21 pages of 10 KiB: 13 MiB of KV through 8
  int finished = 0;
  for (int wave = 0; wave < kRequests / 4; ++wave) {
    for (int i = wave * 4; i < wave * 4 + 4; ++i) {
      Request r;
      r.prompt_ids = Prompt(e, i);
      r.max_new_tokens = 24;
      r.ignore_eos = true;
      r.sampling.temperature = 0;
      const StatusOr<RequestId> id = e.Submit(r, [&](const TokenEvent& ev) {
        EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
        if (++events % 16 == 0) sample();
        if (ev.finished) ++finished;
      });
      ASSERT_TRUE(id.ok()) << id.status().ToString();
    }
    e.RunUntilIdle();
    sample();
  }
  EXPECT_EQ(finished, kRequests);
  const EngineMetrics end = e.Metrics();
  const KvBudgetSplit& s = end.kv_budget_split;
  // The workload really filled the budget: the RAM tier held most of its share, and the KV held
  // reached most of the budget (else the bound below would prove nothing).
  EXPECT_GE(peak_ram, s.ram_tier_bytes / 2) << s.Describe();
  EXPECT_GE(peak_held, budget * 3 / 4) << s.Describe();
  EXPECT_LE(peak_held, budget) << s.Describe();
  // The bound: RSS - weights - fixed <= budget + 5%.
  EXPECT_LE(peak_own, budget + budget / 20)
      << "RSS less the weights less the fixed part peaked at " << peak_own << " bytes against "
      << "a budget of " << budget << " (fixed " << end.kv_fixed_bytes << "; " << s.Describe()
      << "; " << samples << " samples)";
  EXPECT_GE(samples, 50);
  std::printf("budget %lld, fixed %lld, peak RSS - weights - fixed %lld, peak KV held %lld, peak "
              "RAM tier %lld; %s\n",
              static_cast<long long>(budget), static_cast<long long>(end.kv_fixed_bytes),
              static_cast<long long>(peak_own), static_cast<long long>(peak_held),
              static_cast<long long>(peak_ram), s.Describe().c_str());
  RecordProperty("peak_rss_minus_weights_minus_fixed", std::to_string(peak_own));
  RecordProperty("budget", std::to_string(budget));
  RecordProperty("fixed", std::to_string(end.kv_fixed_bytes));
}

}  // namespace
}  // namespace kvl
