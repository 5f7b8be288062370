// AVX-512 kernels (F/BW/VL/DQ + VNNI). Compiled with AVX-512 flags; only called after CPUID said so.
//
// MatMul is one register-tiled micro-kernel, templated on its tile size (MR weight rows x NR
// tokens, up to 4 x 4). Each output element owns one vector accumulator that walks the reduction
// dimension in the same steps (16 floats, or a pair of 32-element blocks) whatever MR and NR are,
// and is reduced horizontally by the same instruction sequence. Decode is the NR = 1 case of the
// same template, so a token's outputs are bit-identical in decode, in any prefill tile and on any
// thread (the batch invariance promised in ops.h).
#include <immintrin.h>

// GCC 12's cast intrinsics (_mm512_castps128_ps512 and friends) read an intentionally undefined
// register and trip -Wuninitialized on every use; the upper lanes are never read here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>

#include "kernel_table.h"
#include "simd_avx512.h"

// g++ contracts a * b + c into an FMA by default in C++ (-ffp-contract=fast), and may do so in one
// inlined copy of an expression and not another. Every fused operation here is an explicit
// _fmadd_ intrinsic instead, so results depend only on the code as written (batch invariance,
// and Rope bit-identical to the scalar path).
#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

constexpr int kMaxMR = 4;
constexpr int kMaxNR = 4;

__mmask16 TailMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// ---------------------------------------------------------------------------------------------
// Float weights: W[r][k] widened to f32 on the fly, 16 columns per step.

template <DType T>
__m512 LoadWeights16(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
    if constexpr (T == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType T>
__m512 LoadWeightsMasked(const uint8_t* row, int64_t k, __mmask16 m) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + k);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * k);
    if constexpr (T == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType T, int MR, int NR>
void FloatTile(const MatMulArgs& a, int64_t r, int64_t t) {
  const int64_t cols = a.w.cols;
  const int64_t row_bytes = a.w.row_bytes;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + r * row_bytes;
  const float* x = a.x + t * cols;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    __m512 xv[NR];
    for (int j = 0; j < NR; ++j) xv[j] = _mm512_loadu_ps(x + j * cols + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 wv = LoadWeights16<T>(w + i * row_bytes, k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  if (k < cols) {  // masked tail: the zeroed lanes add exact zeros
    const __mmask16 m = TailMask(cols - k);
    __m512 xv[NR];
    for (int j = 0; j < NR; ++j) xv[j] = _mm512_maskz_loadu_ps(m, x + j * cols + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 wv = LoadWeightsMasked<T>(w + i * row_bytes, k, m);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  float* y = a.y + t * a.w.rows + r;
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[j * a.w.rows + i] = _mm512_reduce_add_ps(acc[i][j]);
}

// ---------------------------------------------------------------------------------------------
// Quantized weights against int8 activations, two 32-element blocks per zmm.
//
// vpdpbusd multiplies unsigned by signed bytes. The weights are made the unsigned side: Q4_0's
// nibbles n = w + 8 already are, and Q8_0's w + 128 is one xor with 0x80. The activations stay
// signed, and each int32 lane starts at -C * (sum of its 4 activations) (C = 8 or 128), computed
// once per token and reused for every row of the tile. The lane then holds exactly sum(x * w)
// over its 4 bytes, so the integer is the same whatever the tile shape.
// Lanes 0-7 belong to the first block, 8-15 to the second; each lane is converted to float and
// accumulated with the combined scale dw * dx of its block.

template <DType T>
constexpr int64_t kBlockBytes = T == DType::kQ8_0 ? 34 : 18;

template <DType T>
__m512i DecodePair(const uint8_t* block) {
  if constexpr (T == DType::kQ8_0) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 36));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  } else {
    // 128-bit chunks [A A B B]; shifting chunks 1 and 3 by 4 puts element j of each block at
    // byte j (low nibbles, elements 0-15) and 16 + j (high nibbles, elements 16-31).
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
    v = _mm512_mask_broadcast_i32x4(
        v, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 20)));
    v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));  // nibbles, unsigned 0..15
  }
}

// The last block of a row with an odd block count: the upper half is zero.
template <DType T>
__m512i DecodeSingle(const uint8_t* block) {
  if constexpr (T == DType::kQ8_0) {
    return _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)));
  } else {
    __m512i v = _mm512_maskz_broadcast_i32x4(
        0x00FF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
    v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
  }
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

// [f0 x 8, f1 x 8] from the first two floats of v.
__m512 SpreadPair(__m128 v) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

// Decode streams each weight row once from DRAM; a software prefetch a few cache lines ahead per
// row keeps more misses in flight than the hardware prefetcher does across MR streams.
constexpr int64_t kPrefetchBytes = 2048;

template <DType T, bool kPair, int MR, int NR>
inline void QuantStep(const uint8_t* w, int64_t row_bytes, const uint8_t* acts, int64_t stride,
                      int64_t scales_offset, int64_t b, __m512 (&acc)[MR][NR]) {
  constexpr int64_t kBB = kBlockBytes<T>;
  constexpr bool kQ8 = T == DType::kQ8_0;
  const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i offset = kQ8 ? k80 : _mm512_set1_epi8(8);  // what makes the weights unsigned
  const __m512i zero = _mm512_setzero_si512();
  __m512i xv[NR];      // signed activations
  __m512i x_init[NR];  // -C * sum4(x) per lane
  __m512 dx[NR];
  for (int j = 0; j < NR; ++j) {
    const uint8_t* xr = acts + j * stride + b * 32;
    const float* dr = reinterpret_cast<const float*>(acts + j * stride + scales_offset) + b;
    if constexpr (kPair) {
      xv[j] = _mm512_loadu_si512(xr);
      dx[j] = SpreadPair(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(dr))));
    } else {
      xv[j] = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr)));
      dx[j] = SpreadPair(_mm_load_ss(dr));
    }
    x_init[j] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, xv[j]));
  }
  for (int i = 0; i < MR; ++i) {
    const uint8_t* block = w + i * row_bytes + b * kBB;
    _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchBytes, _MM_HINT_T0);
    __m512i wv = kPair ? DecodePair<T>(block) : DecodeSingle<T>(block);
    if constexpr (kQ8) wv = _mm512_xor_si512(wv, k80);
    const uint32_t halves =
        LoadU16(block) | (kPair ? static_cast<uint32_t>(LoadU16(block + kBB)) << 16 : 0u);
    const __m512 dw = SpreadPair(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves))));
    for (int j = 0; j < NR; ++j) {
      const __m512i dot = _mm512_dpbusd_epi32(x_init[j], wv, xv[j]);
      acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, dx[j]), acc[i][j]);
    }
  }
}

