#include "kvl/model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "kvl/gguf.h"
#include "kvl/synthetic_model.h"
#include "test_paths.h"

namespace kvl {
namespace {

TEST(ModelTest, LoadsStories260K) {
  StatusOr<std::unique_ptr<Model>> model = Model::Load(testing::Stories260KPath());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.vocab_size, 512);
  // The models README calls the output tied, but this file carries its own output.weight.
  EXPECT_FALSE(c.tied_output);
  EXPECT_FALSE(c.rope_neox);
  EXPECT_NEAR(c.norm_eps, 1e-5f, 1e-9f);
  EXPECT_EQ((*model)->weight_type_name(), "f32");
  // GQA with 4 of 8 heads: K+V per token per layer is 2 * 4 * 8 floats; the residual is 64.
  EXPECT_EQ(c.KvBytesPerTokenPerLayer(DType::kF32), 2 * 32 * 4);
  EXPECT_EQ(c.ResidualBytesPerTokenPerLayer(DType::kF32), 64 * 4);
}

TEST(ModelTest, MissingFileNamesThePath) {
  StatusOr<std::unique_ptr<Model>> model = Model::Load("/nonexistent/model.gguf");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

// A valid tiny llama file built in memory, which each test then breaks in one way.
class BrokenModelTest : public ::testing::Test {
 protected:
  struct Spec {
    bool drop_block_count = false;
    bool wrong_q_shape = false;
    bool drop_ffn_down = false;
    std::string arch = "llama";
    DType q_type = DType::kF32;
    bool bad_head_count_kv = false;
  };

  StatusOr<std::unique_ptr<Model>> Build(const Spec& spec) {
    const int64_t dim = 32, ffn = 64, vocab = 16, heads = 4;
    GgufWriter w;
    w.AddString("general.architecture", spec.arch);
    const std::string p = spec.arch + ".";
    w.AddUint32(p + "embedding_length", dim);
    if (!spec.drop_block_count) w.AddUint32(p + "block_count", 1);
    w.AddUint32(p + "feed_forward_length", ffn);
    w.AddUint32(p + "attention.head_count", heads);
    w.AddUint32(p + "attention.head_count_kv", spec.bad_head_count_kv ? 3 : 2);
    w.AddFloat32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
    auto zeros = [](uint8_t* out, size_t n) { std::memset(out, 0, n); };
    w.AddTensor("token_embd.weight", DType::kF32, {dim, vocab}, zeros);
    w.AddTensor("output_norm.weight", DType::kF32, {dim}, zeros);
    w.AddTensor("blk.0.attn_norm.weight", DType::kF32, {dim}, zeros);
    if (spec.q_type == DType::kQ4_1) {
      w.AddTensor("blk.0.attn_q.weight", DType::kQ4_1, {dim, dim}, zeros);
    } else {
      w.AddTensor("blk.0.attn_q.weight", DType::kF32, {dim, spec.wrong_q_shape ? dim + 1 : dim},
                  zeros);
    }
    w.AddTensor("blk.0.attn_k.weight", DType::kF32, {dim, 16}, zeros);
    w.AddTensor("blk.0.attn_v.weight", DType::kF32, {dim, 16}, zeros);
    w.AddTensor("blk.0.attn_output.weight", DType::kF32, {dim, dim}, zeros);
    w.AddTensor("blk.0.ffn_norm.weight", DType::kF32, {dim}, zeros);
    w.AddTensor("blk.0.ffn_gate.weight", DType::kF32, {dim, ffn}, zeros);
    w.AddTensor("blk.0.ffn_up.weight", DType::kF32, {dim, ffn}, zeros);
    if (!spec.drop_ffn_down) w.AddTensor("blk.0.ffn_down.weight", DType::kF32, {ffn, dim}, zeros);
    bytes_ = w.WriteToBuffer();
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file,
                         GgufFile::FromBuffer(bytes_.data(), bytes_.size()));
    return Model::FromGguf(std::move(file));
  }

  static std::string ErrorOf(const StatusOr<std::unique_ptr<Model>>& m) {
    return m.ok() ? "" : m.status().message();
  }

  std::vector<uint8_t> bytes_;
};

TEST_F(BrokenModelTest, ValidFileLoads) {
  StatusOr<std::unique_ptr<Model>> m = Build({});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().num_kv_heads, 2);
  EXPECT_EQ((*m)->config().vocab_size, 16);
}

TEST_F(BrokenModelTest, MissingMetadataNamesTheKey) {
  StatusOr<std::unique_ptr<Model>> m = Build({.drop_block_count = true});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(ErrorOf(m).find("llama.block_count"), std::string::npos) << ErrorOf(m);
}

TEST_F(BrokenModelTest, ShapeDisagreeingWithMetadataNamesTheTensor) {
  StatusOr<std::unique_ptr<Model>> m = Build({.wrong_q_shape = true});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(m).find("blk.0.attn_q.weight"), std::string::npos) << ErrorOf(m);
}

TEST_F(BrokenModelTest, MissingTensorNamesTheTensor) {
  StatusOr<std::unique_ptr<Model>> m = Build({.drop_ffn_down = true});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(ErrorOf(m).find("blk.0.ffn_down.weight"), std::string::npos) << ErrorOf(m);
}

