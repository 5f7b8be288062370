// AVX-512 attention over compressed KV pages (format: kvl/kv_codec.h; the factored sums are
// explained in kv_kernels_scalar.cc). Codes are widened in registers, 16 channels per vector:
// int8 by vpmovsxbd + vcvtdq2ps, int4 by splitting 8 bytes into nibbles, interleaving them back
// into channel order (vpunpcklbw) and widening as unsigned. No decoded copy of a page is written.
#include <immintrin.h>

// GCC 12's cast intrinsics read an intentionally undefined register (see kernels_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>

#include "kernel_table.h"

#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

__mmask16 LaneMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// Codes of channels [ch, ch + lanes) of a row as 16 floats (lanes past `lanes` are 0). For int4,
// ch and lanes are even. Full vectors use plain loads; only a head's tail is masked.
template <int kBits>
__m512 LoadCodes(const uint8_t* row, int64_t ch, int64_t lanes) {
  if constexpr (kBits == 8) {
    const __m128i b = lanes == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + ch))
                                  : _mm_maskz_loadu_epi8(LaneMask(lanes), row + ch);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else {
    const __m128i b = lanes == 16 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + ch / 2))
                                  : _mm_maskz_loadu_epi8(LaneMask(lanes / 2), row + ch / 2);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  }
}

// Horizontal sums of four vectors: {sum a, sum b, sum c, sum d}.
__m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Per 128-bit lane: ab = {a0+a2, b0+b2, a1+a3, b1+b3}, then s = {a, b, c, d} partial sums.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

template <int kBits>
void DotRowsK(const float* q, const QuantKvLayerView& page, int64_t first_row, int64_t count,
              int64_t head_offset, int64_t head_dim, float scale, float* out) {
  // qs = q * k_scale over the head's channels, zero-padded to whole vectors; bias = q . k_min.
  alignas(64) float qs[kMaxQuantHeadDim];
  const int64_t nv = (head_dim + 15) / 16;
  const int64_t tail = head_dim - 16 * (nv - 1);
  __m512 bias_v = _mm512_setzero_ps();
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 m = LaneMask(v == nv - 1 ? tail : 16);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + 16 * v);
    const int64_t ch = head_offset + 16 * v;
    _mm512_store_ps(qs + 16 * v, _mm512_mul_ps(qv, _mm512_maskz_loadu_ps(m, page.k_scale + ch)));
    if (kBits == 4) bias_v = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, page.k_min + ch), bias_v);
  }
  const float bias = kBits == 4 ? _mm512_reduce_add_ps(bias_v) : 0.0f;

  const uint8_t* rows = page.k_q + first_row * page.row_bytes;
  const int64_t rb = page.row_bytes;
  int64_t i = 0;
  // Four rows at a time share each qs load and one combined horizontal reduction.
  for (; i + 4 <= count; i += 4) {
    const uint8_t* r0 = rows + i * rb;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t lanes = v == nv - 1 ? tail : 16;
      const int64_t ch = head_offset + 16 * v;
      const __m512 qv = _mm512_load_ps(qs + 16 * v);
      a0 = _mm512_fmadd_ps(qv, LoadCodes<kBits>(r0, ch, lanes), a0);
      a1 = _mm512_fmadd_ps(qv, LoadCodes<kBits>(r0 + rb, ch, lanes), a1);
      a2 = _mm512_fmadd_ps(qv, LoadCodes<kBits>(r0 + 2 * rb, ch, lanes), a2);
      a3 = _mm512_fmadd_ps(qv, LoadCodes<kBits>(r0 + 3 * rb, ch, lanes), a3);
    }
    const __m128 sums = _mm_add_ps(Reduce4(a0, a1, a2, a3), _mm_set1_ps(bias));
    _mm_storeu_ps(out + i, _mm_mul_ps(sums, _mm_set1_ps(scale)));
  }
  for (; i < count; ++i) {
    const uint8_t* r = rows + i * rb;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t lanes = v == nv - 1 ? tail : 16;
      acc = _mm512_fmadd_ps(_mm512_load_ps(qs + 16 * v),
                            LoadCodes<kBits>(r, head_offset + 16 * v, lanes), acc);
    }
    out[i] = (_mm512_reduce_add_ps(acc) + bias) * scale;
  }
}

