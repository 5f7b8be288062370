// Mixture-of-Experts configs as Model::Load reads them (llama.cpp's keys and tensor names for
// qwen3moe and for Mixtral's experts in a llama file), and the errors for what is not supported.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "kvl/gguf.h"
#include "kvl/model.h"
#include "kvl/synthetic_model.h"
#include "model/load_shape.h"

namespace kvl {
namespace {

using testing::LoadShape;

TEST(MoeConfigTest, Qwen3MoeReadsItsExpertsAndQkNorms) {
  std::unique_ptr<Model> m = LoadShape("test-qwen3moe");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.num_experts_used, 3);
  // Each expert's width is expert_feed_forward_length, not the dense feed_forward_length (768).
  EXPECT_EQ(c.ffn_dim, 256);
  EXPECT_TRUE(c.arch.qk_norm);
  EXPECT_TRUE(c.rope_neox);
  const LayerWeights& w = m->layer(2);
  EXPECT_NE(w.q_norm, nullptr);
  EXPECT_EQ(w.w_gate.data, nullptr);  // no dense FFN
  EXPECT_EQ(w.router.rows, 8);
  EXPECT_EQ(w.router.cols, 256);
  EXPECT_EQ(w.gate_exps.num_experts, 8);
  EXPECT_EQ(w.down_exps.rows, 256);
  EXPECT_EQ(w.down_exps.cols, 256);
  // Expert e's matrix is the e-th [rows][cols] block of the stacked tensor.
  const MatrixView e5 = w.up_exps.Expert(5);
  EXPECT_EQ(static_cast<const uint8_t*>(e5.data) - static_cast<const uint8_t*>(w.up_exps.data),
            5 * 256 * 256 * 4);
  // 3 of 8 experts active: the 5 idle ones' 3 matrices per layer are not.
  EXPECT_EQ(m->num_parameters() - m->num_active_parameters(), 3 * 5 * 3 * 256 * 256);
}

TEST(MoeConfigTest, MixtralIsALlamaFileWithExperts) {
  std::unique_ptr<Model> m = LoadShape("test-mixtral", "q8_0");
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.num_experts_used, 2);
  EXPECT_EQ(c.ffn_dim, 256);  // Mixtral's experts are feed_forward_length wide
  EXPECT_FALSE(c.rope_neox);
  EXPECT_EQ(m->layer(0).router.type, DType::kF32);  // the router stays f32, as llama-quantize
  EXPECT_EQ(m->layer(0).gate_exps.type, DType::kQ8_0);
  EXPECT_EQ(m->weight_type_name(), "q8_0");
}

TEST(MoeConfigTest, EveryWeightTypeLoads) {
  for (const char* type : {"f16", "bf16", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m"}) {
    EXPECT_NE(LoadShape("test-qwen3moe", type), nullptr) << type;
  }
}

// A one-layer MoE file in memory: `arch` with 4 experts of 64, top-2, changed by `edit`.
struct MoeSpec {
  std::string arch = "qwen3moe";
  int64_t num_experts = 4;
  int64_t experts_used = 2;
  bool write_expert_count = true;
  std::vector<uint32_t> experts_used_per_layer;  // written as an array where set
  int64_t down_rows = 32;                        // ffn_down_exps' rows (dim: right)
  std::string extra_key;                         // an extra {arch}.KEY = 1
  bool dense_ffn = false;                        // ffn_{gate,up,down} instead of experts
};

StatusOr<std::unique_ptr<Model>> LoadSpec(const MoeSpec& s, std::vector<uint8_t>& bytes) {
  const int64_t dim = 32, ffn = 64, vocab = 16;
  const std::string p = s.arch + ".";
  GgufWriter w;
  w.AddString("general.architecture", s.arch);
  w.AddUint32(p + "embedding_length", dim);
  w.AddUint32(p + "block_count", 1);
  w.AddUint32(p + "feed_forward_length", ffn);
  w.AddUint32(p + "attention.head_count", 4);
  if (s.write_expert_count) w.AddUint32(p + "expert_count", static_cast<uint32_t>(s.num_experts));
  if (!s.experts_used_per_layer.empty()) {
    std::vector<int32_t> v(s.experts_used_per_layer.begin(), s.experts_used_per_layer.end());
    w.AddInt32Array(p + "expert_used_count", v);
  } else {
    w.AddUint32(p + "expert_used_count", static_cast<uint32_t>(s.experts_used));
  }
  if (!s.extra_key.empty()) w.AddUint32(p + s.extra_key, 1);
  auto zeros = [](uint8_t* out, size_t n) { std::memset(out, 0, n); };
  w.AddTensor("token_embd.weight", DType::kF32, {dim, vocab}, zeros);
  w.AddTensor("output_norm.weight", DType::kF32, {dim}, zeros);
  for (const char* n : {"attn_norm", "ffn_norm"}) {
    w.AddTensor(fmt::format("blk.0.{}.weight", n), DType::kF32, {dim}, zeros);
  }
  if (s.arch == "qwen3moe") {
    for (const char* n : {"attn_q_norm", "attn_k_norm"}) {
      w.AddTensor(fmt::format("blk.0.{}.weight", n), DType::kF32, {dim / 4}, zeros);
    }
  }
  for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
    w.AddTensor(fmt::format("blk.0.{}.weight", n), DType::kF32, {dim, dim}, zeros);
  }
  const int64_t e = s.num_experts;
  // qwen3moe without expert_feed_forward_length: feed_forward_length / top-k wide experts.
  const int64_t ef = s.arch == "qwen3moe" && s.experts_used > 0 ? ffn / s.experts_used : ffn;
  if (s.dense_ffn) {
    w.AddTensor("blk.0.ffn_gate.weight", DType::kF32, {dim, ffn}, zeros);
    w.AddTensor("blk.0.ffn_up.weight", DType::kF32, {dim, ffn}, zeros);
    w.AddTensor("blk.0.ffn_down.weight", DType::kF32, {ffn, dim}, zeros);
  } else {
    w.AddTensor("blk.0.ffn_gate_inp.weight", DType::kF32, {dim, e}, zeros);
    w.AddTensor("blk.0.ffn_gate_exps.weight", DType::kF32, {dim, ef, e}, zeros);
    w.AddTensor("blk.0.ffn_up_exps.weight", DType::kF32, {dim, ef, e}, zeros);
    w.AddTensor("blk.0.ffn_down_exps.weight", DType::kF32, {ef, s.down_rows, e}, zeros);
  }
  bytes = w.WriteToBuffer();
  return Model::FromGguf(std::move(GgufFile::FromBuffer(bytes.data(), bytes.size()).value()));
}

