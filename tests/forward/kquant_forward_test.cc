// A Q4_K_M model (Q4_K matrices, Q6_K output and half the layers' attn_v / ffn_down) through the
// whole forward pass: deterministic, batch invariant, and close to the same weights in f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "forward/forward_harness.h"
#include "kvl/gguf.h"
#include "kvl/quant.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

std::string SynthQ4KM(const std::string& name) {
  SynthOptions o{*FindModelShape("tiny-test-256"), DType::kQ8_0, 21,
                 ::testing::TempDir() + "/" + name};
  EXPECT_TRUE(ParseSynthType("q4_k_m", &o));
  EXPECT_TRUE(WriteSyntheticModel(o).ok());
  return o.output_path;
}

// The same model with every tensor dequantized to f32 (only the metadata the model reads).
std::string WriteF32Twin(const std::string& path) {
  std::unique_ptr<GgufFile> f = std::move(GgufFile::Open(path).value());
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  for (const char* key : {"context_length", "embedding_length", "block_count", "feed_forward_length",
                          "attention.head_count", "attention.head_count_kv", "rope.dimension_count"}) {
    w.AddUint32(std::string("llama.") + key,
                static_cast<uint32_t>(f->GetInt(std::string("llama.") + key).value()));
  }
  for (const char* key : {"rope.freq_base", "attention.layer_norm_rms_epsilon"}) {
    w.AddFloat32(std::string("llama.") + key, f->GetFloat(std::string("llama.") + key).value());
  }
  for (const GgufTensorInfo& t : f->tensors()) {
    w.AddTensor(std::string(t.name), DType::kF32, t.dims, [&t](uint8_t* out, size_t) {
      quant::DequantizeRow(t.type, t.data, t.num_elements, reinterpret_cast<float*>(out));
    });
  }
  const std::string twin = path + ".f32.gguf";
  EXPECT_TRUE(w.Write(twin).ok());
  return twin;
}

int32_t Argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// Greedy continuation of `prompt` by n tokens, one decode step each.
std::vector<int32_t> Greedy(Harness& h, const std::vector<int32_t>& prompt, int n) {
  const int64_t vocab = h.model->config().vocab_size;
  std::vector<int32_t> out;
  int32_t next = Argmax(h.AllLogits(prompt, static_cast<int64_t>(prompt.size())).back().data(), vocab);
  for (int i = 0; i < n; ++i) {
    out.push_back(next);
    TokenBatch batch;
    batch.Add(next, static_cast<int64_t>(prompt.size()) + i, 0, true);
    h.forward.Run(batch, *h.kv);
    next = Argmax(h.forward.logits(0), vocab);
  }
  return out;
}

TEST(KQuantForwardTest, Q4KMIsDeterministicAndBatchInvariant) {
  const std::string path = SynthQ4KM("q4_k_m-invariance.gguf");
  for (ops::Isa isa : ops::RunnableIsas()) {
    const std::vector<int32_t> ids = SomeTokens(20, 512);
    Harness prefill(path, isa, 2, 64), decode(path, isa, 1, 64), chunks(path, isa, 2, 64);
    const auto all = prefill.AllLogits(ids, 20);
    EXPECT_EQ(all, decode.AllLogits(ids, 1)) << ops::IsaName(isa);
    EXPECT_EQ(all, chunks.AllLogits(ids, 7)) << ops::IsaName(isa);

    Harness g1(path, isa, 2, 64), g2(path, isa, 1, 64);
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 6);
    EXPECT_EQ(Greedy(g1, prompt, 12), Greedy(g2, prompt, 12)) << ops::IsaName(isa);
  }
}

// The quantized matmuls differ from f32 ones on the dequantized weights only by the int8
// activations; through 8 layers the logits stay close and mostly agree on the top token.
TEST(KQuantForwardTest, Q4KMLogitsCloseToDequantizedF32Model) {
  const std::string path = SynthQ4KM("q4_k_m-vs-f32.gguf");
  const std::string twin = WriteF32Twin(path);
  Harness quant(path, ops::BestIsa(), 2, 64), f32(twin, ops::BestIsa(), 2, 64);
  ASSERT_EQ(quant.model->weight_type_name(), "mixed (q4_k, q6_k)");
  ASSERT_EQ(f32.model->weight_type_name(), "f32");
  EXPECT_EQ(quant.model->output().type, DType::kQ6_K);
  const std::vector<int32_t> ids = SomeTokens(32, 512);
  const auto lq = quant.AllLogits(ids, 32);
  const auto lf = f32.AllLogits(ids, 32);
  int same_top = 0;
  double worst = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < lf[p].size(); ++i) {
      diff2 += (lq[p][i] - lf[p][i]) * (lq[p][i] - lf[p][i]);
      norm2 += lf[p][i] * lf[p][i];
    }
    worst = std::max(worst, std::sqrt(diff2 / norm2));
    same_top += Argmax(lq[p].data(), 512) == Argmax(lf[p].data(), 512);
  }
  EXPECT_LT(worst, 0.05) << "relative RMS difference of the logits";
  EXPECT_GE(same_top, 28) << "of 32 positions";
  std::remove(twin.c_str());
}

}  // namespace
}  // namespace kvl
