// MatMul on every runnable ISA against the scalar path, against a double-precision reference on
// the dequantized weights, and for batch / thread invariance (bit-identical outputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"
#include "ops/matmul_test_util.h"

namespace kvl::ops {
namespace {

std::vector<float> RunMatMul(Isa isa, int threads, const Weights& w, const std::vector<float>& x,
                       int64_t n_tokens) {
  ThreadPool pool(threads);
  OpsContext ctx(isa, &pool);
  ctx.Reserve(n_tokens, w.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * w.rows), NAN);
  MatMul(ctx, w.view(), x.data(), n_tokens, y.data());
  return y;
}

bool IsKQuant(DType t) { return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K; }
bool IsQuant(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0 || IsKQuant(t); }

constexpr DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                            DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Each ISA vs the scalar path (same quantized activations, so only float summation order differs),
// and the scalar path vs exact math on the dequantized weights (activation quantization error).
TEST(MatMulTest, EveryIsaMatchesScalarReference) {
  uint32_t seed = 1;
  for (DType type : kTypes) {
    const std::vector<int64_t> cols_list =
        IsKQuant(type) ? std::vector<int64_t>{256, 768, 2048}
        : IsQuant(type) ? std::vector<int64_t>{32, 96, 224, 1056}
                        : std::vector<int64_t>{1, 7, 37, 100, 1000};
    for (int64_t cols : cols_list) {
      for (int64_t rows : {1, 5, 37}) {
        for (int64_t tokens : {1, 3, 17, 64}) {
          const Weights w = MakeWeights(type, rows, cols, ++seed);
          const std::vector<float> x = RandomVec(tokens * cols, ++seed);
          const std::vector<float> ref = RunMatMul(Isa::kScalar, 1, w, x, tokens);
          for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              double exact = 0, mag = 0;
              for (int64_t k = 0; k < cols; ++k) {
                exact += static_cast<double>(w.dequant[r * cols + k]) * x[t * cols + k];
                mag += std::fabs(static_cast<double>(w.dequant[r * cols + k]) * x[t * cols + k]);
              }
              // int8 activations: ~1/254 relative error per element, mostly cancelling.
              const double quant_tol = IsQuant(type) ? 1e-2 * mag : 1e-5 * mag;
              ASSERT_NEAR(ref[t * rows + r], exact, quant_tol + 1e-6)
                  << DTypeName(type) << " cols " << cols << " rows " << rows << " t " << t;
            }
          }
          for (Isa isa : RunnableIsas()) {
            const std::vector<float> y = RunMatMul(isa, 2, w, x, tokens);
            for (int64_t t = 0; t < tokens; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                double mag = 0;
                for (int64_t k = 0; k < cols; ++k) {
                  mag += std::fabs(static_cast<double>(w.dequant[r * cols + k]) * x[t * cols + k]);
                }
                ASSERT_NEAR(y[t * rows + r], ref[t * rows + r], 2e-6 * mag + 1e-6)
                    << IsaName(isa) << " " << DTypeName(type) << " cols " << cols << " rows " << rows
                    << " tokens " << tokens << " t " << t << " r " << r;
              }
            }
          }
        }
      }
    }
  }
}

// The invariant the KV hierarchy relies on: a token's outputs do not depend on the batch it is
// in, on where in the tiling it lands, or on the thread count. Bit-identical, not approximately.
TEST(MatMulTest, BatchAndThreadInvariant) {
  uint32_t seed = 100;
  for (DType type : kTypes) {
    // Odd block count / vector tail; K-quants: several super-blocks.
    const int64_t cols = IsKQuant(type) ? 768 : IsQuant(type) ? 224 : 100;
    const int64_t rows = 70;                         // spans row chunks and an MR edge
    const Weights w = MakeWeights(type, rows, cols, ++seed);
    const std::vector<float> x = RandomVec(64 * cols, ++seed);
    for (Isa isa : RunnableIsas()) {
      // Each token alone (decode).
      std::vector<float> alone(64 * rows);
      for (int64_t t = 0; t < 64; ++t) {
        const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
        const std::vector<float> y = RunMatMul(isa, 1, w, xt, 1);
        std::memcpy(&alone[t * rows], y.data(), rows * sizeof(float));
      }
      std::vector<int64_t> token_counts;
      for (int64_t n = 1; n <= 13; ++n) token_counts.push_back(n);
      token_counts.push_back(64);
      for (int threads : {1, 2}) {
        for (int64_t n : token_counts) {
          const std::vector<float> y = RunMatMul(isa, threads, w, x, n);
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(y[t * rows + r], alone[t * rows + r])
                  << IsaName(isa) << " " << DTypeName(type) << " threads " << threads << " n " << n
                  << " t " << t << " r " << r;
            }
          }
        }
      }
    }
  }
}