// One vector of up to 16 of the head's channels in AxpyRowsV: where it starts, how many lanes are
// live, its value group and, when it straddles a group boundary (possible only if the head does
// not start on one), which lanes belong to the next group.
struct VChunk {
  int64_t ch = 0;
  int64_t lanes = 0;
  __mmask16 live = 0;
  int64_t group = 0;
  __mmask16 next_group = 0;
};

template <int kBits>
void AxpyRowsV(const float* weights, const QuantKvLayerView& page, int64_t first_row, int64_t count,
               int64_t head_offset, int64_t head_dim, float* y) {
  const int64_t gs = page.v_group, ng = page.v_groups;
  // int4: the minimum's share per overlapped group, sum_i w_i * v_min[row i][g]. ops.cc checks
  // v_group % 32 == 0 or v_group == kv_dim, so a head overlaps at most head_dim / 32 + 2 groups.
  const int64_t g_first = head_offset / gs;
  const int64_t g_last = (head_offset + head_dim - 1) / gs;
  float bias[kMaxQuantHeadDim / 32 + 2] = {};
  if (kBits == 4) {
    for (int64_t i = 0; i < count; ++i) {
      const float* mins = page.v_min + (first_row + i) * ng;
      for (int64_t g = g_first; g <= g_last; ++g) bias[g - g_first] += weights[i] * mins[g];
    }
  }

  // y stays in registers, 64 channels at a time, across all rows (as AxpyRows does).
  for (int64_t c0 = 0; c0 < head_dim; c0 += 64) {
    VChunk k[4];
    __m512 acc[4];
    bool straddles = false;
    for (int v = 0; v < 4; ++v) {
      VChunk& chunk = k[v];
      chunk.ch = head_offset + c0 + 16 * v;
      chunk.lanes = std::clamp<int64_t>(head_dim - c0 - 16 * v, 0, 16);
      chunk.live = LaneMask(chunk.lanes);
      chunk.group = chunk.lanes > 0 ? chunk.ch / gs : g_first;
      const int64_t to_next = (chunk.group + 1) * gs - chunk.ch;  // lanes left in this group
      if (chunk.lanes > 0 && to_next < 16) {
        chunk.next_group = static_cast<__mmask16>(~LaneMask(to_next) & chunk.live);
      }
      straddles |= chunk.next_group != 0;
      acc[v] = _mm512_maskz_loadu_ps(chunk.live, y + c0 + 16 * v);
      if (kBits == 4 && chunk.lanes > 0) {
        const __m512 b0 = _mm512_set1_ps(bias[chunk.group - g_first]);
        const __m512 b = chunk.next_group != 0
                             ? _mm512_mask_mov_ps(b0, chunk.next_group,
                                                  _mm512_set1_ps(bias[chunk.group + 1 - g_first]))
                             : b0;
        acc[v] = _mm512_maskz_add_ps(chunk.live, acc[v], b);
      }
    }
    const int nv = static_cast<int>(std::min<int64_t>(4, (head_dim - c0 + 15) / 16));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = first_row + i;
      const uint8_t* row = page.v_q + r * page.row_bytes;
      const float* scales = page.v_scale + r * ng;
      const float w = weights[i];
      for (int v = 0; v < nv; ++v) {
        __m512 coef = _mm512_set1_ps(w * scales[k[v].group]);
        if (straddles && k[v].next_group != 0) {
          coef =
              _mm512_mask_mov_ps(coef, k[v].next_group, _mm512_set1_ps(w * scales[k[v].group + 1]));
        }
        acc[v] = _mm512_fmadd_ps(coef, LoadCodes<kBits>(row, k[v].ch, k[v].lanes), acc[v]);
      }
    }
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(y + c0 + 16 * v, k[v].live, acc[v]);
  }
}

// Fast paths for the common shapes: head_dim = 16 * kNV channels, all vectors full, unrolled.
// int4 works in units of 32 channels (16 bytes) without re-interleaving the nibbles: the low
// nibbles are the even channels and the high ones the odd channels, so qs (and, in AxpyRowsV, y)
// is held in the same even / odd order instead, which costs one permutation per call, not per row.

// 16 even then 16 odd channels of 32 consecutive floats, and back.
__m512i EvenIdx() {
  return _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
}
__m512i OddIdx() {
  return _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
}
__m512i InterleaveLoIdx() {
  return _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}
__m512i InterleaveHiIdx() {
  return _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
}

