// The packed K-quant GEMM on the tensors of synthetic Q4_K_M and Q5_K_M models, as Forward packs
// them at load: every matrix of the file gives bit-identical outputs packed (the best ISA's int8
// GEMM) and unpacked (the scalar K-quant kernel), in decode and in prefill. With the rest of the
// forward pass batch invariant (kquant_forward_test.cc), the logits are then those of the scalar
// kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvl/forward.h"
#include "kvl/ops.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

std::string Synth(const std::string& type, const std::string& name) {
  SynthOptions o{*FindModelShape("tiny-test-256"), DType::kQ8_0, 33,
                 ::testing::TempDir() + "/" + name};
  EXPECT_TRUE(ParseSynthType(type, &o));
  EXPECT_TRUE(WriteSyntheticModel(o).ok());
  return o.output_path;
}

std::vector<float> MatMulOn(ops::Isa isa, const MatrixView& w, const std::vector<float>& x,
                       int64_t n_tokens) {
  ThreadPool pool(isa == ops::Isa::kScalar ? 1 : 2);
  ops::OpsContext ctx(isa, &pool);
  ctx.Reserve(n_tokens, w.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * w.rows), NAN);
  ops::MatMul(ctx, w, x.data(), n_tokens, y.data());
  return y;
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(KQuantPackedModelTest, PackedMatricesMatchScalarKernelBitExact) {
  const ops::Isa isa = ops::BestIsa();
  if (!ops::PacksMatrix(isa, DType::kQ4_K)) GTEST_SKIP() << "no packed K-quant GEMM on this CPU";
  for (const std::string type : {"q4_k_m", "q5_k_m"}) {
    const std::string path = Synth(type, type + "-packed.gguf");
    const std::unique_ptr<Model> model = std::move(Model::Load(path).value());
    std::vector<MatrixView> matrices = {model->output()};
    for (int64_t l = 0; l < model->config().num_layers; ++l) {
      const LayerWeights& w = model->layer(l);
      matrices.insert(matrices.end(), {w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down});
    }
    ThreadPool pack_pool(2);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    int kinds[3] = {0, 0, 0};  // Q4_K, Q5_K, Q6_K matrices seen
    for (const MatrixView& w : matrices) {
      ASSERT_TRUE(w.type == DType::kQ4_K || w.type == DType::kQ5_K || w.type == DType::kQ6_K)
          << DTypeName(w.type);
      ++kinds[w.type == DType::kQ4_K ? 0 : w.type == DType::kQ5_K ? 1 : 2];
      const ops::PackedMatrix packed = ops::PackMatrix(isa, w, &pack_pool);
      ASSERT_EQ(packed.view().layout, MatrixLayout::kPacked);
      for (int64_t n_tokens : {1, 4, 19}) {  // decode, batched decode, prefill tiles
        std::vector<float> x(static_cast<size_t>(n_tokens * w.cols));
        for (float& v : x) v = dist(rng);
        EXPECT_TRUE(BitIdentical(MatMulOn(isa, packed.view(), x, n_tokens),
                                 MatMulOn(ops::Isa::kScalar, w, x, n_tokens)))
            << type << " " << DTypeName(w.type) << " " << w.rows << "x" << w.cols << " tokens "
            << n_tokens;
      }
    }
    // The mix really holds both kinds: the 4- or 5-bit type and Q6_K (output, some attn_v and
    // ffn_down).
    EXPECT_GT(kinds[type == "q4_k_m" ? 0 : 1], 0) << type;
    EXPECT_GT(kinds[2], 0) << type;
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace kvl
