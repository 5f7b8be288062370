// AVX-512 kernels of the tiled online-softmax attention (ops.h, PackAttentionKeys /
// AttentionTile).
//
// Keys are packed transposed (a vector holds one channel of 16 keys), so the scores of up to 4
// query rows x 64 keys live in 16 accumulators that walk the channels with one broadcast
// multiply-add each; values are read as rows, 4 query rows x 64 channels in 16 accumulators
// walking the keys. Every lane of every accumulator makes the same operations in the same order
// whatever the block it sits in, so a row's result does not depend on the rows beside it.
#include <immintrin.h>

// GCC 12's reductions and casts read an intentionally undefined register (see kernels_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernel_table.h"
#include "simd_avx512.h"

// Every fused operation is an explicit _fmadd_ intrinsic (see kernels_avx512.cc).
#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

constexpr int kRowBlock = 4;  // query rows per register block
constexpr int kVecBlock = 4;  // 16-lane vectors per register block (64 keys or 64 channels)

__mmask16 LowLanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

template <DType T>
__m512 LoadRow16(const void* rows, int64_t e, __mmask16 m) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(rows) + e);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(rows) + e);
    if constexpr (T == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// x[i] = row i, 16 columns; afterwards x[c] = column c of the 16 rows.
void Transpose16(__m512 x[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
  }
  // u[4k + m], 128-bit lane L: column 4L + m of rows 4k..4k+3.
  for (int k = 0; k < 4; ++k) {
    u[4 * k + 0] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512 lo01 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44);
    const __m512 hi01 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
    const __m512 lo23 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
    const __m512 hi23 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
    x[m] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
    x[4 + m] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
    x[8 + m] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
    x[12 + m] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
  }
}

template <DType T>
void PackKeys(const void* rows, int64_t stride, int64_t count, int64_t head_dim, float* kt,
              int64_t width, int64_t col) {
  for (int64_t i0 = 0; i0 < count; i0 += 16) {
    const int64_t nr = std::min<int64_t>(16, count - i0);
    const __mmask16 row_mask = LowLanes(nr);
    for (int64_t c0 = 0; c0 < head_dim; c0 += 16) {
      const int64_t nc = std::min<int64_t>(16, head_dim - c0);
      const __mmask16 col_mask = LowLanes(nc);
      __m512 x[16];
      for (int64_t i = 0; i < 16; ++i) {
        x[i] = i < nr ? LoadRow16<T>(rows, (i0 + i) * stride + c0, col_mask) : _mm512_setzero_ps();
      }
      Transpose16(x);
      for (int64_t c = 0; c < nc; ++c) {
        _mm512_mask_storeu_ps(kt + (c0 + c) * width + col + i0, row_mask, x[c]);
      }
    }
  }
}

