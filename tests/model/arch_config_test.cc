// The architectures' configs as Model::Load reads them from kvl synth's files (the keys and
// tensor names llama.cpp reads), and the errors for what is not supported.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "kvl/gguf.h"
#include "kvl/model.h"
#include "kvl/synthetic_model.h"
#include "model/load_shape.h"

namespace kvl {
namespace {

using testing::LoadShape;

TEST(ArchConfigTest, Llama3HasRopeFactorsAndHeadDimFromKeyLength) {
  std::unique_ptr<Model> m = LoadShape("test-llama3");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.head_dim, 128);  // not dim / heads = 64
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_TRUE(c.tied_output);
  EXPECT_FALSE(c.rope_neox);
  ASSERT_NE(m->rope_factors(512), nullptr);
  for (int i = 0; i < 64; ++i) {
    EXPECT_GE(m->rope_factors(512)[i], 1.0f);
    EXPECT_LE(m->rope_factors(512)[i], 16.0f);
  }
}

TEST(ArchConfigTest, Qwen2HasBiasesAndNeoxRope) {
  std::unique_ptr<Model> m = LoadShape("test-qwen2");
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->config().rope_neox);
  EXPECT_TRUE(m->config().arch.qkv_bias);
  EXPECT_NE(m->layer(0).q_bias, nullptr);
  EXPECT_NE(m->layer(2).v_bias, nullptr);
  EXPECT_EQ(m->layer(0).q_norm, nullptr);
}

TEST(ArchConfigTest, Qwen3HasQkNormsAndANonSquareQ) {
  std::unique_ptr<Model> m = LoadShape("test-qwen3");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(m->layer(0).wq.rows, 512);
  EXPECT_EQ(m->layer(0).wo.cols, 512);
  EXPECT_NE(m->layer(1).q_norm, nullptr);
  EXPECT_NE(m->layer(1).k_norm, nullptr);
  EXPECT_FALSE(c.tied_output);
}

TEST(ArchConfigTest, Gemma2AlternatesLocalLayersAndCapsLogits) {
  std::unique_ptr<Model> m = LoadShape("test-gemma2");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch.sliding_window, 6);
  EXPECT_TRUE(c.IsLocal(0));
  EXPECT_FALSE(c.IsLocal(1));
  EXPECT_TRUE(c.IsLocal(2));
  EXPECT_FALSE(c.IsLocal(3));
  EXPECT_FLOAT_EQ(c.arch.attn_softcap, 4.0f);
  EXPECT_FLOAT_EQ(c.arch.final_softcap, 3.0f);
  EXPECT_FLOAT_EQ(c.arch.embed_scale, 16.0f);  // sqrt(256)
  EXPECT_FLOAT_EQ(c.AttentionScale(), 1.0f / std::sqrt(128.0f));  // key_length, not 27B's rule
  EXPECT_TRUE(c.arch.gelu_ffn);
  EXPECT_NE(m->layer(3).post_ffn_norm, nullptr);
}

TEST(ArchConfigTest, Gemma3HasFiveLocalLayersToOneGlobalWithTheirOwnRope) {
  std::unique_ptr<Model> m = LoadShape("test-gemma3");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.IsLocal(l), l % 6 != 5) << l;
  EXPECT_FLOAT_EQ(c.arch.rope_freq_base_local, 10000.0f);
  EXPECT_FLOAT_EQ(c.rope_freq_base, 1000000.0f);
  EXPECT_FLOAT_EQ(c.arch.rope_freq_scale, 0.125f);  // linear factor 8, global layers only
  EXPECT_FLOAT_EQ(c.arch.rope_freq_scale_local, 1.0f);
  EXPECT_EQ(c.arch.final_softcap, 0.0f);
  EXPECT_NE(m->layer(0).q_norm, nullptr);
}

TEST(ArchConfigTest, Phi3SplitsFusedMatricesAndPicksLongRopePastTheOriginalContext) {
  std::unique_ptr<Model> m = LoadShape("test-phi3", "q8_0");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  const LayerWeights& w = m->layer(1);
  EXPECT_EQ(w.wq.rows, 256);
  EXPECT_EQ(static_cast<const uint8_t*>(w.wk.data), static_cast<const uint8_t*>(w.wq.data) + 256 * w.wq.row_bytes);
  EXPECT_EQ(static_cast<const uint8_t*>(w.w_up.data),
            static_cast<const uint8_t*>(w.w_gate.data) + 512 * w.w_gate.row_bytes);
  EXPECT_EQ(c.arch.rope_original_context, 64);
  EXPECT_GT(c.arch.rope_attn_factor, 1.0f);
  EXPECT_NE(m->rope_factors(64), m->rope_factors(65));  // short, then long
  EXPECT_GT(m->rope_factors(65)[0], m->rope_factors(64)[0]);
}

TEST(ArchConfigTest, RealShapesLoadInEveryWeightType) {
  // The small shapes stand in for the real ones (same code paths); every weight type loads.
  for (const char* type : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m"}) {
    for (const char* shape : {"test-qwen2", "test-gemma3", "test-phi3"}) {
      std::unique_ptr<Model> m = LoadShape(shape, type);
      EXPECT_NE(m, nullptr) << shape << " " << type;
    }
  }
}

