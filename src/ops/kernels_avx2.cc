// AVX2 + FMA + F16C kernels, for x86-64 machines without AVX-512 (and no AVX-VNNI assumed).
// Same structure as kernels_avx512.cc: one MR x NR micro-kernel template per weight type, one
// accumulator per output walking the reduction in fixed steps, so results are batch-invariant.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernel_table.h"
#include "simd_avx2.h"

// g++ contracts a * b + c into an FMA by default in C++ (-ffp-contract=fast), and may do so in one
// inlined copy of an expression and not another. Every fused operation here is an explicit
// _fmadd_ intrinsic instead, so results depend only on the code as written (batch invariance,
// and Rope bit-identical to the scalar path).
#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

constexpr int kMaxMR = 4;
constexpr int kMaxNR = 4;

// A fixed reduction order, shared by every tile shape.
float ReduceAdd(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float ReduceMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [0, n) all ones, for maskload/maskstore of tails (n < 8).
__m256i TailMask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// ---------------------------------------------------------------------------------------------
// Float weights, 8 columns per step.

template <DType T>
__m256 LoadWeights8(const uint8_t* p) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (T == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType T, int MR, int NR>
void FloatTile(const MatMulArgs& a, int64_t r, int64_t t) {
  constexpr int64_t kElem = T == DType::kF32 ? 4 : 2;
  const int64_t cols = a.w.cols;
  const int64_t row_bytes = a.w.row_bytes;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + r * row_bytes;
  const float* x = a.x + t * cols;
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    __m256 xv[NR];
    for (int j = 0; j < NR; ++j) xv[j] = _mm256_loadu_ps(x + j * cols + k);
    for (int i = 0; i < MR; ++i) {
      const __m256 wv = LoadWeights8<T>(w + i * row_bytes + k * kElem);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  if (k < cols) {  // tail through zero-padded copies: the padding adds exact zeros
    const int64_t n = cols - k;
    const __m256i m = TailMask(n);
    __m256 xv[NR];
    for (int j = 0; j < NR; ++j) xv[j] = _mm256_maskload_ps(x + j * cols + k, m);
    for (int i = 0; i < MR; ++i) {
      alignas(32) uint8_t buf[32] = {};
      std::memcpy(buf, w + i * row_bytes + k * kElem, static_cast<size_t>(n * kElem));
      const __m256 wv = LoadWeights8<T>(buf);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  float* y = a.y + t * a.w.rows + r;
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[j * a.w.rows + i] = ReduceAdd(acc[i][j]);
}

// ---------------------------------------------------------------------------------------------
// Quantized weights, one 32-element block per ymm. Without VNNI, products go through maddubs
// (u8 x s8 -> s16 pairs): |w| as the unsigned side and x with w's sign as the signed side, so no
// pair can saturate (128 * 127 * 2 < 32768). madd against ones sums 4 products per int32 lane;
// each lane's integer is exact, then it is scaled by dw * dx in float.

template <DType T>
constexpr int64_t kBlockBytes = T == DType::kQ8_0 ? 34 : 18;

template <DType T>
__m256i DecodeBlock(const uint8_t* block) {
  if constexpr (T == DType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v),
                                       _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(n, _mm256_set1_epi8(8));
  }
}

float LoadFp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

template <DType T, int MR, int NR>
void QuantTile(const MatMulArgs& a, int64_t r, int64_t t) {
  constexpr int64_t kBB = kBlockBytes<T>;
  const int64_t cols = a.w.cols;
  const int64_t row_bytes = a.w.row_bytes;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + r * row_bytes;
  const uint8_t* acts = a.acts + t * a.act_stride;
  const int64_t stride = a.act_stride;
  const int64_t scales_offset = ActScalesOffset(cols);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / 32; ++b) {
    __m256i xv[NR];
    float dx[NR];
    for (int j = 0; j < NR; ++j) {
      xv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acts + j * stride + b * 32));
      dx[j] = reinterpret_cast<const float*>(acts + j * stride + scales_offset)[b];
    }
    for (int i = 0; i < MR; ++i) {
      const uint8_t* block = w + i * row_bytes + b * kBB;
      const __m256i wv = DecodeBlock<T>(block);
      const __m256i wabs = _mm256_sign_epi8(wv, wv);
      const float dw = LoadFp16(block);
      for (int j = 0; j < NR; ++j) {
        const __m256i p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xv[j], wv));
        const __m256i dot = _mm256_madd_epi16(p16, ones);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * dx[j]), acc[i][j]);
      }
    }
  }
  float* y = a.y + t * a.w.rows + r;
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[j * a.w.rows + i] = ReduceAdd(acc[i][j]);
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