TEST_F(BrokenModelTest, UnsupportedArchitectureIsUnimplemented) {
  StatusOr<std::unique_ptr<Model>> m = Build({.arch = "gpt2"});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(ErrorOf(m).find("gpt2"), std::string::npos);
}

TEST_F(BrokenModelTest, UnsupportedWeightTypeNamesTypeAndTensor) {
  StatusOr<std::unique_ptr<Model>> m = Build({.q_type = DType::kQ4_1});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(ErrorOf(m).find("q4_1"), std::string::npos) << ErrorOf(m);
  EXPECT_NE(ErrorOf(m).find("blk.0.attn_q.weight"), std::string::npos) << ErrorOf(m);
}

TEST_F(BrokenModelTest, KvHeadsThatDoNotDivideHeadsAreRejected) {
  StatusOr<std::unique_ptr<Model>> m = Build({.bad_head_count_kv = true});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(ErrorOf(m).find("head_count_kv"), std::string::npos) << ErrorOf(m);
}

TEST(SyntheticModelTest, EveryShapeHasConsistentDimensions) {
  for (const ModelShape& s : KnownModelShapes()) {
    EXPECT_EQ(s.dim % s.num_heads, 0) << s.name;
    EXPECT_EQ(s.num_heads % s.num_kv_heads, 0) << s.name;
    EXPECT_EQ(s.dim % 32, 0) << s.name;
    EXPECT_EQ(s.ffn_dim % 32, 0) << s.name;
  }
  StatusOr<ModelShape> tl = FindModelShape("tinyllama-1.1b");
  ASSERT_TRUE(tl.ok());
  EXPECT_NEAR(static_cast<double>(SyntheticParameterCount(*tl)), 1.1e9, 0.01e9);
  EXPECT_FALSE(FindModelShape("gpt-5").ok());
}

TEST(SyntheticModelTest, WritesLoadableFilesOfEveryType) {
  const std::string dir = ::testing::TempDir();
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    SynthOptions o{*FindModelShape("tiny-test"), type, 7,
                   dir + "/tiny-" + std::string(DTypeName(type)) + ".gguf"};
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    StatusOr<std::unique_ptr<Model>> m = Model::Load(o.output_path);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->weight_type_name(), DTypeName(type));
    EXPECT_EQ((*m)->num_parameters(), SyntheticParameterCount(o.shape));
    std::filesystem::remove(o.output_path);
  }
}

// K-quant files as llama.cpp writes them: type ids 12-14, 256-value super-blocks of 144 / 176 /
// 210 bytes, general.file_type of the mix, and the _M mix's Q6_K tensors where llama.cpp puts them.
TEST(SyntheticModelTest, WritesKQuantFilesAndMixes) {
  const std::string path = ::testing::TempDir() + "/tiny-kquant.gguf";
  struct Case {
    const char* name;
    DType base;
    uint32_t file_type;
  };
  for (const Case& c : {Case{"q4_k", DType::kQ4_K, 14}, Case{"q5_k", DType::kQ5_K, 16},
                        Case{"q6_k", DType::kQ6_K, 18}, Case{"q4_k_m", DType::kQ4_K, 15},
                        Case{"q5_k_m", DType::kQ5_K, 17}}) {
    SynthOptions o{*FindModelShape("tiny-test-256"), DType::kF32, 7, path};
    ASSERT_TRUE(ParseSynthType(c.name, &o)) << c.name;
    EXPECT_EQ(SynthTypeName(o), c.name);
    ASSERT_TRUE(WriteSyntheticModel(o).ok()) << c.name;
    std::unique_ptr<GgufFile> f = std::move(GgufFile::Open(path).value());
    EXPECT_EQ(f->GetInt("general.file_type").value(), c.file_type) << c.name;
    const bool mix = std::string(c.name).ends_with("_m");
    for (const GgufTensorInfo& t : f->tensors()) {
      if (t.dims.size() != 2) continue;
      const std::string name(t.name);
      const int layer = name.starts_with("blk.") ? std::stoi(name.substr(4)) : -1;
      const bool more_bits = name == "output.weight" ||
                             ((name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight")) &&
                              UsesMoreBits(layer, 8));
      EXPECT_EQ(t.type, mix && more_bits ? DType::kQ6_K : c.base) << c.name << " " << name;
      EXPECT_EQ(t.num_bytes, t.num_elements / 256 * Traits(t.type).block_bytes) << name;
    }
    StatusOr<std::unique_ptr<Model>> m = Model::Load(path);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->num_parameters(), SyntheticParameterCount(o.shape));
  }
  // llama.cpp's layer rule: first and last eighth, every third between.
  std::vector<int> picked;
  for (int l = 0; l < 22; ++l) {
    if (UsesMoreBits(l, 22)) picked.push_back(l);
  }
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 4, 7, 10, 13, 16, 19, 20, 21}));
  SynthOptions o;
  EXPECT_FALSE(ParseSynthType("q3_k", &o));
  EXPECT_FALSE(ParseSynthType("q6_k_m", &o));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvl
