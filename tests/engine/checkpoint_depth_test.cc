// Partial-depth residual checkpoints (--kv-checkpoint-every S): pages kept as checkpoints of every
// S-th layer, the layers between rebuilt by running them. Lossless: the greedy tokens and their
// log-probabilities equal keep-all's bit for bit, for pages of running sequences (rebuilt at every
// step) and of preempted ones (rebuilt at resume).
#include <gtest/gtest.h>
#include <unistd.h>

#include "fixed_prices.h"
#include "recorded_output.h"
#include "kvl/checkpoint_depth.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kLayers = 5;
constexpr int64_t kPageBytes = 16 * 1280;

EngineOptions Options(int32_t max_seqs, int64_t budget_pages, double stream_reserve) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;  // see long_conversation_test.cc: a 2-thread pool spins on a busy machine
  o.context_length = 512;
  o.max_seqs = max_seqs;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.kv_stream_reserve = stream_reserve;
  o.prefix_cache = false;  // resumed pages come back from their checkpoints, not the prefix cache
  o.cost_profile = testing::FixedStoriesPrices();
  return o;
}

using Output = testing::RecordedOutput;

struct Outcome {
  std::vector<Output> outputs;
  EngineMetrics metrics;
};

Outcome RunPrompts(const EngineOptions& o, size_t num_prompts, int32_t new_tokens) {
  Outcome run;
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return run;
  Engine& e = **created;
  run.outputs.resize(num_prompts);
  for (size_t i = 0; i < num_prompts; ++i) {
    Request r;
    r.prompt = testing::StoryPrompts()[i];
    r.max_new_tokens = new_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.top_logprobs = 5;
    EXPECT_TRUE(e.Submit(r, testing::RecordInto(run.outputs[i])).ok());
  }
  e.RunUntilIdle();
  run.metrics = e.Metrics();
  return run;
}

int64_t Pages(const EngineMetrics& m, KvAction a) { return m.kv_actions[static_cast<size_t>(a)].pages; }

// One conversation far longer than the pool: its cold pages live as checkpoints and are rebuilt
// at every step, the layers without a checkpoint by running the layer before for the page.
TEST(CheckpointDepthTest, RunningPagesMatchKeepAllAtEveryStride) {
  constexpr int32_t kNewTokens = 440;  // with the prompt, about 29 pages
  EngineOptions keep = Options(1, 64, 0.25);
  keep.kv_budget_bytes = 0;  // room for everything
  const Outcome expected = RunPrompts(keep, 1, kNewTokens);
  ASSERT_EQ(expected.outputs[0].tokens.size(), static_cast<size_t>(kNewTokens));
  ASSERT_EQ(expected.outputs[0].logprobs.size(), static_cast<size_t>(6 * kNewTokens));
  for (int64_t every : std::vector<int64_t>{1, 2, 4, kLayers}) {
    EngineOptions o = Options(1, 40, 0.75);
    o.kv_policy = "recompute-residual";
    testing::SetTiersBesidePool(&o, {"ram:64MiB"});
    o.kv_checkpoint_every = every;
    const Outcome run = RunPrompts(o, 1, kNewTokens);
    const EngineMetrics& m = run.metrics;
    EXPECT_EQ(m.kv_checkpoint_every, every);
    EXPECT_EQ(run.outputs, expected.outputs) << "every " << every;
    EXPECT_GT(Pages(m, KvAction::kRecomputeResidual), 15) << "every " << every;
    EXPECT_GT(m.kv_layers_rebuilt, 0) << "every " << every;
    // Every layer of a page is rebuilt; those without a checkpoint are run first.
    const int64_t kept = CheckpointLayersKept(kLayers, every);
    EXPECT_EQ(m.kv_layers_advanced * kLayers, m.kv_layers_rebuilt * (kLayers - kept))
        << "every " << every;
    EXPECT_LE(m.kv_resident_bytes_peak, o.kv_budget_bytes) << "every " << every;
  }
}

