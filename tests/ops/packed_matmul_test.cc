// MatMul over weights repacked by PackMatrix (the int8 GEMM layout): bit-identical to the scalar
// path on the original weights for every ISA that packs, for every batch size, tiling and thread
// count; an ISA that does not pack leaves the weights as they are.
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

// Activations with a saturating block (one value far above the rest) and an all-zero block.
std::vector<float> ExtremeVec(int64_t n, uint32_t seed) {
  std::vector<float> v = RandomVec(n, seed);
  if (n >= 64) {
    v[5] = 1e3f;
    for (int j = 32; j < 64; ++j) v[j] = 0.0f;
  }
  return v;
}

std::vector<float> RunPacked(Isa isa, int threads, const MatrixView& w, const float* x, int64_t n) {
  ThreadPool pool(threads);
  OpsContext ctx(isa, &pool);
  ctx.Reserve(n, w.cols);
  std::vector<float> y(static_cast<size_t>(n * w.rows), NAN);
  MatMul(ctx, w, x, n, y.data());
  return y;
}

// Bitwise, so -0 vs +0 or a NaN would show.
void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    ASSERT_EQ(ua, ub) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0};

TEST(PackedMatMulTest, MatchesScalarBitExactOnOddShapes) {
  uint32_t seed = 1;
  for (Isa isa : RunnableIsas()) {
    for (DType type : kQuantTypes) {
      if (!PacksMatrix(isa, type)) continue;
      for (int64_t cols : {32, 64, 96, 224, 1056}) {  // odd and even block counts
        for (int64_t rows : {1, 15, 16, 17, 33, 70}) {  // partial, whole and several panels
          const Weights w = MakeWeights(type, rows, cols, ++seed, true);
          const PackedMatrix packed = PackMatrix(isa, w.view());
          ASSERT_EQ(packed.view().layout, MatrixLayout::kPacked);
          for (int64_t tokens : {1, 2, 5, 8, 9, 13, 31}) {
            const std::vector<float> x = ExtremeVec(tokens * cols, ++seed);
            const std::vector<float> ref = RunPacked(Isa::kScalar, 1, w.view(), x.data(), tokens);
            ExpectBitIdentical(RunPacked(isa, 2, packed.view(), x.data(), tokens), ref,
                               std::string(IsaName(isa)) + " " + std::string(DTypeName(type)) +
                                   " rows " + std::to_string(rows) + " cols " +
                                   std::to_string(cols) + " tokens " + std::to_string(tokens));
          }
        }
      }
    }
  }
}

// Every M from 1 to 64, 1 and 2 threads: each token's outputs are those it gets alone, which are
// the scalar path's.
TEST(PackedMatMulTest, BatchAndThreadInvariant) {
  uint32_t seed = 100;
  for (Isa isa : RunnableIsas()) {
    for (DType type : kQuantTypes) {
      if (!PacksMatrix(isa, type)) continue;
      const int64_t cols = 352, rows = 100;  // 11 blocks; 6 full panels and a partial one
      const Weights w = MakeWeights(type, rows, cols, ++seed, true);
      const PackedMatrix packed = PackMatrix(isa, w.view());
      const std::vector<float> x = ExtremeVec(64 * cols, ++seed);
      const std::vector<float> ref = RunPacked(Isa::kScalar, 1, w.view(), x.data(), 64);
      for (int threads : {1, 2}) {
        for (int64_t n = 1; n <= 64; ++n) {
          for (int64_t t0 : {int64_t{0}, 64 - n}) {  // the batch at the start and at the end
            const std::vector<float> y = RunPacked(isa, threads, packed.view(), x.data() + t0 * cols, n);
            const std::vector<float> want(ref.begin() + t0 * rows, ref.begin() + (t0 + n) * rows);
            ExpectBitIdentical(y, want,
                               std::string(DTypeName(type)) + " threads " +
                                   std::to_string(threads) + " n " + std::to_string(n));
          }
        }
      }
    }
  }
}

// A group mixing packed and unpacked matrices gives each what MatMul gives it alone.
TEST(PackedMatMulTest, GroupMixesLayouts) {
  const Isa isa = BestIsa();
  const Weights q8 = MakeWeights(DType::kQ8_0, 48, 256, 7);
  const Weights q4 = MakeWeights(DType::kQ4_0, 20, 256, 8);
  const Weights f16 = MakeWeights(DType::kF16, 9, 256, 9);
  const PackedMatrix p8 = PackMatrix(isa, q8.view()), p4 = PackMatrix(isa, q4.view());
  const std::vector<float> x = RandomVec(21 * 256, 10);
  std::vector<float> y8(21 * 48), y4(21 * 20), y16(21 * 9);
  ThreadPool pool(2);
  OpsContext ctx(isa, &pool);
  ctx.Reserve(21, 256);
  const MatrixView ws[] = {p8.view(), f16.view(), p4.view()};
  float* const ys[] = {y8.data(), y16.data(), y4.data()};
  MatMulGroup(ctx, ws, x.data(), 21, ys);
  ExpectBitIdentical(y8, RunPacked(isa, 1, p8.view(), x.data(), 21), "q8_0");
  ExpectBitIdentical(y4, RunPacked(isa, 1, p4.view(), x.data(), 21), "q4_0");
  ExpectBitIdentical(y16, RunPacked(isa, 1, f16.view(), x.data(), 21), "f16");
}

TEST(PackedMatMulTest, SizeAndUnpackedTypes) {
  for (Isa isa : RunnableIsas()) {
    const Weights f16 = MakeWeights(DType::kF16, 16, 64, 3);
    const PackedMatrix same = PackMatrix(isa, f16.view());
    EXPECT_EQ(same.bytes(), 0u);
    EXPECT_EQ(same.view().data, f16.view().data);
    EXPECT_EQ(same.view().layout, MatrixLayout::kRows);
    for (DType type : kQuantTypes) {
      // 32 rows x 4 blocks: exactly the GGUF bytes; 17 rows x 3 blocks: padded to 2 panels x 2 pairs.
      const Weights even = MakeWeights(type, 32, 128, 4), odd = MakeWeights(type, 17, 96, 5);
      const PackedMatrix pe = PackMatrix(isa, even.view()), po = PackMatrix(isa, odd.view());
      if (!PacksMatrix(isa, type)) {
        EXPECT_EQ(pe.bytes(), 0u);
        continue;
      }
      EXPECT_EQ(pe.bytes(), even.bytes.size());
      EXPECT_EQ(po.bytes(), static_cast<size_t>(2 * 2 * 2 * 16 * RowBytes(type, 32)));
    }
  }
}

TEST(PackedMatMulDeathTest, RefusesAnotherIsasLayout) {
  if (!PacksMatrix(BestIsa(), DType::kQ8_0)) GTEST_SKIP() << "no packed kernel on this CPU";
  const Weights w = MakeWeights(DType::kQ8_0, 16, 64, 3);
  const PackedMatrix packed = PackMatrix(BestIsa(), w.view());
  const std::vector<float> x = RandomVec(64, 4);
  EXPECT_DEATH(RunPacked(Isa::kScalar, 1, packed.view(), x.data(), 1), "packed for another ISA");
}

}  // namespace
}  // namespace kvl::ops
