// AVX2 kernel of the tiled online-softmax attention (ops.h, AttentionTile): the AVX-512 kernel's
// structure with 8-lane vectors and 2 query rows per register block (16 registers). Every lane
// makes the same operations in the same order whatever its block, so a row's result does not
// depend on the rows beside it. Keys are packed by the scalar kernel (an exact widening).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernel_table.h"
#include "simd_avx2.h"

// Every fused operation is an explicit _fmadd_ intrinsic (see kernels_avx2.cc).
#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

constexpr int kRowBlock = 2;  // query rows per register block
constexpr int kVecBlock = 4;  // 8-lane vectors per register block (32 keys or 32 channels)

// Lanes [0, n) all ones (n <= 8).
__m256i LowLanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

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

// s[r][k0 + 8 b + lane] = scale * sum_c q_r[c] * kt[c][k0 + 8 b + lane].
template <int R, int B>
void Scores(const float* const* q, const float* kt, int64_t width, int64_t head_dim, float scale,
            int64_t k0, float (*s)[kMaxAttentionTileTokens]) {
  __m256 acc[R][B];
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < head_dim; ++c) {
    const float* k = kt + c * width + k0;
    __m256 kv[B];
    for (int b = 0; b < B; ++b) kv[b] = _mm256_load_ps(k + 8 * b);
    for (int r = 0; r < R; ++r) {
      const __m256 qc = _mm256_broadcast_ss(q[r] + c);
      for (int b = 0; b < B; ++b) acc[r][b] = _mm256_fmadd_ps(qc, kv[b], acc[r][b]);
    }
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) {
      _mm256_storeu_ps(s[r] + k0 + 8 * b, _mm256_mul_ps(acc[r][b], vscale));
    }
  }
}

template <int R>
void ScoresRows(const float* const* q, const float* kt, int64_t width, int64_t head_dim,
                float scale, int64_t vecs, float (*s)[kMaxAttentionTileTokens]) {
  for (int64_t v0 = 0; v0 < vecs; v0 += kVecBlock) {
    switch (std::min<int64_t>(kVecBlock, vecs - v0)) {
      case 1: Scores<R, 1>(q, kt, width, head_dim, scale, 8 * v0, s); break;
      case 2: Scores<R, 2>(q, kt, width, head_dim, scale, 8 * v0, s); break;
      case 3: Scores<R, 3>(q, kt, width, head_dim, scale, 8 * v0, s); break;
      default: Scores<R, 4>(q, kt, width, head_dim, scale, 8 * v0, s); break;
    }
  }
}

// acc_r[c0 + 8 b + lane] = acc_r[...] * a_r + sum_j p[r][j] * v[j][c0 + 8 b + lane], j in order.
template <int R, int B>
void Mix(float* const* acc, const float* a, const float (*p)[kMaxAttentionTileTokens],
         const float* const* v, int64_t count, int64_t c0, __m256i last_mask) {
  __m256i mask[B];
  for (int b = 0; b < B; ++b) mask[b] = b + 1 < B ? _mm256_set1_epi32(-1) : last_mask;
  __m256 o[R][B];
  for (int r = 0; r < R; ++r) {
    const __m256 ar = _mm256_set1_ps(a[r]);
    for (int b = 0; b < B; ++b) {
      o[r][b] = _mm256_mul_ps(_mm256_maskload_ps(acc[r] + c0 + 8 * b, mask[b]), ar);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m256 vv[B];
    for (int b = 0; b < B; ++b) vv[b] = _mm256_maskload_ps(v[j] + c0 + 8 * b, mask[b]);
    for (int r = 0; r < R; ++r) {
      const __m256 pj = _mm256_broadcast_ss(p[r] + j);
      for (int b = 0; b < B; ++b) o[r][b] = _mm256_fmadd_ps(pj, vv[b], o[r][b]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) _mm256_maskstore_ps(acc[r] + c0 + 8 * b, mask[b], o[r][b]);
  }
}

template <int R>
void MixRows(float* const* acc, const float* a, const float (*p)[kMaxAttentionTileTokens],
             const float* const* v, int64_t count, int64_t head_dim) {
  for (int64_t c0 = 0; c0 < head_dim; c0 += 8 * kVecBlock) {
    const int64_t n = std::min<int64_t>(8 * kVecBlock, head_dim - c0);
    const __m256i last = LowLanes(n - 8 * ((n - 1) / 8));
    switch ((n + 7) / 8) {
      case 1: Mix<R, 1>(acc, a, p, v, count, c0, last); break;
      case 2: Mix<R, 2>(acc, a, p, v, count, c0, last); break;
      case 3: Mix<R, 3>(acc, a, p, v, count, c0, last); break;
      default: Mix<R, 4>(acc, a, p, v, count, c0, last); break;
    }
  }
}

template <int R>
void TileRows(const float* kt, int64_t width, const float* const* v, int64_t count,
              int64_t head_dim, float scale, const AttentionRows& rows, int64_t r0) {
  alignas(32) float s[R][kMaxAttentionTileTokens];
  const int64_t vecs = (count + 7) / 8;
  ScoresRows<R>(rows.q + r0, kt, width, head_dim, scale, vecs, s);
  const __m256i last = LowLanes(count - 8 * (vecs - 1));
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  float a[R];
  for (int r = 0; r < R; ++r) {
    if (rows.scores != nullptr && rows.scores[r0 + r] != nullptr) {
      std::copy(s[r], s[r] + count, rows.scores[r0 + r]);
    }
    __m256 vmax = neg_inf;
    for (int64_t b = 0; b < vecs; ++b) {
      const __m256 x = _mm256_load_ps(s[r] + 8 * b);
      vmax = _mm256_max_ps(vmax, b + 1 < vecs ? x : _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(last)));
    }
    const float m_old = rows.m[r0 + r];
    const float m_new = std::max(m_old, ReduceMax(vmax));
    a[r] = m_old == -std::numeric_limits<float>::infinity()
               ? 0.0f
               : _mm256_cvtss_f32(Exp(_mm256_set1_ps(m_old - m_new)));
    const __m256 vm = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t b = 0; b < vecs; ++b) {
      __m256 e = Exp(_mm256_sub_ps(_mm256_load_ps(s[r] + 8 * b), vm));
      if (b + 1 == vecs) e = _mm256_and_ps(e, _mm256_castsi256_ps(last));
      _mm256_store_ps(s[r] + 8 * b, e);
      sum = _mm256_add_ps(sum, e);
    }
    rows.m[r0 + r] = m_new;
    rows.l[r0 + r] = rows.l[r0 + r] * a[r] + ReduceAdd(sum);
  }
  MixRows<R>(rows.acc + r0, a, s, v, count, head_dim);
}

}  // namespace

void Avx2AttentionTile(const float* kt, int64_t width, const float* const* v, int64_t count,
                       int64_t head_dim, float scale, const AttentionRows& rows) {
  int64_t r = 0;
  for (; r + kRowBlock <= rows.num_rows; r += kRowBlock) {
    TileRows<kRowBlock>(kt, width, v, count, head_dim, scale, rows, r);
  }
  if (r < rows.num_rows) TileRows<1>(kt, width, v, count, head_dim, scale, rows, r);
}

}  // namespace kvl::ops