template <DType T, int MR, int NR>
void QuantTile(const MatMulArgs& a, int64_t r, int64_t t) {
  const int64_t cols = a.w.cols;
  const int64_t nb = cols / 32;
  const int64_t row_bytes = a.w.row_bytes;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + r * row_bytes;
  const uint8_t* acts = a.acts + t * a.act_stride;
  const int64_t scales_offset = ActScalesOffset(cols);
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    QuantStep<T, true, MR, NR>(w, row_bytes, acts, a.act_stride, scales_offset, b, acc);
  }
  if (b < nb) QuantStep<T, false, MR, NR>(w, row_bytes, acts, a.act_stride, scales_offset, b, acc);
  float* y = a.y + t * a.w.rows + r;
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[j * a.w.rows + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <DType T, int MR, int NR>
void Tile(const MatMulArgs& a, int64_t r, int64_t t) {
  if constexpr (T == DType::kQ8_0 || T == DType::kQ4_0) {
    QuantTile<T, MR, NR>(a, r, t);
  } else {
    FloatTile<T, MR, NR>(a, r, t);
  }
}

using TileFn = void (*)(const MatMulArgs&, int64_t, int64_t);

template <DType T>
constexpr TileFn kTiles[kMaxMR][kMaxNR] = {
    {Tile<T, 1, 1>, Tile<T, 1, 2>, Tile<T, 1, 3>, Tile<T, 1, 4>},
    {Tile<T, 2, 1>, Tile<T, 2, 2>, Tile<T, 2, 3>, Tile<T, 2, 4>},
    {Tile<T, 3, 1>, Tile<T, 3, 2>, Tile<T, 3, 3>, Tile<T, 3, 4>},
    {Tile<T, 4, 1>, Tile<T, 4, 2>, Tile<T, 4, 3>, Tile<T, 4, 4>},
};

// One weight row against up to 8 tokens: the small-batch decode tile (see MatMulTileT).
template <DType T>
constexpr TileFn kWideTiles[8] = {Tile<T, 1, 1>, Tile<T, 1, 2>, Tile<T, 1, 3>, Tile<T, 1, 4>,
                                  Tile<T, 1, 5>, Tile<T, 1, 6>, Tile<T, 1, 7>, Tile<T, 1, 8>};

template <DType T>
void MatMulTileT(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  // Decode streams its weights from DRAM one row at a time: one sequential stream per thread keeps
  // the hardware prefetchers on track, where four interleaved row streams did not (TinyLlama-1.1B
  // Q8_0 decode: 16 tok/s with 4-row tiles, 25-28 with 1-row tiles). Each output still takes the
  // same accumulation steps whatever the tile, so this changes no result.
  // The same holds for a few tokens (batched decode of a few sequences): one row at a time, each
  // decoded weight block used for all of them (TinyLlama np4 decode 62 -> 80 tok/s, np8 78 -> 88).
  ForEachTile<8, 1, kMaxMR, kMaxNR>(
      r0, r1, t0, t1, [&](int64_t r, int64_t, int64_t nt) { kWideTiles<T>[nt - 1](a, r, t0); },
      [&](int64_t r, int64_t t, int64_t mr, int64_t nr) { kTiles<T>[mr - 1][nr - 1](a, r, t); });
}

void MatMulTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  switch (a.w.type) {
    case DType::kF32:
      return MatMulTileT<DType::kF32>(a, r0, r1, t0, t1);
    case DType::kF16:
      return MatMulTileT<DType::kF16>(a, r0, r1, t0, t1);
    case DType::kBF16:
      return MatMulTileT<DType::kBF16>(a, r0, r1, t0, t1);
    case DType::kQ8_0:
      return MatMulTileT<DType::kQ8_0>(a, r0, r1, t0, t1);
    default:
      return MatMulTileT<DType::kQ4_0>(a, r0, r1, t0, t1);
  }
}

// Same bytes as ScalarQuantizeActs: amax is exact, d and 1/d are single IEEE operations and
// cvtps2dq rounds half to even like nearbyint in the default rounding mode.
void QuantizeActs(const float* x, int64_t cols, uint8_t* out) {
  auto* scales = reinterpret_cast<float*>(out + ActScalesOffset(cols));
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32);
    const __m512 v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const __m512 m = _mm512_max_ps(_mm512_and_ps(v0, abs_mask), _mm512_and_ps(v1, abs_mask));
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    scales[b] = d;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * 32), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * 32 + 16), _mm512_cvtsepi32_epi8(q1));
  }
}

// ---------------------------------------------------------------------------------------------
// Vector ops. Tails use masked loads so every size takes the same code; results depend only on
// the ISA and n.

// Dot over b stored as T (f32, or f16 / bf16 widened in registers, which is exact): the one
// accumulation order of Dot, DotRows and DotRowsHalf, so f32 and half rows give the same result
// for the same values.
template <DType T>
inline float DotInline(const float* a, const uint8_t* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LoadWeights16<T>(b, i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), LoadWeights16<T>(b, i + 16), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), LoadWeights16<T>(b, i + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), LoadWeights16<T>(b, i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LoadWeights16<T>(b, i), acc0);
  }
  if (i < n) {  // masked tail: the zeroed lanes add exact zeros
    const __mmask16 m = TailMask(n - i);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), LoadWeightsMasked<T>(b, i, m), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// Bytes per element of a row stored as T.
template <DType T>
constexpr int64_t kElemBytes = T == DType::kF32 ? 4 : 2;

float Dot(const float* a, const float* b, int64_t n) {
  return DotInline<DType::kF32>(a, reinterpret_cast<const uint8_t*>(b), n);
}