// Codes of 32 channels starting at byte `at` of an int4 row: even channels, odd channels.
inline void LoadInt4Pair(const uint8_t* at, __m512* even, __m512* odd) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  *even = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, low4)));
  *odd = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), low4)));
}

// Codes of vector v (16 channels) of a row slice: int8 directly; int4 as the even (v even) or odd
// (v odd) channels of 32-channel unit v / 2.
template <int kBits>
inline __m512 LoadFast(const uint8_t* slice, int v) {
  if constexpr (kBits == 8) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(slice + 16 * v))));
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(slice + 16 * (v / 2)));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i n = (v & 1) ? _mm_and_si128(_mm_srli_epi16(b, 4), low4) : _mm_and_si128(b, low4);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(n));
  }
}

// Loads 16 * kNV floats at x in the order LoadFast gives codes (int4: even / odd per 32).
template <int kBits, int kNV>
inline void LoadOrdered(const float* x, __m512* out) {
  for (int v = 0; v < kNV; ++v) {
    if constexpr (kBits == 8) {
      out[v] = _mm512_loadu_ps(x + 16 * v);
    } else {
      const __m512 a = _mm512_loadu_ps(x + 32 * (v / 2)),
                   b = _mm512_loadu_ps(x + 32 * (v / 2) + 16);
      out[v] = _mm512_permutex2var_ps(a, (v & 1) ? OddIdx() : EvenIdx(), b);
    }
  }
}
template <int kBits, int kNV>
inline void StoreOrdered(const __m512* in, float* x) {
  for (int v = 0; v < kNV; ++v) {
    if constexpr (kBits == 8) {
      _mm512_storeu_ps(x + 16 * v, in[v]);
    } else if (v & 1) {
      _mm512_storeu_ps(x + 32 * (v / 2),
                       _mm512_permutex2var_ps(in[v - 1], InterleaveLoIdx(), in[v]));
      _mm512_storeu_ps(x + 32 * (v / 2) + 16,
                       _mm512_permutex2var_ps(in[v - 1], InterleaveHiIdx(), in[v]));
    }
  }
}

template <int kBits, int kNV>
void DotRowsKFast(const float* q, const QuantKvLayerView& page, int64_t first_row, int64_t count,
                  int64_t head_offset, float scale, float* out) {
  __m512 qv[kNV], ks[kNV];
  LoadOrdered<kBits, kNV>(q, qv);
  LoadOrdered<kBits, kNV>(page.k_scale + head_offset, ks);
  __m512 bias_v = _mm512_setzero_ps();
  if constexpr (kBits == 4) {
    __m512 km[kNV];
    LoadOrdered<kBits, kNV>(page.k_min + head_offset, km);
    for (int v = 0; v < kNV; ++v) bias_v = _mm512_fmadd_ps(qv[v], km[v], bias_v);
  }
  for (int v = 0; v < kNV; ++v) qv[v] = _mm512_mul_ps(qv[v], ks[v]);
  const float bias = kBits == 4 ? _mm512_reduce_add_ps(bias_v) : 0.0f;
  const int64_t rb = page.row_bytes;
  const uint8_t* rows = page.k_q + first_row * rb + (kBits == 8 ? head_offset : head_offset / 2);
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const uint8_t* r = rows + i * rb;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int v = 0; v < kNV; ++v) {
      a0 = _mm512_fmadd_ps(qv[v], LoadFast<kBits>(r, v), a0);
      a1 = _mm512_fmadd_ps(qv[v], LoadFast<kBits>(r + rb, v), a1);
      a2 = _mm512_fmadd_ps(qv[v], LoadFast<kBits>(r + 2 * rb, v), a2);
      a3 = _mm512_fmadd_ps(qv[v], LoadFast<kBits>(r + 3 * rb, v), a3);
    }
    const __m128 sums = _mm_add_ps(Reduce4(a0, a1, a2, a3), _mm_set1_ps(bias));
    _mm_storeu_ps(out + i, _mm_mul_ps(sums, _mm_set1_ps(scale)));
  }
  for (; i < count; ++i) {
    __m512 acc = _mm512_setzero_ps();
    for (int v = 0; v < kNV; ++v)
      acc = _mm512_fmadd_ps(qv[v], LoadFast<kBits>(rows + i * rb, v), acc);
    out[i] = (_mm512_reduce_add_ps(acc) + bias) * scale;
  }
}

