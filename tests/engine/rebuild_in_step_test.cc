// Pages kept as residual checkpoints are rebuilt inside the decode step that reads them, as extra
// rows of its K and V matmuls (KvLayerRebuild). Lossless: a run whose cold pages are rebuilt at
// every step gives keep-all's greedy tokens and log-probabilities bit for bit, on every weight
// type the engine loads (each has its own matmul kernels, and the int8 GEMM quantizes the
// activations of every row) and at one and two threads (the matmuls split the extra rows among
// the threads differently from the step's own). Every page rebuilt in a decode step is checked
// against the price the policy gave it there (InStepRebuildMeter). Pages recomputed from their
// tokens (a preempted sequence's, at its resume) are rows of the resume's step too, a prefill
// chunk beside the other sequences' decode rows, and as exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "fixed_prices.h"
#include "recorded_output.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

// tiny-test-256: 8 layers x 2 x 128 floats = 8 KiB per token, 128 KiB per 16-token page.
constexpr int64_t kLayers = 8;
constexpr int64_t kPageBytes = 16 * 8 * 1024;
constexpr int32_t kNewTokens = 200;

using Output = testing::RecordedOutput;

struct Outcome {
  Output output;
  EngineMetrics metrics;
};

Outcome Generate(const EngineOptions& o, int32_t prompt_tokens = 90) {
  Outcome run;
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return run;
  Engine& e = **created;
  Request r;
  for (int32_t i = 0; i < prompt_tokens; ++i) r.prompt_ids.push_back(1 + (i * 37 + 11) % 500);
  r.max_new_tokens = kNewTokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.top_logprobs = 5;
  EXPECT_TRUE(e.Submit(r, testing::RecordInto(run.output)).ok());
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
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
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
      testing::SetTiersBesidePool(&o, {"ram:64MiB"});
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

// Every page a decode step rebuilds from checkpoints inside it is counted once per step and
// checked against its price in the step: the marginal price of its rows (the profile's step with
// rebuilt rows), not a rebuild on its own.
TEST(RebuildInStepTest, RebuildsInTheStepAreCheckedAgainstTheirPriceThere) {
  const std::string path = ::testing::TempDir() + "/rebuild-in-step-priced-" +
                           std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test-256"), DType::kF32, 5, path}).ok());
  EngineOptions o = Options(path, 1);
  // A decode step of 0.5 ms, 0.6 ms with 64 rebuilt rows riding in it: 0.025 ms a 16-token page,
  // far below the 1 ms a rebuild on its own costs (FixedStoriesPrices).
  o.cost_profile->decode_idle.Add({0, 0.5, 0.05, 64, 0.6});
  o.kv_budget_bytes = 40 * kPageBytes;
  o.kv_stream_reserve = 0.75;
  o.kv_policy = "recompute-residual";
  testing::SetTiersBesidePool(&o, {"ram:64MiB"});
  o.kv_promote_back = false;
  o.kv_feedback = false;  // the price as the profile gives it, whatever was measured
  // A prompt the pool holds: the pages leave while the sequence decodes, so every page rebuilt
  // is rebuilt in a decode step (a prefill chunk's rebuilds have no calibrated step to subtract).
  const Outcome run = Generate(o, /*prompt_tokens=*/40);
  std::remove(path.c_str());
  const KvActionCounter& in_step = run.metrics.kv_rebuilt_in_step;
  // Every one is counted: each step's pages, at each of its layers.
  ASSERT_GT(in_step.pages_restored, 0);
  EXPECT_EQ(in_step.pages_restored * kLayers, run.metrics.kv_layers_rebuilt);
  // (A step measured faster than its baseline has no relative error: left out of the window.)
  EXPECT_GT(in_step.error.samples, 0);
  EXPECT_LE(in_step.error.samples, in_step.pages_restored);
  const double page_price = in_step.predicted_ms / static_cast<double>(in_step.pages_restored);
  EXPECT_GT(page_price, 0.025 - 1e-9);  // the rows' marginal time, and the checkpoints' read
  EXPECT_LT(page_price, 0.5);           // not the 1 ms of a rebuild on its own
  // Nothing of it is counted as a restore of a page on its own.
  EXPECT_EQ(
      run.metrics.kv_actions[static_cast<size_t>(KvAction::kRecomputeResidual)].pages_restored, 0);
}

// Several requests of staggered lengths under a budget that holds about two: the newest is
// preempted with its pages dropped, and resumes when another finishes, recomputing its pages
// from their tokens in the resume's step beside the sequences still decoding. Their greedy tokens
// and log-probabilities equal keep-all's bit for bit on F32, Q8_0 and Q4_K weights at one and two
// threads: the recompute's rows share the forward run, and its matmuls, with the decode rows.
TEST(RebuildInStepTest, TokensRecomputedBesideDecodeRowsMatchKeepAll) {
  const std::vector<int32_t> lengths = {40, 160, 100, 160};
  auto generate_all = [&](const EngineOptions& o, EngineMetrics* metrics) {
    std::vector<Output> outs(lengths.size());
    auto created = Engine::Create(o);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (!created.ok()) return outs;
    Engine& e = **created;
    for (size_t i = 0; i < lengths.size(); ++i) {
      Request r;
      for (int32_t t = 0; t < 40; ++t) {
        r.prompt_ids.push_back(1 + (t * 37 + 11 * static_cast<int32_t>(i + 1)) % 500);
      }
      r.max_new_tokens = lengths[i];
      r.sampling.temperature = 0;
      r.ignore_eos = true;
      r.top_logprobs = 5;
      EXPECT_TRUE(e.Submit(r, testing::RecordInto(outs[i])).ok());
    }
    e.RunUntilIdle();
    *metrics = e.Metrics();
    return outs;
  };
  for (DType type : {DType::kF32, DType::kQ8_0, DType::kQ4_K}) {
    const std::string path = ::testing::TempDir() + "/recompute-in-step-" +
                             std::to_string(getpid()) + "-" + std::string(DTypeName(type)) + ".gguf";
    ASSERT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test-256"), type, 5, path}).ok());
    for (int threads : {1, 2}) {
      EngineOptions keep_all = Options(path, threads);
      keep_all.max_seqs = 4;
      EngineMetrics keep_all_metrics;
      const std::vector<Output> expected = generate_all(keep_all, &keep_all_metrics);
      ASSERT_EQ(keep_all_metrics.preemptions, 0);
      EngineOptions o = keep_all;
      o.kv_budget_bytes = 24 * kPageBytes;  // 200 tokens are 13 pages: about two sequences
      o.kv_policy = "recompute-tokens";
      EngineMetrics m;
      const std::vector<Output> got = generate_all(o, &m);
      for (size_t i = 0; i < lengths.size(); ++i) {
        ASSERT_EQ(expected[i].tokens.size(), static_cast<size_t>(lengths[i]));
        EXPECT_EQ(got[i], expected[i]) << DTypeName(type) << " threads " << threads << " request " << i;
      }
      // What the comparison is about happened: pages recomputed from their tokens, in steps that
      // also carried other sequences' decode rows.
      EXPECT_GT(m.preemptions, 0) << DTypeName(type);
      EXPECT_GT(m.kv_actions[static_cast<size_t>(KvAction::kRecomputeTokens)].pages_restored, 0)
          << DTypeName(type);
      EXPECT_GT(m.kv_recomputed_pages_beside_decode, 0) << DTypeName(type);
    }
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace kvl
