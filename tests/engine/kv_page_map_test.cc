// The engine's page maps (EngineMetrics::kv_sequences / kv_sequences_ended), what kvl serve's
// KV view draws: a running request's pages by block index, each where the pager put it, one per
// block of computed tokens; a request that ended keeps its last map, the last 16 of them.
#include <gtest/gtest.h>

#include <algorithm>

#include "fixed_prices.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;

EngineOptions Options(int64_t budget_pages) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = 512;
  o.max_seqs = 2;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  testing::SetTiersBesidePool(&o, {"ram:16MiB"});
  o.kv_policy = "demote";
  o.cost_profile = testing::FixedStoriesPrices();
  return o;
}

Request Greedy(const std::string& prompt, int32_t n) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  return r;
}

// A reply of 16 pages on a pool of fewer: pages go to the RAM tier while it runs, and the map
// says which, at every step.
TEST(KvPageMapTest, FollowsARunningRequestsPagesIntoTheTier) {
  auto engine = Engine::Create(Options(12));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  std::vector<KvSequencePageMap> seen;  // the map at each token, as of the step before it
  StatusOr<RequestId> id =
      e.Submit(Greedy(testing::StoryPrompts()[0], 240), [&](const TokenEvent& ev) {
        const EngineMetrics m = e.Metrics();
        if (!ev.finished && m.kv_sequences.size() == 1) {
          seen.push_back(m.kv_sequences[0]);
        }
      });
  ASSERT_TRUE(id.ok());
  e.RunUntilIdle();
  ASSERT_GT(seen.size(), 200u);
  int64_t max_in_tier = 0;
  for (const KvSequencePageMap& map : seen) {
    EXPECT_EQ(map.request, *id);
    EXPECT_GT(map.prompt_tokens, 0);
    if (map.tokens <= map.prompt_tokens) continue;  // the prompt's first step: nothing computed
    // In decode, every token but the last sampled one is computed: one page a 16 tokens.
    EXPECT_EQ(static_cast<int64_t>(map.pages.size()), (map.tokens - 1 + 15) / 16) << map.tokens;
    max_in_tier = std::max<int64_t>(
        max_in_tier, std::count(map.pages.begin(), map.pages.end(), KvPageLocation::kRamTier));
    // The newest page, being written, is always in the pool.
    EXPECT_EQ(map.pages.back(), KvPageLocation::kPool);
  }
  EXPECT_GT(max_in_tier, 0) << "no page went to the RAM tier";
  const EngineMetrics m = e.Metrics();
  EXPECT_GT(m.kv_actions[static_cast<size_t>(KvAction::kDemoteRam)].pages, 0);
  EXPECT_TRUE(m.kv_sequences.empty());
  ASSERT_EQ(m.kv_sequences_ended.size(), 1u);
  EXPECT_EQ(m.kv_sequences_ended[0].request, *id);
  EXPECT_EQ(m.kv_sequences_ended[0].pages, seen.back().pages);
  EXPECT_EQ(KvPageLocationName(KvPageLocation::kRamTier), "ram");
}

// The ended maps are the last kKvEndedPageMaps requests', oldest first.
TEST(KvPageMapTest, KeepsTheLastEndedRequestsMaps) {
  auto engine = Engine::Create(Options(64));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  std::vector<RequestId> ids;
  for (int i = 0; i < kKvEndedPageMaps + 4; ++i) {
    StatusOr<RequestId> id = e.Submit(Greedy(testing::StoryPrompts()[0], 8 + i), {});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    e.RunUntilIdle();
  }
  const EngineMetrics m = e.Metrics();
  ASSERT_EQ(m.kv_sequences_ended.size(), static_cast<size_t>(kKvEndedPageMaps));
  for (int i = 0; i < kKvEndedPageMaps; ++i) {
    const KvSequencePageMap& map = m.kv_sequences_ended[static_cast<size_t>(i)];
    EXPECT_EQ(map.request, ids[static_cast<size_t>(i + 4)]);
    EXPECT_EQ(map.tokens, map.prompt_tokens + 8 + i + 4 - 1);  // all but the last token sampled
    EXPECT_EQ(static_cast<int64_t>(map.pages.size()), (map.tokens - 1 + 15) / 16);
  }
}

}  // namespace
}  // namespace kvl