// Requires every 16-channel vector (int4: every 32-channel unit) to lie in one value group.
template <int kBits, int kNV>
void AxpyRowsVFast(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                   int64_t count, int64_t head_offset, float* y) {
  const int64_t gs = page.v_group, ng = page.v_groups;
  int64_t group[kNV];
  for (int v = 0; v < kNV; ++v) group[v] = (head_offset + 16 * (kBits == 8 ? v : v & ~1)) / gs;
  __m512 acc[kNV];
  LoadOrdered<kBits, kNV>(y, acc);
  if constexpr (kBits == 4) {  // the minimum's share, sum_i w_i * v_min[i][g], once per call
    float bias[kNV] = {};
    for (int64_t i = 0; i < count; ++i) {
      const float* mins = page.v_min + (first_row + i) * ng;
      for (int v = 0; v < kNV; v += 2) bias[v] += weights[i] * mins[group[v]];
    }
    for (int v = 0; v < kNV; ++v) acc[v] = _mm512_add_ps(acc[v], _mm512_set1_ps(bias[v & ~1]));
  }
  const int64_t rb = page.row_bytes;
  const uint8_t* rows = page.v_q + first_row * rb + (kBits == 8 ? head_offset : head_offset / 2);
  const float* scales = page.v_scale + first_row * ng;
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* r = rows + i * rb;
    const float w = weights[i];
    for (int v = 0; v < kNV; ++v) {
      const __m512 coef = _mm512_set1_ps(w * scales[i * ng + group[v]]);
      acc[v] = _mm512_fmadd_ps(coef, LoadFast<kBits>(r, v), acc[v]);
    }
  }
  StoreOrdered<kBits, kNV>(acc, y);
}

// The fast path for this call, or null.
template <int kBits>
auto DotFast(int64_t head_dim) -> decltype(&DotRowsKFast<kBits, 4>) {
  if (head_dim % 32 != 0) return nullptr;
  switch (head_dim / 16) {
    case 2:
      return DotRowsKFast<kBits, 2>;
    case 4:
      return DotRowsKFast<kBits, 4>;
    case 8:
      return DotRowsKFast<kBits, 8>;
    case 16:
      return DotRowsKFast<kBits, 16>;
    default:
      return nullptr;
  }
}
template <int kBits>
auto AxpyFast(const QuantKvLayerView& page, int64_t head_offset, int64_t head_dim)
    -> decltype(&AxpyRowsVFast<kBits, 4>) {
  const int64_t unit = kBits == 8 ? 16 : 32;  // must not straddle a value group
  const bool one_group_per_unit =
      page.v_groups == 1 || (page.v_group % unit == 0 && head_offset % unit == 0);
  if (head_dim % 32 != 0 || !one_group_per_unit) return nullptr;
  switch (head_dim / 16) {
    case 2:
      return AxpyRowsVFast<kBits, 2>;
    case 4:
      return AxpyRowsVFast<kBits, 4>;
    case 8:
      return AxpyRowsVFast<kBits, 8>;
    case 16:
      return AxpyRowsVFast<kBits, 16>;
    default:
      return nullptr;
  }
}

}  // namespace

void Avx512DotRowsKInt8(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out) {
  if (auto fast = DotFast<8>(head_dim))
    return fast(q, page, first_row, count, head_offset, scale, out);
  DotRowsK<8>(q, page, first_row, count, head_offset, head_dim, scale, out);
}
void Avx512DotRowsKInt4(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out) {
  if (auto fast = DotFast<4>(head_dim))
    return fast(q, page, first_row, count, head_offset, scale, out);
  DotRowsK<4>(q, page, first_row, count, head_offset, head_dim, scale, out);
}
void Avx512AxpyRowsVInt8(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y) {
  if (auto fast = AxpyFast<8>(page, head_offset, head_dim)) {
    return fast(weights, page, first_row, count, head_offset, y);
  }
  AxpyRowsV<8>(weights, page, first_row, count, head_offset, head_dim, y);
}
void Avx512AxpyRowsVInt4(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y) {
  if (auto fast = AxpyFast<4>(page, head_offset, head_dim)) {
    return fast(weights, page, first_row, count, head_offset, y);
  }
  AxpyRowsV<4>(weights, page, first_row, count, head_offset, head_dim, y);
}

}  // namespace kvl::ops