// The error of loading `s`, which must fail with `code`.
std::string LoadError(const MoeSpec& s, StatusCode code) {
  std::vector<uint8_t> bytes;
  StatusOr<std::unique_ptr<Model>> m = LoadSpec(s, bytes);
  EXPECT_FALSE(m.ok());
  if (m.ok()) return "";
  EXPECT_EQ(m.status().code(), code) << m.status().message();
  return m.status().message();
}

TEST(MoeConfigTest, SpecBuilderMakesLoadableFiles) {
  for (const char* arch : {"qwen3moe", "llama", "mistral"}) {
    MoeSpec s;
    s.arch = arch;
    std::vector<uint8_t> bytes;
    StatusOr<std::unique_ptr<Model>> m = LoadSpec(s, bytes);
    ASSERT_TRUE(m.ok()) << arch << ": " << m.status().message();
    EXPECT_EQ((*m)->config().moe.num_experts, 4);
    // qwen3moe without expert_feed_forward_length: feed_forward_length / top-k, as llama.cpp.
    EXPECT_EQ((*m)->config().ffn_dim, std::string(arch) == "qwen3moe" ? 32 : 64) << arch;
  }
  MoeSpec uniform;
  uniform.experts_used_per_layer = {2};
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(LoadSpec(uniform, bytes).ok());
}

TEST(MoeConfigTest, ExpertsInAnotherArchitectureAreRefusedByName) {
  MoeSpec s;
  s.arch = "qwen2";
  const std::string error = LoadError(s, StatusCode::kUnimplemented);
  EXPECT_NE(error.find("'qwen2' with experts"), std::string::npos) << error;
  EXPECT_NE(error.find("qwen3moe"), std::string::npos) << error;
}

TEST(MoeConfigTest, OtherMoeArchitecturesAreRefusedByName) {
  for (const char* arch : {"gpt-oss", "qwen2moe", "deepseek2", "olmoe"}) {
    MoeSpec s;
    s.arch = arch;
    const std::string error = LoadError(s, StatusCode::kUnimplemented);
    EXPECT_NE(error.find(fmt::format("architecture '{}' is not supported", arch)), std::string::npos)
        << error;
  }
}

TEST(MoeConfigTest, BadExpertMetadataIsNamed) {
  MoeSpec no_count;
  no_count.write_expert_count = false;
  EXPECT_NE(LoadError(no_count, StatusCode::kDataLoss).find("qwen3moe.expert_count"),
            std::string::npos);
  MoeSpec too_many_used;
  too_many_used.experts_used = 5;
  EXPECT_NE(LoadError(too_many_used, StatusCode::kDataLoss).find("expert_used_count' = 5"),
            std::string::npos);
  MoeSpec none_used;
  none_used.experts_used = 0;
  EXPECT_NE(LoadError(none_used, StatusCode::kDataLoss).find("expert_used_count' = 0"),
            std::string::npos);
  MoeSpec varying;
  varying.experts_used_per_layer = {2, 3};  // two entries for one layer
  EXPECT_NE(LoadError(varying, StatusCode::kDataLoss).find("2 entries for 1 layers"),
            std::string::npos);
  MoeSpec shared;
  shared.extra_key = "expert_shared_count";
  EXPECT_NE(LoadError(shared, StatusCode::kUnimplemented).find("expert_shared_count"),
            std::string::npos);
  MoeSpec grouped;
  grouped.extra_key = "expert_group_count";
  EXPECT_NE(LoadError(grouped, StatusCode::kUnimplemented).find("expert_group_count"),
            std::string::npos);
}

TEST(MoeConfigTest, BadExpertTensorsAreNamed) {
  MoeSpec wrong_shape;
  wrong_shape.down_rows = 16;
  const std::string error = LoadError(wrong_shape, StatusCode::kDataLoss);
  EXPECT_NE(error.find("blk.0.ffn_down_exps.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("[32, 16, 4]"), std::string::npos) << error;
  // A file that says experts but holds a dense FFN.
  MoeSpec dense;
  dense.dense_ffn = true;
  EXPECT_NE(LoadError(dense, StatusCode::kDataLoss).find("missing tensor 'blk.0.ffn_gate_inp.weight'"),
            std::string::npos);
}

}  // namespace
}  // namespace kvl
