// MatMul over weights repacked by PackMatrix (the int8 GEMM layout, Q8_0 / Q4_0 and the K-quants):
// bit-identical to the scalar path on the original weights for every ISA that packs, for every
// batch size, tiling and thread count; an ISA that does not pack leaves the weights as they are.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"
#include "ops/amx.h"
#include "ops/kernel_table.h"
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

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0};
constexpr DType kKQuantTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
constexpr DType kAllPackedTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                                     DType::kQ6_K};

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
            const std::vector<float> ref = RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), tokens);
            ExpectBitIdentical(RunPackedMatMul(isa, 2, packed.view(), x.data(), tokens), ref,
                               std::string(IsaName(isa)) + " " + std::string(DTypeName(type)) +
                                   " rows " + std::to_string(rows) + " cols " +
                                   std::to_string(cols) + " tokens " + std::to_string(tokens));
          }
        }
      }
    }
  }
}

// K-quant rows of 1 to 43 super-blocks (TinyLlama's ffn_down width and Llama-7B's included), row
// counts that leave a partial panel, and every tile width of prefill and decode. Weights with
// widely varying scales and outliers (so codes 0 and 15 / 31 / 63 occur), activations with a
// saturating and an all-zero block.
TEST(PackedMatMulTest, KQuantsMatchScalarBitExactOnOddShapes) {
  uint32_t seed = 50;
  int packed_cases = 0;
  for (Isa isa : RunnableIsas()) {
    for (DType type : kKQuantTypes) {
      if (!PacksMatrix(isa, type)) continue;
      for (int64_t cols : {256, 768, 2816, 5632, 11008}) {
        for (int64_t rows : {1, 17, 45}) {
          if (cols > 2816 && rows != 17) continue;  // the scalar reference is slow at these widths
          const Weights w = MakeWeights(type, rows, cols, ++seed, true);
          const PackedMatrix packed = PackMatrix(isa, w.view());
          ASSERT_EQ(packed.view().layout, MatrixLayout::kPacked);
          const int64_t max_tokens = 15;
          const std::vector<float> x = ExtremeVec(max_tokens * cols, ++seed);
          // The scalar path is batch invariant, so the first n tokens' outputs are a prefix.
          const std::vector<float> ref = RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), max_tokens);
          for (int64_t tokens : {1, 2, 5, 7, 8, 9, 12, 15}) {
            const std::vector<float> want(ref.begin(), ref.begin() + tokens * rows);
            ExpectBitIdentical(RunPackedMatMul(isa, 2, packed.view(), x.data(), tokens), want,
                               std::string(IsaName(isa)) + " " + std::string(DTypeName(type)) +
                                   " rows " + std::to_string(rows) + " cols " +
                                   std::to_string(cols) + " tokens " + std::to_string(tokens));
            ++packed_cases;
          }
        }
      }
    }
  }
  if (PacksMatrix(BestIsa(), DType::kQ4_K)) {
    EXPECT_GT(packed_cases, 0);
  }
}

