// Internal: MatMul tiles for K-quant weights (Q4_K, Q5_K, Q6_K; formats in kvl/kquant.h), one per
// ISA in kquant_kernels_<isa>.cc. They read the same int8 activations as Q8_0 / Q4_0 (the layout
// in kernel_table.h: 32-value blocks with fp32 scales), so a group that mixes K-quant and Q8_0
// matrices quantizes its input once, and activations keep a finer scale than ggml's Q8_K (one per
// 256 values).
//
// The dot product of a weight row with a token, per sub-block s (32 values; 16 for Q6_K):
//   Q4_K / Q5_K: sum_s d * sc[s] * dx[s] * (sum q * x)  -  sum_s dmin * m[s] * dx[s] * (sum x)
//   Q6_K:        sum_s d * sc[s] * dx[s] * (sum q * x)  -  32 * sum_s d * sc[s] * dx[s] * (sum x)
// with q the unsigned codes, x the int8 activations and dx their block scales. The integer sums
// are exact; (dx * sum x) per sub-block depends only on the token, so a tile computes it once per
// token (KQuantActSums) and reuses it for every row.
//
// Batch invariance as for every MatMul (ops.h): each (row, token) output is the same sequence of
// float operations whatever the tile, the number of tokens computed beside it and the thread.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kvl/kquant.h"
#include "kernel_table.h"

namespace kvl::ops {

using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::kQK_K;

// Decode streams each weight row once from DRAM: the SIMD tiles prefetch this far ahead.
inline constexpr int64_t kKQuantPrefetchBytes = 2048;

// The fp16 at p (any alignment), widened with F16C. For the SIMD files only; static (one copy
// per file, never merged by the linker across ISA flags) and marked with the one feature it needs
// so that the scalar file, which never calls it, still compiles.
__attribute__((target("f16c"))) static inline float LoadHalfF16c(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The widest row a K-quant tile takes: its per-token sums live on the stack (4 tokens x cols / 16
// floats = 32 KiB at this width). Larger than any llama-family matrix up to 70B (28,672).
inline constexpr int64_t kMaxKQuantCols = 32768;
// Tokens a SIMD tile decodes each weight block for at once.
inline constexpr int kKQuantMaxTokens = 4;

// sums[i] = dx[b] * (sum of the int8 activations of sub-block i), b the 32-value block holding
// it; sub-blocks of 32 (Q4_K, Q5_K) or 16 (Q6_K) values. One token's activation row.
void KQuantActSums(DType type, const uint8_t* acts, int64_t cols, float* sums);

// The unsigned codes of the 256 elements of one super-block (block: its bytes as stored), in
// element order: what the formats of kvl/kquant.h define, for the packer.
void KQuantCodes(DType type, const uint8_t* block, uint8_t codes[kQK_K]);

// One token's operands as the SIMD tiles read them.
struct KQuantToken {
  const int8_t* x;     // [cols] int8 activations
  const float* dx;     // [cols / 32] their block scales
  const float* sums;   // [cols / 32] or [cols / 16]: KQuantActSums
};

using MatMulTileFn = void (*)(const MatMulArgs& args, int64_t r0, int64_t r1, int64_t t0,
                              int64_t t1);
void ScalarKQuantMatMulTile(const MatMulArgs& args, int64_t r0, int64_t r1, int64_t t0,
                            int64_t t1);
void Avx2KQuantMatMulTile(const MatMulArgs& args, int64_t r0, int64_t r1, int64_t t0, int64_t t1);
void Avx512KQuantMatMulTile(const MatMulArgs& args, int64_t r0, int64_t r1, int64_t t0,
                            int64_t t1);

// The tile loop the SIMD paths share: tokens in groups of up to Kernels::kMaxTokens (each weight
// block is decoded once per group), rows inside. Kernels, a type local to one ISA file (so each
// file's instantiation is its own, compiled with its flags), provides the dot products of one
// weight row (n_sb super-blocks) with NR tokens, out[j] for token j:
//   template <typename Block, int NR> static void ScaledMinRow(const uint8_t* row, int64_t n_sb,
//                                                             const KQuantToken* tok, float* out);
//   template <int NR> static void Q6Row(same arguments);
// Block is quant::BlockQ4_K or BlockQ5_K.
template <typename Kernels, DType T, int NR>
void KQuantRows(const MatMulArgs& a, int64_t r0, int64_t r1, const KQuantToken* tokens,
                float* const* y) {
  const int64_t n_sb = a.w.cols / kQK_K;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(a.w.data) + r * a.w.row_bytes;
    float out[NR];
    if constexpr (T == DType::kQ4_K) {
      Kernels::template ScaledMinRow<BlockQ4_K, NR>(row, n_sb, tokens, out);
    } else if constexpr (T == DType::kQ5_K) {
      Kernels::template ScaledMinRow<BlockQ5_K, NR>(row, n_sb, tokens, out);
    } else {
      Kernels::template Q6Row<NR>(row, n_sb, tokens, out);
    }
    for (int j = 0; j < NR; ++j) y[j][r] = out[j];
  }
}

template <typename Kernels>
void KQuantTileWith(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  constexpr int kMax = Kernels::kMaxTokens;
  static_assert(kMax >= 1 && kMax <= kKQuantMaxTokens);
  const MatrixView& w = a.w;
  float sums[kMax][kMaxKQuantCols / 16];
  KQuantToken tokens[kMax];
  float* y[kMax];
  for (int64_t t = t0; t < t1; t += kMax) {
    const int nr = static_cast<int>(std::min<int64_t>(kMax, t1 - t));
    for (int j = 0; j < nr; ++j) {
      const uint8_t* acts = a.acts + (t + j) * a.act_stride;
      KQuantActSums(w.type, acts, w.cols, sums[j]);
      tokens[j] = {reinterpret_cast<const int8_t*>(acts),
                   reinterpret_cast<const float*>(acts + ActScalesOffset(w.cols)), sums[j]};
      y[j] = a.y + (t + j) * w.rows;
    }
    auto rows = [&]<DType T>() {
      switch (nr) {
        case 1:
          return KQuantRows<Kernels, T, 1>(a, r0, r1, tokens, y);
        case 2:
          if constexpr (kMax >= 2) return KQuantRows<Kernels, T, 2>(a, r0, r1, tokens, y);
          break;
        case 3:
          if constexpr (kMax >= 3) return KQuantRows<Kernels, T, 3>(a, r0, r1, tokens, y);
          break;
        default:
          if constexpr (kMax >= 4) return KQuantRows<Kernels, T, 4>(a, r0, r1, tokens, y);
      }
    };
    if (w.type == DType::kQ4_K) rows.template operator()<DType::kQ4_K>();
    if (w.type == DType::kQ5_K) rows.template operator()<DType::kQ5_K>();
    if (w.type == DType::kQ6_K) rows.template operator()<DType::kQ6_K>();
  }
}

// The tile for an ISA (ops.cc dispatches K-quant weights here instead of KernelTable::matmul_tile).
MatMulTileFn KQuantMatMulTile(Isa isa);

}  // namespace kvl::ops
