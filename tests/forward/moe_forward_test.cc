// The Mixture-of-Experts FFN (src/forward/moe_ffn.h) through the whole forward pass, on kvl
// synth's small MoE shapes:
//  - batch invariance: a token's logits are bit-identical whether it ran in a prefill, in chunks,
//    alone in decode, or beside another sequence's tokens (every ISA, 1 and 2 threads);
//  - a decode step runs top-k experts per layer, and never reads the others: with any one expert
//    poisoned with NaN, the step's logits are bit-identical unless the token chose that expert
//    (then NaN), and exactly top-k experts per layer turn them NaN;
//  - steady decode allocates nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <unistd.h>

#include "alloc_counter.h"
#include "forward/forward_harness.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

std::string WriteShape(const std::string& shape, const std::string& type) {
  SynthOptions o;
  o.shape = FindModelShape(shape).value();
  EXPECT_TRUE(ParseSynthType(type, &o));
  o.seed = 11;
  o.output_path = (std::filesystem::temp_directory_path() /
                   ("kvl-moe-" + shape + "-" + type + "-" + std::to_string(::getpid()) + ".gguf"))
                      .string();
  Status written = WriteSyntheticModel(o);
  EXPECT_TRUE(written.ok()) << written.ToString();
  return o.output_path;
}

// Removes the file when the test ends.
struct TempModel {
  TempModel(const std::string& shape, const std::string& type) : path(WriteShape(shape, type)) {}
  ~TempModel() { std::filesystem::remove(path); }
  std::string path;
};

void ExpectSameLogits(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(0, std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)))
        << what << ": position " << t;
  }
}

TEST(MoeForwardTest, PrefillChunksAndDecodeAreBitIdentical) {
  for (const char* type : {"f32", "q8_0", "q4_k"}) {
    for (const char* shape : {"test-qwen3moe", "test-mixtral"}) {
      TempModel file(shape, type);
      for (ops::Isa isa : ops::RunnableIsas()) {
        for (int threads : {1, 2}) {
          Harness h(file.path, isa, threads, 64);
          const std::vector<int32_t> ids = SomeTokens(40, h.model->config().vocab_size);
          const std::string what = std::string(shape) + " " + type + " " +
                                   std::string(ops::IsaName(isa)) + " threads " +
                                   std::to_string(threads);
          const auto decoded = h.AllLogits(ids, 1);
          ExpectSameLogits(h.AllLogits(ids, 40), decoded, what + " prefill");
          ExpectSameLogits(h.AllLogits(ids, 7), decoded, what + " chunks of 7");
        }
      }
    }
  }
}

// Two sequences' tokens in one batch (so the experts' GEMMs hold rows of both) give each the
// logits it gets alone.
TEST(MoeForwardTest, ATokensLogitsDoNotDependOnItsBatchmates) {
  TempModel file("test-qwen3moe", "f32");
  Harness h(file.path, ops::BestIsa(), 2, 64);
  const int64_t vocab = h.model->config().vocab_size;
  const std::vector<int32_t> a = SomeTokens(12, vocab);
  std::vector<int32_t> b = a;
  for (int32_t& id : b) id = static_cast<int32_t>((id * 31 + 5) % vocab);
  const auto alone_a = h.AllLogits(a, 12, 0);
  const auto alone_b = h.AllLogits(b, 12, 1);
  TokenBatch batch;
  for (size_t i = 0; i < a.size(); ++i) {
    batch.Add(a[i], static_cast<int64_t>(i), 0, true);
    batch.Add(b[i], static_cast<int64_t>(i), 1, true);
  }
  h.forward.Run(batch, *h.kv);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(h.forward.logits(static_cast<int64_t>(2 * i)), alone_a[i].data(),
                             sizeof(float) * static_cast<size_t>(vocab))) << "a, position " << i;
    ASSERT_EQ(0, std::memcmp(h.forward.logits(static_cast<int64_t>(2 * i + 1)), alone_b[i].data(),
                             sizeof(float) * static_cast<size_t>(vocab))) << "b, position " << i;
  }
}

TEST(MoeForwardTest, DecodeStepRunsTopKExpertsPerLayer) {
  TempModel file("test-qwen3moe", "f32");
  Harness h(file.path, ops::BestIsa(), 2, 64);
  const ModelConfig& c = h.model->config();
  const std::vector<int32_t> ids = SomeTokens(33, c.vocab_size);
  EXPECT_EQ(h.forward.expert_run_totals().runs, 0);
  // A prefill of 32 tokens: every token's top-3 rows, grouped into at most 8 GEMMs a layer.
  h.AllLogits(std::vector<int32_t>(ids.begin(), ids.end() - 1), 32);
  const ExpertRunTotals prefill = h.forward.expert_run_totals();
  EXPECT_EQ(prefill.rows, c.num_layers * 32 * c.moe.num_experts_used);
  EXPECT_LE(prefill.runs, c.num_layers * c.moe.num_experts);
  std::printf("prefill of 32 tokens: %lld expert GEMMs over %lld rows in %lld layers\n",
              static_cast<long long>(prefill.runs), static_cast<long long>(prefill.rows),
              static_cast<long long>(c.num_layers));
  // One decode step: top-k experts, one row each, per layer.
  TokenBatch step;
  step.Add(ids.back(), 32, 0, true);
  h.forward.Run(step, *h.kv);
  const ExpertRunTotals after = h.forward.expert_run_totals();
  EXPECT_EQ(after.runs - prefill.runs, c.num_layers * c.moe.num_experts_used);
  EXPECT_EQ(after.rows - prefill.rows, c.num_layers * c.moe.num_experts_used);
}