// Every M from 1 to 64, 1 and 2 threads: each token's outputs are those it gets alone, which are
// the scalar path's.
TEST(PackedMatMulTest, BatchAndThreadInvariant) {
  uint32_t seed = 100;
  for (Isa isa : RunnableIsas()) {
    for (DType type : kAllPackedTypes) {
      if (!PacksMatrix(isa, type)) continue;
      // 11 blocks or 2 super-blocks; 6 full panels and a partial one.
      const int64_t cols = IsKQuant(type) ? 512 : 352, rows = 100;
      const Weights w = MakeWeights(type, rows, cols, ++seed, true);
      const PackedMatrix packed = PackMatrix(isa, w.view());
      const std::vector<float> x = ExtremeVec(64 * cols, ++seed);
      const std::vector<float> ref = RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), 64);
      for (int threads : {1, 2}) {
        for (int64_t n = 1; n <= 64; ++n) {
          for (int64_t t0 : {int64_t{0}, 64 - n}) {  // the batch at the start and at the end
            const std::vector<float> y = RunPackedMatMul(isa, threads, packed.view(), x.data() + t0 * cols, n);
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

// Q8_0 batches, with the AMX tiles turned on (they take 8 to 16 tokens of a task: AmxTakes) and
// off (vpdpbusd alone): the scalar path's outputs bit for bit, for odd and even block counts,
// partial panels, and batches beside and beyond the tiles' range, on 1 and 2 threads.
TEST(PackedMatMulTest, AmxTilesMatchScalarBitExact) {
  const Isa isa = Isa::kAvx512;
  if (!CheckIsaRunnable(isa).ok()) GTEST_SKIP() << "no AVX-512 on this CPU";
  if (!AmxAvailable()) GTEST_SKIP() << "no AMX-INT8 on this CPU or OS (vpdpbusd runs every tile)";
  const bool was_on = AmxEnabled();
  uint32_t seed = 700;
  for (int64_t cols : {32, 96, 352, 2048}) {
    for (int64_t rows : {17, 100, 256}) {
      const Weights w = MakeWeights(DType::kQ8_0, rows, cols, ++seed, true);
      const PackedMatrix packed = PackMatrix(isa, w.view());
      const int64_t max_tokens = 130;
      const std::vector<float> x = ExtremeVec(max_tokens * cols, ++seed);
      const std::vector<float> ref = RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), max_tokens);
      for (int64_t tokens : {8, 9, 16, 17, 31, 32, 48, 64, 65, 130}) {
        const std::vector<float> want(ref.begin(), ref.begin() + tokens * rows);
        for (bool amx : {true, false}) {
          SetAmxEnabled(amx);
          for (int threads : {1, 2}) {
            ExpectBitIdentical(RunPackedMatMul(isa, threads, packed.view(), x.data(), tokens), want,
                               std::string(amx ? "amx" : "vpdpbusd") + " rows " +
                                   std::to_string(rows) + " cols " + std::to_string(cols) +
                                   " tokens " + std::to_string(tokens) + " threads " +
                                   std::to_string(threads));
          }
        }
      }
    }
  }
  SetAmxEnabled(was_on);
}

// A run of n tokens cut into tiles of at most max: as few tiles as max allows, in order, covering
// every token once, sizes differing by at most one (64 tokens, max 12: 11, 11, 11, 11, 10, 10).
TEST(PackedMatMulTest, TokenTilesAreBalanced) {
  EXPECT_EQ(BalancedTokenTile(64, 12, 0).count, 11);
  EXPECT_EQ(BalancedTokenTile(64, 12, 5).start, 54);
  EXPECT_EQ(BalancedTokenTile(64, 12, 5).count, 10);
  for (int64_t max = 1; max <= 12; ++max) {
    for (int64_t n = 1; n <= 200; ++n) {
      const int64_t tiles = (n + max - 1) / max;
      int64_t next = 0, smallest = max, largest = 0;
      for (int64_t i = 0; i < tiles; ++i) {
        const TokenTile t = BalancedTokenTile(n, max, i);
        ASSERT_EQ(t.start, next) << "n " << n << " max " << max << " tile " << i;
        next += t.count;
        smallest = std::min(smallest, t.count);
        largest = std::max(largest, t.count);
      }
      ASSERT_EQ(next, n) << "n " << n << " max " << max;
      ASSERT_LE(largest, max) << "n " << n << " max " << max;
      ASSERT_LE(largest - smallest, 1) << "n " << n << " max " << max;
    }
  }
}

// Prefill batches longer than one MatMul task's 64 tokens at a Qwen3-0.6B width (4 super-blocks),
// whose last task is cut into narrower balanced tiles (13 tokens: 7 + 6; 36: 3 x 12) or is a
// decode-width run (2 tokens: the streaming tiles), 2 threads: the scalar path's outputs, bit for
// bit.
TEST(PackedMatMulTest, KQuantPrefillBatchesMatchScalar) {
  const Isa isa = BestIsa();
  uint32_t seed = 300;
  int packed_cases = 0;
  for (DType type : kKQuantTypes) {
    if (!PacksMatrix(isa, type)) continue;
    const int64_t cols = 1024, rows = 40;
    const Weights w = MakeWeights(type, rows, cols, ++seed, true);
    const PackedMatrix packed = PackMatrix(isa, w.view());
    const int64_t max_tokens = 130;
    const std::vector<float> x = ExtremeVec(max_tokens * cols, ++seed);
    const std::vector<float> ref = RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), max_tokens);
    for (int64_t tokens : {64, 66, 77, 100, 130}) {
      const std::vector<float> want(ref.begin(), ref.begin() + tokens * rows);
      ExpectBitIdentical(RunPackedMatMul(isa, 2, packed.view(), x.data(), tokens), want,
                         std::string(DTypeName(type)) + " tokens " + std::to_string(tokens));
      ++packed_cases;
    }
  }
  if (PacksMatrix(isa, DType::kQ4_K)) {
    EXPECT_EQ(packed_cases, 15);
  }
}