template <DType T>
void MatMulTileT(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  for (int64_t r = r0; r < r1; r += kMaxMR) {
    const int64_t mr = std::min<int64_t>(kMaxMR, r1 - r);
    for (int64_t t = t0; t < t1; t += kMaxNR) {
      const int64_t nr = std::min<int64_t>(kMaxNR, t1 - t);
      kTiles<T>[mr - 1][nr - 1](a, r, t);
    }
  }
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

// Same bytes as ScalarQuantizeActs (see kernels_avx512.cc for why).
void QuantizeActs(const float* x, int64_t cols, uint8_t* out) {
  auto* scales = reinterpret_cast<float*>(out + ActScalesOffset(cols));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < cols / 32; ++b) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + b * 32 + 8 * i);
      m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
    }
    const float d = ReduceMax(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    scales[b] = d;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));
    // packs work within 128-bit lanes; the permute restores element order.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + b * 32),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

// ---------------------------------------------------------------------------------------------
// Vector ops.

// Bytes per element of a row stored as T.
template <DType T>
constexpr int64_t kElemBytes = T == DType::kF32 ? 4 : 2;

// The first len (< 8) elements at p, widened to f32, zeros above. f32 uses a masked load; halves
// go through a zero-padded copy (AVX2 has no 16-bit masked load). Either way the lanes above len
// are exact zeros, as the f32 kernels' maskloads give.
template <DType T>
__m256 LoadPartial8(const uint8_t* p, int64_t len) {
  if constexpr (T == DType::kF32) {
    return _mm256_maskload_ps(reinterpret_cast<const float*>(p), TailMask(len));
  } else {
    alignas(16) uint8_t buf[16] = {};
    std::memcpy(buf, p, static_cast<size_t>(len * 2));
    return LoadWeights8<T>(buf);
  }
}

// Dot over b stored as T (f32, or f16 / bf16 widened in registers, which is exact): the one
// accumulation order of Dot and DotRowsHalf, so f32 and half rows give the same result for the
// same values.
template <DType T>
inline float DotT(const float* a, const uint8_t* b, int64_t n) {
  constexpr int64_t kE = kElemBytes<T>;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LoadWeights8<T>(b + i * kE), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), LoadWeights8<T>(b + (i + 8) * kE), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), LoadWeights8<T>(b + (i + 16) * kE), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), LoadWeights8<T>(b + (i + 24) * kE), acc3);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LoadWeights8<T>(b + i * kE), acc0);
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), LoadPartial8<T>(b + i * kE, n - i), acc1);
  }
  return ReduceAdd(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

float Dot(const float* a, const float* b, int64_t n) {
  return DotT<DType::kF32>(a, reinterpret_cast<const uint8_t*>(b), n);
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float ss = Dot(x, x, n);
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(n) + eps));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale),
                                            _mm256_loadu_ps(weight + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(out + i, m,
                        _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), scale),
                                      _mm256_maskload_ps(weight + i, m)));
  }
}

void Softmax(float* x, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float max = ReduceMax(vmax);
  for (int64_t j = i; j < n; ++j) max = std::max(max, x[j]);
  const __m256 maxv = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), maxv));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(m),
                                   Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), maxv)));
    _mm256_maskstore_ps(x + i, m, e);
    sum = _mm256_add_ps(sum, e);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / ReduceAdd(sum));
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv));
  }
}

__m256 SiluTimes(__m256 g, __m256 u) {
  const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), Exp(_mm256_sub_ps(_mm256_setzero_ps(), g)));
  return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(gate + i, SiluTimes(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(gate + i, m, SiluTimes(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
  }
}

void Add(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) y[i] += x[i];
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
  }
}

// ---------------------------------------------------------------------------------------------
// Attention over f16 / bf16 rows (ops.h, DotRowsHalf / AxpyRowsHalf). This table has no dot_rows /
// axpy_rows, so DotRows / AxpyRows are loops over Dot / Axpy; these must match those loops over
// the widened rows.

template <DType T>
void DotRowsHalfT(const float* q, const uint16_t* rows, int64_t stride, int64_t count, int64_t n,
                  float scale, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = DotT<T>(q, reinterpret_cast<const uint8_t*>(rows + i * stride), n) * scale;
  }
}

// y stays in registers across all rows (V vectors of 8 columns from column c; with kTail, the
// len < 8 columns from c in one partial vector), instead of being loaded and stored once per row
// as the loop over Axpy does. Each y element still takes Axpy's one fmadd per row, rows in order,
// so the result is bit-identical to that loop. V is a template argument so the accumulators stay
// in registers.
template <DType T, int V, bool kTail>
void AxpyRowsBlock(const float* weights, const uint16_t* rows, int64_t stride, int64_t count,
                   int64_t c, int64_t len, float* y) {
  __m256 acc[V];
  for (int v = 0; v < V; ++v) {
    acc[v] = kTail ? _mm256_maskload_ps(y + c, TailMask(len)) : _mm256_loadu_ps(y + c + 8 * v);
  }
  for (int64_t i = 0; i < count; ++i) {
    const __m256 w = _mm256_set1_ps(weights[i]);
    const auto* row = reinterpret_cast<const uint8_t*>(rows + i * stride + c);
    for (int v = 0; v < V; ++v) {
      const __m256 x = kTail ? LoadPartial8<T>(row, len) : LoadWeights8<T>(row + 16 * v);
      acc[v] = _mm256_fmadd_ps(w, x, acc[v]);
    }
  }
  for (int v = 0; v < V; ++v) {
    if (kTail) {
      _mm256_maskstore_ps(y + c, TailMask(len), acc[v]);
    } else {
      _mm256_storeu_ps(y + c + 8 * v, acc[v]);
    }
  }
}