// Logits of one decode step (token `id` at position 0) of a model whose bytes are `bytes`.
std::vector<float> StepLogits(const std::vector<uint8_t>& bytes, int32_t id) {
  std::unique_ptr<Model> model = std::move(
      Model::FromGguf(std::move(GgufFile::FromBuffer(bytes.data(), bytes.size()).value())).value());
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  ops::OpsContext ops(ops::BestIsa(), &pool);
  std::unique_ptr<ContiguousKvCache> kv =
      std::move(ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, 16).value());
  Forward forward(*model, ops, ForwardOptions{4, 4, 16});
  TokenBatch batch;
  batch.Add(id, 0, 0, true);
  forward.Run(batch, *kv);
  return std::vector<float>(forward.logits(0), forward.logits(0) + c.vocab_size);
}

// The weights of experts a decode step did not choose are never read: each expert in turn is
// poisoned with NaN (its gate, up and down matrices); the step's logits stay bit-identical unless
// the token chose it, and exactly top-k experts per layer poison them.
TEST(MoeForwardTest, DecodeNeverReadsAnExpertItDidNotChoose) {
  TempModel file("test-mixtral", "f32");
  std::ifstream in(file.path, std::ios::binary);
  const std::vector<uint8_t> clean((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::unique_ptr<GgufFile> probe = std::move(GgufFile::FromBuffer(clean.data(), clean.size()).value());
  const std::unique_ptr<Model> model = std::move(Model::FromGguf(std::move(
      GgufFile::FromBuffer(clean.data(), clean.size()).value())).value());
  const ModelConfig& c = model->config();
  const int32_t id = 77;
  const std::vector<float> reference = StepLogits(clean, id);
  for (float v : reference) ASSERT_TRUE(std::isfinite(v));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    int poisoned_steps = 0;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      std::vector<uint8_t> bytes = clean;
      for (const char* kind : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
        const GgufTensorInfo* t = probe->FindTensor("blk." + std::to_string(l) + "." + kind + ".weight");
        ASSERT_NE(t, nullptr);
        const size_t expert_bytes = static_cast<size_t>(t->num_bytes / c.moe.num_experts);
        float* f = reinterpret_cast<float*>(bytes.data() + (t->data - probe->data()) +
                                            static_cast<size_t>(e) * expert_bytes);
        std::fill(f, f + expert_bytes / sizeof(float), std::numeric_limits<float>::quiet_NaN());
      }
      const std::vector<float> logits = StepLogits(bytes, id);
      const bool same = std::memcmp(logits.data(), reference.data(), logits.size() * sizeof(float)) == 0;
      const bool all_nan = std::all_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); });
      EXPECT_TRUE(same || all_nan) << "layer " << l << " expert " << e;
      poisoned_steps += all_nan ? 1 : 0;
    }
    EXPECT_EQ(poisoned_steps, c.moe.num_experts_used) << "layer " << l;
  }
}

TEST(MoeForwardTest, SteadyDecodeDoesNotAllocate) {
  TempModel file("test-qwen3moe", "q8_0");
  Harness h(file.path, ops::BestIsa(), 2, 8);
  const int64_t vocab = h.model->config().vocab_size;
  TokenBatch batch;
  batch.tokens.reserve(8);
  batch.positions.reserve(8);
  batch.seq_ids.reserve(8);
  batch.want_logits.reserve(8);
  batch.window_rebuild.reserve(8);
  int32_t next[2] = {5, 9};
  auto step = [&](int64_t pos) {
    batch.Clear();
    for (int s = 0; s < 2; ++s) batch.Add(next[s], pos, s, true);
    h.forward.Run(batch, *h.kv);
    for (int s = 0; s < 2; ++s) {
      const float* row = h.forward.logits(s);
      next[s] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
  };
  for (int64_t pos = 0; pos < 2; ++pos) step(pos);
  testing::AllocCounter counter;
  for (int64_t pos = 2; pos < 50; ++pos) step(pos);
  EXPECT_EQ(counter.Stop(), 0);
  EXPECT_EQ(h.forward.expert_run_totals().rows, 50 * 2 * 3 * h.model->config().num_layers);
}

// The experts' scratch (router probabilities, choices, gathered inputs, every chosen expert's
// output rows) is reserved per row as Forward::ScratchBytesPerRow estimates, so an engine held to
// a budget counts it when it picks its step's rows.
TEST(MoeForwardTest, ExpertScratchIsReservedPerRowAsEstimated) {
  TempModel file("test-qwen3moe", "f32");
  Harness h(file.path, ops::BestIsa(), 1, 64);
  const ModelConfig& c = h.model->config();
  ModelConfig dense = c;
  dense.moe = MoeConfig{};
  const int64_t per_row = Forward::ScratchBytesPerRow(c);
  // top-3 output rows of dim floats and the gathered input row: 4 * 256 floats more than dense.
  EXPECT_GE(per_row - Forward::ScratchBytesPerRow(dense), 4 * 256 * 4);
  const int64_t bytes = h.forward.activation_bytes();
  EXPECT_LE(bytes, 64 * per_row);
  EXPECT_GE(bytes, 64 * per_row * 8 / 10);
}

}  // namespace
}  // namespace kvl