// s[r][16 b + lane] = scale * sum_c q_r[c] * kt[c][16 b + lane] for R rows and B vectors of keys.
template <int R, int B>
void Scores(const float* const* q, const float* kt, int64_t width, int64_t head_dim, float scale,
            float (*s)[kMaxAttentionTileTokens]) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < head_dim; ++c) {
    const float* k = kt + c * width;
    __m512 kv[B];
    for (int b = 0; b < B; ++b) kv[b] = _mm512_load_ps(k + 16 * b);
    for (int r = 0; r < R; ++r) {
      const __m512 qc = _mm512_set1_ps(q[r][c]);
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(qc, kv[b], acc[r][b]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(s[r] + 16 * b, _mm512_mul_ps(acc[r][b], vscale));
  }
}

template <int R>
void ScoresRows(const float* const* q, const float* kt, int64_t width, int64_t head_dim,
                float scale, int64_t vecs, float (*s)[kMaxAttentionTileTokens]) {
  switch (vecs) {
    case 1: return Scores<R, 1>(q, kt, width, head_dim, scale, s);
    case 2: return Scores<R, 2>(q, kt, width, head_dim, scale, s);
    case 3: return Scores<R, 3>(q, kt, width, head_dim, scale, s);
    default: return Scores<R, 4>(q, kt, width, head_dim, scale, s);
  }
}

// acc_r[c0 + 16 b + lane] = acc_r[...] * a_r + sum_j p[r][j] * v[j][c0 + 16 b + lane], j in order.
template <int R, int B>
void Mix(float* const* acc, const float* a, const float (*p)[kMaxAttentionTileTokens],
         const float* const* v, int64_t count, int64_t c0, __mmask16 last_mask) {
  __mmask16 mask[B];
  for (int b = 0; b < B; ++b) mask[b] = b + 1 < B ? static_cast<__mmask16>(0xFFFF) : last_mask;
  __m512 o[R][B];
  for (int r = 0; r < R; ++r) {
    const __m512 ar = _mm512_set1_ps(a[r]);
    for (int b = 0; b < B; ++b) {
      o[r][b] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[b], acc[r] + c0 + 16 * b), ar);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 vv[B];
    for (int b = 0; b < B; ++b) vv[b] = _mm512_maskz_loadu_ps(mask[b], v[j] + c0 + 16 * b);
    for (int r = 0; r < R; ++r) {
      const __m512 pj = _mm512_set1_ps(p[r][j]);
      for (int b = 0; b < B; ++b) o[r][b] = _mm512_fmadd_ps(pj, vv[b], o[r][b]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) _mm512_mask_storeu_ps(acc[r] + c0 + 16 * b, mask[b], o[r][b]);
  }
}

template <int R>
void MixRows(float* const* acc, const float* a, const float (*p)[kMaxAttentionTileTokens],
             const float* const* v, int64_t count, int64_t head_dim) {
  for (int64_t c0 = 0; c0 < head_dim; c0 += 16 * kVecBlock) {
    const int64_t n = std::min<int64_t>(16 * kVecBlock, head_dim - c0);
    const __mmask16 last = LowLanes(n - 16 * ((n - 1) / 16));
    switch ((n + 15) / 16) {
      case 1: Mix<R, 1>(acc, a, p, v, count, c0, last); break;
      case 2: Mix<R, 2>(acc, a, p, v, count, c0, last); break;
      case 3: Mix<R, 3>(acc, a, p, v, count, c0, last); break;
      default: Mix<R, 4>(acc, a, p, v, count, c0, last); break;
    }
  }
}

// Rows [r0, r0 + R): scores, the online-softmax update of m and l, then the values.
template <int R>
void TileRows(const float* kt, int64_t width, const float* const* v, int64_t count,
              int64_t head_dim, float scale, const AttentionRows& rows, int64_t r0) {
  alignas(64) float s[R][kMaxAttentionTileTokens];
  const int64_t vecs = (count + 15) / 16;
  ScoresRows<R>(rows.q + r0, kt, width, head_dim, scale, vecs, s);
  const __mmask16 last = LowLanes(count - 16 * (vecs - 1));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float a[R];
  for (int r = 0; r < R; ++r) {
    if (rows.scores != nullptr && rows.scores[r0 + r] != nullptr) {
      float* out = rows.scores[r0 + r];
      for (int64_t b = 0; b < vecs; ++b) {
        _mm512_mask_storeu_ps(out + 16 * b, b + 1 < vecs ? 0xFFFF : last, _mm512_load_ps(s[r] + 16 * b));
      }
    }
    __m512 vmax = _mm512_set1_ps(neg_inf);
    for (int64_t b = 0; b < vecs; ++b) {
      vmax = _mm512_mask_max_ps(vmax, b + 1 < vecs ? 0xFFFF : last, vmax, _mm512_load_ps(s[r] + 16 * b));
    }
    const float m_old = rows.m[r0 + r];
    const float m_new = std::max(m_old, _mm512_reduce_max_ps(vmax));
    a[r] = m_old == neg_inf ? 0.0f
                            : _mm512_cvtss_f32(Exp(_mm512_set1_ps(m_old - m_new)));
    const __m512 vm = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t b = 0; b < vecs; ++b) {
      const __mmask16 m = b + 1 < vecs ? 0xFFFF : last;
      const __m512 e = _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_load_ps(s[r] + 16 * b), vm)));
      _mm512_store_ps(s[r] + 16 * b, e);
      sum = _mm512_add_ps(sum, e);
    }
    rows.m[r0 + r] = m_new;
    rows.l[r0 + r] = rows.l[r0 + r] * a[r] + _mm512_reduce_add_ps(sum);
  }
  MixRows<R>(rows.acc + r0, a, s, v, count, head_dim);
}

}  // namespace

void Avx512PackAttentionKeys(DType type, const void* rows, int64_t stride, int64_t count,
                             int64_t head_dim, float* kt, int64_t width, int64_t col) {
  switch (type) {
    case DType::kF32: return PackKeys<DType::kF32>(rows, stride, count, head_dim, kt, width, col);
    case DType::kF16: return PackKeys<DType::kF16>(rows, stride, count, head_dim, kt, width, col);
    default: return PackKeys<DType::kBF16>(rows, stride, count, head_dim, kt, width, col);
  }
}

void Avx512AttentionTile(const float* kt, int64_t width, const float* const* v, int64_t count,
                         int64_t head_dim, float scale, const AttentionRows& rows) {
  int64_t r = 0;
  for (; r + kRowBlock <= rows.num_rows; r += kRowBlock) {
    TileRows<kRowBlock>(kt, width, v, count, head_dim, scale, rows, r);
  }
  switch (rows.num_rows - r) {
    case 1: return TileRows<1>(kt, width, v, count, head_dim, scale, rows, r);
    case 2: return TileRows<2>(kt, width, v, count, head_dim, scale, rows, r);
    case 3: return TileRows<3>(kt, width, v, count, head_dim, scale, rows, r);
    default: return;
  }
}

}  // namespace kvl::ops