// A one-layer llama file in memory, with `extra` tensors beside the ones llama reads.
std::vector<uint8_t> LlamaBytes(const std::vector<std::string>& extra) {
  const int64_t dim = 32, ffn = 64, vocab = 16;
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.embedding_length", dim);
  w.AddUint32("llama.block_count", 1);
  w.AddUint32("llama.feed_forward_length", ffn);
  w.AddUint32("llama.attention.head_count", 4);
  auto zeros = [](uint8_t* out, size_t n) { std::memset(out, 0, n); };
  w.AddTensor("token_embd.weight", DType::kF32, {dim, vocab}, zeros);
  w.AddTensor("output_norm.weight", DType::kF32, {dim}, zeros);
  for (const char* n : {"attn_norm", "ffn_norm"}) {
    w.AddTensor(fmt::format("blk.0.{}.weight", n), DType::kF32, {dim}, zeros);
  }
  for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
    w.AddTensor(fmt::format("blk.0.{}.weight", n), DType::kF32, {dim, dim}, zeros);
  }
  w.AddTensor("blk.0.ffn_gate.weight", DType::kF32, {dim, ffn}, zeros);
  w.AddTensor("blk.0.ffn_up.weight", DType::kF32, {dim, ffn}, zeros);
  w.AddTensor("blk.0.ffn_down.weight", DType::kF32, {ffn, dim}, zeros);
  for (const std::string& name : extra) w.AddTensor(name, DType::kF32, {dim}, zeros);
  return w.WriteToBuffer();
}

// A file with a tensor this forward pass would not read (a bias llama.cpp would add) is refused,
// naming the tensor: never a silently wrong forward pass.
TEST(ArchConfigTest, UnexpectedTensorIsNamed) {
  std::vector<uint8_t> plain = LlamaBytes({});
  EXPECT_TRUE(Model::FromGguf(std::move(GgufFile::FromBuffer(plain.data(), plain.size()).value())).ok());
  std::vector<uint8_t> bytes = LlamaBytes({"blk.0.attn_output.bias"});
  StatusOr<std::unique_ptr<Model>> m =
      Model::FromGguf(std::move(GgufFile::FromBuffer(bytes.data(), bytes.size()).value()));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("blk.0.attn_output.bias"), std::string::npos)
      << m.status().message();
}

TEST(ArchConfigTest, UnsupportedArchitectureListsTheSupportedOnes) {
  GgufWriter w;
  w.AddString("general.architecture", "falcon");
  std::vector<uint8_t> bytes = w.WriteToBuffer();
  StatusOr<std::unique_ptr<Model>> m =
      Model::FromGguf(std::move(GgufFile::FromBuffer(bytes.data(), bytes.size()).value()));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  for (const char* name : {"falcon", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"}) {
    EXPECT_NE(m.status().message().find(name), std::string::npos) << m.status().message();
  }
}

TEST(ArchConfigTest, UnsupportedRopeScalingIsNamed) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.embedding_length", 64);
  w.AddUint32("llama.block_count", 1);
  w.AddUint32("llama.feed_forward_length", 64);
  w.AddUint32("llama.attention.head_count", 2);
  w.AddString("llama.rope.scaling.type", "yarn");
  std::vector<uint8_t> bytes = w.WriteToBuffer();
  StatusOr<std::unique_ptr<Model>> m =
      Model::FromGguf(std::move(GgufFile::FromBuffer(bytes.data(), bytes.size()).value()));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("yarn"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace kvl

namespace kvl {
namespace {

// --vocab copies a real tokenizer: llama.cpp's vocab-only GGUFs, found at $KVL_LLAMA_CPP_DIR/models
// or /tmp/llama.cpp/models (llama.cpp's source as npm's node-llama-cpp bundles it); skipped
// where neither holds them.
TEST(ArchConfigTest, SynthCopiesARealVocabulary) {
  const char* dir = std::getenv("KVL_LLAMA_CPP_DIR");
  const std::string vocab =
      std::string(dir != nullptr ? dir : "/tmp/llama.cpp") + "/models/ggml-vocab-qwen2.gguf";
  if (!std::filesystem::exists(vocab)) {
    GTEST_SKIP() << vocab << " is not here (set KVL_LLAMA_CPP_DIR to a llama.cpp checkout)";
  }
  SynthOptions o;
  o.shape = FindModelShape("test-qwen2").value();
  o.weight_type = DType::kQ8_0;
  o.vocab_path = vocab;
  o.output_path = ::testing::TempDir() + "/arch-qwen2-real-vocab.gguf";
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  std::unique_ptr<GgufFile> f = std::move(GgufFile::Open(o.output_path).value());
  std::unique_ptr<GgufFile> src = std::move(GgufFile::Open(vocab).value());
  EXPECT_EQ(f->GetString("tokenizer.ggml.pre").value(), src->GetString("tokenizer.ggml.pre").value());
  EXPECT_EQ(f->GetString("tokenizer.ggml.model").value(), "gpt2");
  const GgufValue* tokens = f->GetArray("tokenizer.ggml.tokens", GgufValueType::kString).value();
  const GgufValue* src_tokens = src->GetArray("tokenizer.ggml.tokens", GgufValueType::kString).value();
  ASSERT_EQ(tokens->array_count, src_tokens->array_count);
  EXPECT_EQ(tokens->strings, src_tokens->strings);
  EXPECT_EQ(f->GetArray("tokenizer.ggml.merges", GgufValueType::kString).value()->strings,
            src->GetArray("tokenizer.ggml.merges", GgufValueType::kString).value()->strings);
  StatusOr<std::unique_ptr<Model>> m = Model::Load(o.output_path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().vocab_size, static_cast<int64_t>(src_tokens->array_count));
  std::filesystem::remove(o.output_path);

  o.vocab_path = ::testing::TempDir() + "/no-such-vocab.gguf";
  Status missing = WriteSyntheticModel(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no-such-vocab.gguf"), std::string::npos) << missing.ToString();
}

}  // namespace
}  // namespace kvl