// A whole pp512 chunk at the Qwen3-0.6B width (eight 64-token tasks of balanced tiles), the
// scalar path's outputs bit for bit, and the same tokens in batches of 1, 5 and 64 (decode,
// batched decode, one task) taken anywhere in it: each token's outputs, whatever tile width
// computed them, round the same fused multiply-adds.
TEST(PackedMatMulTest, KQuantPrefill512MatchesSmallBatches) {
  const Isa isa = BestIsa();
  uint32_t seed = 400;
  int checked = 0;
  for (DType type : kKQuantTypes) {
    if (!PacksMatrix(isa, type)) continue;
    const int64_t cols = 1024, rows = 40, n = 512;
    const Weights w = MakeWeights(type, rows, cols, ++seed, true);
    const PackedMatrix packed = PackMatrix(isa, w.view());
    const std::vector<float> x = ExtremeVec(n * cols, ++seed);
    const std::vector<float> all = RunPackedMatMul(isa, 2, packed.view(), x.data(), n);
    const std::string name(DTypeName(type));
    ExpectBitIdentical(all, RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), n),
                       name + " 512 tokens vs scalar");
    for (int64_t m : {1, 5, 64}) {
      for (int64_t t0 : {int64_t{0}, int64_t{193}, n - m}) {
        const std::vector<float> y = RunPackedMatMul(isa, 2, packed.view(), x.data() + t0 * cols, m);
        const std::vector<float> want(all.begin() + t0 * rows, all.begin() + (t0 + m) * rows);
        ExpectBitIdentical(y, want, name + " M " + std::to_string(m) + " at " + std::to_string(t0));
        ++checked;
      }
    }
  }
  if (PacksMatrix(isa, DType::kQ4_K)) {
    EXPECT_EQ(checked, 27);
  }
}

// A group mixing packed and unpacked matrices gives each what MatMul gives it alone (a Q4_K_M
// layer's Q/K/V: packed Q4_K and Q6_K beside each other; Q8_0 and f16 beside them).
TEST(PackedMatMulTest, GroupMixesLayouts) {
  const Isa isa = BestIsa();
  const Weights q8 = MakeWeights(DType::kQ8_0, 48, 512, 7);
  const Weights q4k = MakeWeights(DType::kQ4_K, 20, 512, 8);
  const Weights q6k = MakeWeights(DType::kQ6_K, 33, 512, 11);
  const Weights f16 = MakeWeights(DType::kF16, 9, 512, 9);
  const PackedMatrix p8 = PackMatrix(isa, q8.view()), p4k = PackMatrix(isa, q4k.view()),
                     p6k = PackMatrix(isa, q6k.view());
  const std::vector<float> x = RandomVec(21 * 512, 10);
  std::vector<float> y8(21 * 48), y4k(21 * 20), y6k(21 * 33), y16(21 * 9);
  ThreadPool pool(2);
  OpsContext ctx(isa, &pool);
  ctx.Reserve(21, 512);
  const MatrixView ws[] = {p8.view(), f16.view(), p4k.view(), p6k.view()};
  float* const ys[] = {y8.data(), y16.data(), y4k.data(), y6k.data()};
  MatMulGroup(ctx, ws, x.data(), 21, ys);
  ExpectBitIdentical(y8, RunPackedMatMul(isa, 1, p8.view(), x.data(), 21), "q8_0");
  ExpectBitIdentical(y4k, RunPackedMatMul(Isa::kScalar, 1, q4k.view(), x.data(), 21), "q4_k");
  ExpectBitIdentical(y6k, RunPackedMatMul(Isa::kScalar, 1, q6k.view(), x.data(), 21), "q6_k");
  ExpectBitIdentical(y16, RunPackedMatMul(isa, 1, f16.view(), x.data(), 21), "f16");
}