TEST(MatMulTest, LargerShapeAgreesAcrossIsas) {
  // One TinyLlama-like shape per type, to cover many full tiles and both task sizes.
  for (DType type : kTypes) {
    const Weights w = MakeWeights(type, 260, 2048, 7);
    const std::vector<float> x = RandomVec(33 * 2048, 8);
    const std::vector<float> ref = RunMatMul(Isa::kScalar, 1, w, x, 33);
    for (Isa isa : RunnableIsas()) {
      const std::vector<float> y = RunMatMul(isa, 2, w, x, 33);
      // K-quant sums are a difference of two larger ones (scaled codes minus mins or the -32
      // offset), so their rounding is larger relative to the result.
      const float tol = IsKQuant(type) ? 1e-3f : 1e-4f;
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(y[i], ref[i], tol * (1.0f + std::fabs(ref[i])))
            << IsaName(isa) << " " << DTypeName(type) << " " << i;
      }
    }
  }
}

// A group mixing K-quant, Q8_0 and float matrices (as a Q4_K_M layer's Q/K/V can) shares one
// activation quantization and gives each matrix exactly what MatMul alone gives.
TEST(MatMulTest, GroupMixingKQuantsMatchesSeparateCalls) {
  const int64_t cols = 512, tokens = 6;
  const Weights ws[] = {MakeWeights(DType::kQ4_K, 40, cols, 1), MakeWeights(DType::kQ6_K, 24, cols, 2),
                        MakeWeights(DType::kQ8_0, 24, cols, 3), MakeWeights(DType::kF16, 8, cols, 4)};
  const std::vector<float> x = RandomVec(tokens * cols, 5);
  for (Isa isa : RunnableIsas()) {
    ThreadPool pool(2);
    OpsContext ctx(isa, &pool);
    ctx.Reserve(tokens, cols);
    MatrixView views[4];
    std::vector<float> ys[4];
    float* outs[4];
    for (int m = 0; m < 4; ++m) {
      views[m] = ws[m].view();
      ys[m].assign(tokens * ws[m].rows, NAN);
      outs[m] = ys[m].data();
    }
    MatMulGroup(ctx, views, x.data(), tokens, outs);
    for (int m = 0; m < 4; ++m) {
      EXPECT_EQ(ys[m], RunMatMul(isa, 1, ws[m], x, tokens)) << IsaName(isa) << " matrix " << m;
    }
  }
}

TEST(MatMulTest, IsaQueries) {
  const std::vector<Isa> isas = RunnableIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  EXPECT_EQ(BestIsa(), isas.back());  // KVL_ISA unset in tests
  EXPECT_EQ(IsaName(Isa::kAvx512), "avx512");
  if (isas.back() == Isa::kAvx512) {
    EXPECT_NE(CpuFeatureString().find("AVX512VNNI"), std::string::npos);
  }
}

TEST(MatMulDeathTest, ScratchTooSmall) {
  const Weights w = MakeWeights(DType::kQ8_0, 4, 64, 3);
  const std::vector<float> x = RandomVec(8 * 64, 4);
  std::vector<float> y(8 * 4);
  ThreadPool pool(1);
  OpsContext ctx(Isa::kScalar, &pool);
  ctx.Reserve(2, 64);
  EXPECT_DEATH(MatMul(ctx, w.view(), x.data(), 8, y.data()), "scratch");
}

}  // namespace
}  // namespace kvl::ops