// Attention scores over a run of cached K rows: Dot inlined per row (the same instructions, so the
// same results), without a call through the kernel table per row.
template <DType T>
void DotRowsT(const float* q, const uint8_t* rows, int64_t stride, int64_t count, int64_t n,
              float scale, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = DotInline<T>(q, rows + i * stride * kElemBytes<T>, n) * scale;
  }
}

void DotRows(const float* q, const float* rows, int64_t stride, int64_t count, int64_t n,
             float scale, float* out) {
  DotRowsT<DType::kF32>(q, reinterpret_cast<const uint8_t*>(rows), stride, count, n, scale, out);
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float ss = Dot(x, x, n);
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(n) + eps));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), scale),
                                            _mm512_loadu_ps(weight + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale),
                                        _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

void Softmax(float* x, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
  if (i < n) vmax = _mm512_mask_max_ps(vmax, TailMask(n - i), vmax, _mm512_maskz_loadu_ps(TailMask(n - i), x + i));
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), max));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

__m512 SiluTimes(__m512 g, __m512 u) {
  const __m512 sig_den = _mm512_add_ps(_mm512_set1_ps(1.0f), Exp(_mm512_sub_ps(_mm512_setzero_ps(), g)));
  return _mm512_mul_ps(_mm512_div_ps(g, sig_den), u);
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(gate + i, SiluTimes(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(gate + i, m,
                          SiluTimes(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void Add(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// Attention's weighted sum of V rows: y stays in registers (64 columns at a time) across all rows
// instead of being loaded and stored once per row as a loop over Axpy would. The fmadd per element
// and the row order are Axpy's, so the result is bit-identical to that loop; rows stored as f16 /
// bf16 are widened exactly in registers and take the same fmadds.
template <DType T>
void AxpyRowsT(const float* weights, const uint8_t* rows, int64_t stride, int64_t count,
               int64_t n, float* y) {
  for (int64_t c = 0; c < n; c += 64) {
    __mmask16 m[4];
    __m512 acc[4];
    for (int v = 0; v < 4; ++v) {
      const int64_t left = n - c - 16 * v;
      m[v] = left <= 0 ? 0 : TailMask(std::min<int64_t>(16, left));
      acc[v] = _mm512_maskz_loadu_ps(m[v], y + c + 16 * v);
    }
    for (int64_t i = 0; i < count; ++i) {
      const __m512 w = _mm512_set1_ps(weights[i]);
      const uint8_t* row = rows + i * stride * kElemBytes<T>;
      for (int v = 0; v < 4; ++v) {
        acc[v] = _mm512_fmadd_ps(w, LoadWeightsMasked<T>(row, c + 16 * v, m[v]), acc[v]);
      }
    }
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(y + c + 16 * v, m[v], acc[v]);
  }
}

void AxpyRows(const float* weights, const float* rows, int64_t stride, int64_t count, int64_t n,
              float* y) {
  AxpyRowsT<DType::kF32>(weights, reinterpret_cast<const uint8_t*>(rows), stride, count, n, y);
}

void DotRowsHalf(DType type, const float* q, const uint16_t* rows, int64_t stride, int64_t count,
                 int64_t n, float scale, float* out) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(rows);
  if (type == DType::kF16) return DotRowsT<DType::kF16>(q, bytes, stride, count, n, scale, out);
  DotRowsT<DType::kBF16>(q, bytes, stride, count, n, scale, out);
}

void AxpyRowsHalf(DType type, const float* weights, const uint16_t* rows, int64_t stride,
                  int64_t count, int64_t n, float* y) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(rows);
  if (type == DType::kF16) return AxpyRowsT<DType::kF16>(weights, bytes, stride, count, n, y);
  AxpyRowsT<DType::kBF16>(weights, bytes, stride, count, n, y);
}

// f32 -> f16 / bf16, 16 lanes, the bits of quant::Fp32ToFp16 / Fp32ToBf16.
// f16: vcvtps2ph with an immediate round-to-nearest-even is the IEEE conversion (subnormal results
// kept, overflow to inf, NaN made quiet with its top payload bits), whatever MXCSR says about
// rounding. bf16: integer rounding rather than AVX512-BF16's vcvtneps2bf16, which flushes
// subnormal inputs to zero (and which RequiredCpuFeatures does not list): add 0x7FFF plus the
// lowest kept bit and truncate; a NaN keeps its top bits with the quiet bit set instead.
template <DType T>
__m256i Narrow16(__m512 v) {
  if constexpr (T == DType::kF16) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  } else {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
  }
}

template <DType T>
void NarrowRowT(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), Narrow16<T>(_mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm256_mask_storeu_epi16(out + i, m, Narrow16<T>(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void NarrowRow(DType type, const float* x, int64_t n, uint16_t* out) {
  if (type == DType::kF16) return NarrowRowT<DType::kF16>(x, n, out);
  NarrowRowT<DType::kBF16>(x, n, out);
}

template <DType T>
void WidenRowT(const uint16_t* x, int64_t n, float* out) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(x);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, LoadWeights16<T>(bytes, i));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(out + i, m, LoadWeightsMasked<T>(bytes, i, m));
  }
}

void WidenRow(DType type, const uint16_t* x, int64_t n, float* out) {
  if (type == DType::kF16) return WidenRowT<DType::kF16>(x, n, out);
  WidenRowT<DType::kBF16>(x, n, out);
}

// Neox pairs are contiguous halves, so they vectorize directly; mul and sub (not FMA) keep the
// results bit-identical to the scalar path. Interleaved pairs are rare and cheap: scalar.
void Rope(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin, bool neox) {
  if (!neox) return ScalarRope(x, n_heads, head_dim, cos, sin, neox);
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v0 = x + h * head_dim;
    float* v1 = v0 + half;
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 m = TailMask(std::min<int64_t>(16, half - i));
      const __m512 a = _mm512_maskz_loadu_ps(m, v0 + i), b = _mm512_maskz_loadu_ps(m, v1 + i);
      const __m512 c = _mm512_maskz_loadu_ps(m, cos + i), s = _mm512_maskz_loadu_ps(m, sin + i);
      _mm512_mask_storeu_ps(v0 + i, m, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
      _mm512_mask_storeu_ps(v1 + i, m, _mm512_add_ps(_mm512_mul_ps(a, s), _mm512_mul_ps(b, c)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// q8_0 / q4_0 cache rows (ops.h, DequantizeCols): a whole block in two 16-lane vectors, each value
// code * d in one multiply, as the scalar reference does (DequantizeColsBy walks the blocks).

void DequantizeBlock(DType type, const uint8_t* block, float* out) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(static_cast<uint16_t>(block[0] | (block[1] << 8))));
  __m128i codes[2];
  if (type == DType::kQ8_0) {
    codes[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    codes[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18));
  } else {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    codes[0] = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
    codes[1] = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
  }
  for (int k = 0; k < 2; ++k) {
    _mm512_storeu_ps(out + 16 * k, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes[k])), d));
  }
}

void DequantizeCols(DType type, const uint8_t* row, int64_t col, int64_t n, float* out) {
  DequantizeColsBy(DequantizeBlock, type, row, col, n, out);
}

}  // namespace

const KernelTable& Avx512Kernels() {
  static const KernelTable table = {
      .matmul_tile = MatMulTile,
      .matmul_packed_tile = Avx512MatMulPackedTile,
      .quantize_acts = QuantizeActs,
      .rms_norm = RmsNorm,
      .rope = Rope,
      .softmax = Softmax,
      .swiglu = SwiGlu,
      .add = Add,
      .dot = Dot,
      .axpy = Axpy,
      .axpy_rows = AxpyRows,
      .dot_rows = DotRows,
      .dot_rows_half = DotRowsHalf,
      .axpy_rows_half = AxpyRowsHalf,
      .narrow_row = NarrowRow,
      .widen_row = WidenRow,
      .dequantize_cols = DequantizeCols,
      .dot_rows_k_int8 = Avx512DotRowsKInt8,
      .dot_rows_k_int4 = Avx512DotRowsKInt4,
      .axpy_rows_v_int8 = Avx512AxpyRowsVInt8,
      .axpy_rows_v_int4 = Avx512AxpyRowsVInt4,
      .pack_attention_keys = Avx512PackAttentionKeys,
      .attention_tile = Avx512AttentionTile,
      .hadamard_rows = Avx512HadamardRows,
  };
  return table;
}

}  // namespace kvl::ops