// Half and block-quantized cache types: the layers run between checkpoints read the rebuilt rows
// narrowed or quantized exactly as the forward pass stored and read them.
TEST(CheckpointDepthTest, NarrowCacheTypesMatchKeepAll) {
  constexpr int32_t kNewTokens = 300;
  for (const char* type : {"f16", "q8_0"}) {
    EngineOptions keep = Options(1, 0, 0.25);
    keep.cache_type_k = keep.cache_type_v = type;
    const Outcome expected = RunPrompts(keep, 1, kNewTokens);
    EngineOptions o = Options(1, 24, 0.75);
    o.cache_type_k = o.cache_type_v = type;
    o.kv_policy = "recompute-residual";
    testing::SetTiersBesidePool(&o, {"ram:64MiB"});
    o.kv_checkpoint_every = 2;
    const Outcome run = RunPrompts(o, 1, kNewTokens);
    EXPECT_EQ(run.outputs, expected.outputs) << type;
    EXPECT_GT(run.metrics.kv_layers_advanced, 0) << type;
  }
}

// Eight requests under a budget that holds about three: preempted sequences' pages are kept as
// checkpoints every S layers and rebuilt into fresh blocks at resume, in page order.
TEST(CheckpointDepthTest, PreemptedPagesMatchKeepAll) {
  constexpr int32_t kNewTokens = 200;
  EngineOptions keep = Options(8, 0, 0.25);
  const Outcome expected = RunPrompts(keep, 8, kNewTokens);
  EXPECT_EQ(expected.metrics.preemptions, 0);
  for (int64_t every : std::vector<int64_t>{2, kLayers}) {
    EngineOptions o = Options(8, 40, 0.25);
    o.kv_policy = "recompute-residual";
    testing::SetTiersBesidePool(&o, {"ram:64MiB"});
    o.kv_checkpoint_every = every;
    const Outcome run = RunPrompts(o, 8, kNewTokens);
    const EngineMetrics& m = run.metrics;
    EXPECT_EQ(run.outputs, expected.outputs) << "every " << every;
    EXPECT_GT(m.preemptions, 0) << "every " << every;
    EXPECT_GT(m.kv_actions[static_cast<size_t>(KvAction::kRecomputeResidual)].pages_restored, 0)
        << "every " << every;
    EXPECT_EQ(m.kv.blocks_used, 0) << "every " << every;
  }
}

// Fewer checkpoint layers make a block smaller, so the same budget holds more of them.
TEST(CheckpointDepthTest, SparserCheckpointsLeaveMoreBlocksInTheBudget) {
  int64_t blocks_before = 0;
  for (int64_t every : std::vector<int64_t>{1, 2, kLayers}) {
    EngineOptions o = Options(1, 40, 0.75);
    o.kv_policy = "recompute-residual";
    testing::SetTiersBesidePool(&o, {"ram:64MiB"});
    o.kv_checkpoint_every = every;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const int64_t blocks = (*e)->Metrics().kv.blocks_total;
    EXPECT_GT(blocks, blocks_before) << "every " << every;
    blocks_before = blocks;
  }
}

// auto: the cost model's stride. Where running a layer costs nothing beyond projecting its K/V,
// every layer skipped is memory saved for free (s = layers); where it costs ten times as much,
// keeping every layer wins (s = 1).
TEST(CheckpointDepthTest, AutoTakesTheCostModelsStride) {
  for (const auto& [tokens_ms, expected] :
       std::vector<std::pair<double, int64_t>>{{1.0, kLayers}, {10.0, 1}}) {
    EngineOptions o = Options(1, 40, 0.75);
    o.kv_policy = "recompute-residual";
    testing::SetTiersBesidePool(&o, {"ram:64MiB"});
    o.kv_checkpoint_every = 0;
    o.cost_profile->recompute_from_tokens.token_layer_ms = tokens_ms / (16 * kLayers);
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ((*e)->Metrics().kv_checkpoint_every, expected) << tokens_ms;
  }
}

TEST(CheckpointDepthTest, StridesOutsideTheModelAreClearErrors) {
  for (int64_t every : {int64_t{-1}, kLayers + 1, kMaxCheckpointEvery + 1}) {
    EngineOptions o = Options(1, 40, 0.75);
    o.kv_policy = "recompute-residual";
    testing::SetTiersBesidePool(&o, {"ram:64MiB"});
    o.kv_checkpoint_every = every;
    const auto e = Engine::Create(o);
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << every;
    EXPECT_NE(e.status().message().find("--kv-checkpoint-every"), std::string::npos) << every;
  }
}

}  // namespace
}  // namespace kvl
