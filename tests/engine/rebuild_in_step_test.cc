// Pages kept as residual checkpoints are rebuilt inside the decode step that reads them, as extra
// rows of its K and V matmuls (KvLayerRebuild). Lossless: a run whose cold pages are rebuilt at
// every step gives keep-all's greedy tokens and log-probabilities bit for bit, on every weight
// type the engine loads (each has its own matmul kernels, and the int8 GEMM quantizes the
// activations of every row) and at one and two threads (the matmuls split the extra rows among
// the threads differently from the step's own).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "fixed_prices.h"
#include "kvl/engine.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

// tiny-test-256: 8 layers x 2 x 128 floats = 8 KiB per token, 128 KiB per 16-token page.
constexpr int64_t kLayers = 8;
constexpr int64_t kPageBytes = 16 * 8 * 1024;
constexpr int32_t kNewTokens = 200;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // per token: its own, then the top 5's
  bool operator==(const Output&) const = default;
};

struct Outcome {
  Output output;
  EngineMetrics metrics;
};

Outcome Generate(const EngineOptions& o) {
  Outcome run;
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return run;
  Engine& e = **created;
  Request r;
  for (int32_t i = 0; i < 90; ++i) r.prompt_ids.push_back(1 + (i * 37 + 11) % 500);
  r.max_new_tokens = kNewTokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.top_logprobs = 5;
  Output& out = run.output;
  EXPECT_TRUE(e.Submit(r, [&out](const TokenEvent& ev) {
                 EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                 if (ev.token < 0) return;
                 out.tokens.push_back(ev.token);
                 out.logprobs.push_back(ev.logprob);
                 for (const TokenLogprob& t : ev.top_logprobs) out.logprobs.push_back(t.logprob);
               }).ok());
  e.RunUntilIdle();
  run.metrics = e.Metrics();
  return run;
}

EngineOptions Options(const std::string& model, int threads) {
  EngineOptions o;
  o.model_path = model;
  o.num_threads = threads;
  o.context_length = 512;
  o.max_seqs = 1;
  o.prefix_cache = false;
  o.cost_profile = testing::FixedStoriesPrices();
  o.cost_profile->model.layers = kLayers;
  return o;
}

TEST(RebuildInStepTest, EveryWeightTypeAndThreadCountMatchesKeepAll) {
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                     DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::string path = ::testing::TempDir() + "/rebuild-in-step-" + std::to_string(getpid()) +
                             "-" + std::string(DTypeName(type)) + ".gguf";
    ASSERT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test-256"), type, 5, path}).ok());
    for (int threads : {1, 2}) {
      const Outcome expected = Generate(Options(path, threads));
      ASSERT_EQ(expected.output.tokens.size(), static_cast<size_t>(kNewTokens));
      EngineOptions o = Options(path, threads);
      o.kv_budget_bytes = 40 * kPageBytes;
      o.kv_stream_reserve = 0.75;  // a pool of about ten pages for about nineteen
      o.kv_policy = "recompute-residual";
      o.kv_tiers = {"ram:64MiB"};
      o.kv_promote_back = false;  // the pages stay checkpoints: every step rebuilds them
      const Outcome run = Generate(o);
      EXPECT_EQ(run.output, expected.output) << DTypeName(type) << " threads " << threads;
      // The rebuilds the comparison is about really happened, at many steps.
      EXPECT_GT(run.metrics.kv_actions[static_cast<size_t>(KvAction::kRecomputeResidual)].pages, 4)
          << DTypeName(type) << " threads " << threads;
      EXPECT_GT(run.metrics.kv_layers_rebuilt, 100 * kLayers) << DTypeName(type);
    }
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace kvl