template <DType T>
void AxpyRowsHalfT(const float* weights, const uint16_t* rows, int64_t stride, int64_t count,
                   int64_t n, float* y) {
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) AxpyRowsBlock<T, 4, false>(weights, rows, stride, count, c, 32, y);
  for (; c + 8 <= n; c += 8) AxpyRowsBlock<T, 1, false>(weights, rows, stride, count, c, 8, y);
  if (c < n) AxpyRowsBlock<T, 1, true>(weights, rows, stride, count, c, n - c, y);
}

void DotRowsHalf(DType type, const float* q, const uint16_t* rows, int64_t stride, int64_t count,
                 int64_t n, float scale, float* out) {
  if (type == DType::kF16) return DotRowsHalfT<DType::kF16>(q, rows, stride, count, n, scale, out);
  DotRowsHalfT<DType::kBF16>(q, rows, stride, count, n, scale, out);
}

void AxpyRowsHalf(DType type, const float* weights, const uint16_t* rows, int64_t stride,
                  int64_t count, int64_t n, float* y) {
  if (type == DType::kF16) return AxpyRowsHalfT<DType::kF16>(weights, rows, stride, count, n, y);
  AxpyRowsHalfT<DType::kBF16>(weights, rows, stride, count, n, y);
}

// f32 -> f16 / bf16, 8 lanes, the bits of quant::Fp32ToFp16 / Fp32ToBf16 (see kernels_avx512.cc
// for why vcvtps2ph and the integer bf16 rounding give exactly those).
template <DType T>
__m128i Narrow8(__m256 v) {
  if constexpr (T == DType::kF16) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  } else {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
    // |x| > inf as signed integers (|x| < 2^31, so the signed compare is the unsigned one).
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane is in [0, 0xFFFF], so the unsigned-saturating pack is exact.
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
}

template <DType T>
void NarrowRowT(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Narrow8<T>(_mm256_loadu_ps(x + i)));
  }
  if (i < n) {
    alignas(16) uint16_t buf[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf),
                    Narrow8<T>(_mm256_maskload_ps(x + i, TailMask(n - i))));
    std::memcpy(out + i, buf, static_cast<size_t>(n - i) * 2);
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
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadWeights8<T>(bytes + 2 * i));
  if (i < n) {
    _mm256_maskstore_ps(out + i, TailMask(n - i), LoadPartial8<T>(bytes + 2 * i, n - i));
  }
}

void WidenRow(DType type, const uint16_t* x, int64_t n, float* out) {
  if (type == DType::kF16) return WidenRowT<DType::kF16>(x, n, out);
  WidenRowT<DType::kBF16>(x, n, out);
}

// ---------------------------------------------------------------------------------------------
// q8_0 / q4_0 cache rows (ops.h, DequantizeCols): whole blocks widened 8 codes at a time, each
// value code * d in one multiply, as the scalar reference does; partial blocks (a head narrower
// than a block, or not on a block boundary) go to the scalar reference.

void DequantizeBlock(DType type, const uint8_t* block, float* out) {
  const __m256 d = _mm256_set1_ps(LoadFp16(block));
  __m128i codes[4];
  if (type == DType::kQ8_0) {
    for (int k = 0; k < 4; ++k) codes[k] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * k));
  } else {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
    codes[0] = lo;
    codes[1] = _mm_srli_si128(lo, 8);
    codes[2] = hi;
    codes[3] = _mm_srli_si128(hi, 8);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes[k])), d));
  }
}

void DequantizeCols(DType type, const uint8_t* row, int64_t col, int64_t n, float* out) {
  DequantizeColsBy(DequantizeBlock, type, row, col, n, out);
}

}  // namespace

const KernelTable& Avx2Kernels() {
  static const KernelTable table = {
      .matmul_tile = MatMulTile,
      .quantize_acts = QuantizeActs,
      .rms_norm = RmsNorm,
      .rope = ScalarRope,
      .softmax = Softmax,
      .swiglu = SwiGlu,
      .add = Add,
      .dot = Dot,
      .axpy = Axpy,
      .dot_rows_half = DotRowsHalf,
      .axpy_rows_half = AxpyRowsHalf,
      .narrow_row = NarrowRow,
      .widen_row = WidenRow,
      .dequantize_cols = DequantizeCols,
      .pack_attention_keys = ScalarPackAttentionKeys,
      .attention_tile = Avx2AttentionTile,
      .hadamard_rows = Avx2HadamardRows,
  };
  return table;
}

}  // namespace kvl::ops