// A group whose matrices take different token counts (a decode step's Q for 1 token beside the K
// and V of the step and of a page rebuilt in it, 65 tokens) splits into streaming and batched
// tasks that the threads take in different orders: each matrix still gets, bit for bit, what
// MatMul gives it alone, on 1, 2 and 3 threads.
TEST(PackedMatMulTest, GroupWithStreamingAndBatchedTasks) {
  const Isa isa = BestIsa();
  const int64_t cols = 256;
  const Weights wq = MakeWeights(DType::kQ8_0, 300, cols, 21);
  const Weights wk = MakeWeights(DType::kQ8_0, 70, cols, 22);
  const Weights wv = MakeWeights(DType::kQ4_0, 70, cols, 23);
  const PackedMatrix pq = PackMatrix(isa, wq.view()), pk = PackMatrix(isa, wk.view()),
                     pv = PackMatrix(isa, wv.view());
  const MatrixView ws[] = {pq.view(), pk.view(), pv.view()};
  const int64_t max_tokens = 130;
  const std::vector<float> x = ExtremeVec(max_tokens * cols, 24);
  const int64_t count_sets[][3] = {{1, 65, 65}, {3, 130, 10}, {0, 20, 9}, {8, 72, 72}};
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    OpsContext ctx(isa, &pool);
    ctx.Reserve(max_tokens, cols);
    for (const auto& counts : count_sets) {
      std::vector<std::vector<float>> ys;
      float* outs[3];
      for (size_t m = 0; m < 3; ++m) {
        // At least one element: a matrix of 0 tokens still gets an output pointer, left as is.
        ys.emplace_back(static_cast<size_t>(std::max<int64_t>(1, counts[m] * ws[m].rows)), NAN);
        outs[m] = ys.back().data();
      }
      MatMulGroup(ctx, ws, x.data(), std::span<const int64_t>(counts, 3), outs);
      for (size_t m = 0; m < 3; ++m) {
        if (counts[m] == 0) {
          EXPECT_TRUE(std::isnan(ys[m][0])) << "a matrix of 0 tokens got an output";
          continue;
        }
        ExpectBitIdentical(ys[m], RunPackedMatMul(isa, 1, ws[m], x.data(), counts[m]),
                           "matrix " + std::to_string(m) + " of counts " +
                               std::to_string(counts[0]) + "/" + std::to_string(counts[1]) + "/" +
                               std::to_string(counts[2]) + ", threads " + std::to_string(threads));
      }
    }
  }
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
    for (DType type : kKQuantTypes) {
      // 32 rows x 3 super-blocks: the GGUF bytes (Q6_K: 32 bytes more per panel and super-block,
      // for alignment); 17 rows: a second panel of the same size.
      const Weights even = MakeWeights(type, 32, 768, 4), odd = MakeWeights(type, 17, 768, 5);
      const PackedMatrix pe = PackMatrix(isa, even.view()), po = PackMatrix(isa, odd.view());
      if (!PacksMatrix(isa, type)) {
        EXPECT_EQ(pe.bytes(), 0u);
        continue;
      }
      const size_t padding = type == DType::kQ6_K ? 2 * 3 * 32 : 0;
      EXPECT_EQ(pe.bytes(), even.bytes.size() + padding) << DTypeName(type);
      EXPECT_EQ(po.bytes(), pe.bytes()) << DTypeName(type);
    }
  }
}

TEST(PackedMatMulDeathTest, RefusesAnotherIsasLayout) {
  if (!PacksMatrix(BestIsa(), DType::kQ8_0)) GTEST_SKIP() << "no packed kernel on this CPU";
  const Weights w = MakeWeights(DType::kQ8_0, 16, 64, 3);
  const PackedMatrix packed = PackMatrix(BestIsa(), w.view());
  const std::vector<float> x = RandomVec(64, 4);
  EXPECT_DEATH(RunPackedMatMul(Isa::kScalar, 1, packed.view(), x.data(), 1), "packed for another ISA");
}

}  // namespace
}  // namespace kvl::ops
