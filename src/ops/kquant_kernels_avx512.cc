// AVX-512 (VNNI) K-quant MatMul tile. A super-block's 256 codes are decoded into four zmm of
// unsigned bytes, each holding 64 consecutive values, so vpdpbusd multiplies them with 64
// consecutive int8 activations straight from the activation row: unsigned codes x signed
// activations is exactly what the instruction takes, and the codes' offsets (the mins of Q4_K /
// Q5_K, the -32 of Q6_K) are applied once per sub-block through the per-token sums
// (kquant_kernels.h). Each int32 lane covers 4 values of one sub-block; lanes are converted to
// float and accumulated with their sub-block's combined scale, so nothing is reduced horizontally
// until the row ends.
#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <type_traits>

#include "kvl/kquant.h"
#include "kquant_kernels.h"

// Every fused multiply-add is an explicit intrinsic (see kernels_avx512.cc).
#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

// idx(a, b): lanes 0-7 take element a, lanes 8-15 element b.
__m512i PairIndex(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

// Lanes 4i..4i+3 take element base + i.
__m512i QuadIndex(int base) {
  return _mm512_add_epi32(_mm512_set1_epi32(base),
                          _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
}

float Sum8(__m256 v) { return _mm512_reduce_add_ps(_mm512_insertf32x8(_mm512_setzero_ps(), v, 0)); }

struct Avx512KQuant {
  static constexpr int kMaxTokens = 4;

  // Q4_K / Q5_K: chunk c of 64 values is sub-block 2c (low nibbles of qs[32c..32c+32), bit 2c of
  // qh) in bytes 0-31 and sub-block 2c + 1 (high nibbles, bit 2c + 1) in bytes 32-63.
  template <typename Block, int NR>
  static void ScaledMinRow(const uint8_t* row, int64_t n_sb, const KQuantToken* tok,
                           float* out) {
    constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i one = _mm512_set1_epi8(1);
    __m512 acc[NR];
    __m256 acc_min[NR];
    for (int j = 0; j < NR; ++j) {
      acc[j] = _mm512_setzero_ps();
      acc_min[j] = _mm256_setzero_ps();
    }
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      const uint8_t* b = row + sb * static_cast<int64_t>(sizeof(Block));
      _mm_prefetch(reinterpret_cast<const char*>(b) + kKQuantPrefetchBytes, _MM_HINT_T0);
      uint32_t words[4];
      quant::UnpackScalesMinsWords(b + offsetof(Block, scales), words);
      const __m512 sc_m = _mm512_cvtepi32_ps(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words))));
      const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(LoadHalfF16c(b)), _mm512_castps512_ps256(sc_m));
      const __m256 dm =
          _mm256_mul_ps(_mm256_set1_ps(LoadHalfF16c(b + 2)), _mm512_extractf32x8_ps(sc_m, 1));
      const uint8_t* qs = b + offsetof(Block, qs);
      __m512i w[4];
      __m512i qh2;
      if constexpr (kQ5) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
      }
      for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
        w[c] = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), low4);
        if constexpr (kQ5) {
          const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi64(2 * c),
                                                   _mm256_set1_epi64x(2 * c + 1), 1);
          const __m512i bit = _mm512_and_si512(_mm512_srlv_epi64(qh2, shift), one);
          w[c] = _mm512_or_si512(w[c], _mm512_slli_epi16(bit, 4));
        }
      }
      for (int j = 0; j < NR; ++j) {
        const __m512 s = _mm512_castps256_ps512(
            _mm256_mul_ps(dsc, _mm256_loadu_ps(tok[j].dx + 8 * sb)));
        const int8_t* x = tok[j].x + sb * kQK_K;
        for (int c = 0; c < 4; ++c) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[c],
                                                  _mm512_loadu_si512(x + 64 * c));
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                   _mm512_permutexvar_ps(PairIndex(2 * c, 2 * c + 1), s), acc[j]);
        }
        acc_min[j] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(tok[j].sums + 8 * sb), acc_min[j]);
      }
    }
    for (int j = 0; j < NR; ++j) out[j] = _mm512_reduce_add_ps(acc[j]) - Sum8(acc_min[j]);
  }

  // Q6_K: half h gives two zmm, values 128h + [0, 64) (low nibbles of ql[64h..64h+64) with qh
  // bits 0-1, then 2-3) and 128h + [64, 128) (high nibbles, qh bits 4-5, then 6-7).
  template <int NR>
  static void Q6Row(const uint8_t* row, int64_t n_sb, const KQuantToken* tok, float* out) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i low2 = _mm512_set1_epi8(0x03);
    const __m512i pair_index = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512 acc[NR], acc_offset[NR];
    for (int j = 0; j < NR; ++j) acc[j] = acc_offset[j] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      const uint8_t* b = row + sb * static_cast<int64_t>(sizeof(BlockQ6_K));
      _mm_prefetch(reinterpret_cast<const char*>(b) + kKQuantPrefetchBytes, _MM_HINT_T0);
      const __m512 dsc = _mm512_mul_ps(
          _mm512_set1_ps(LoadHalfF16c(b + offsetof(BlockQ6_K, d))),
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(BlockQ6_K, scales))))));
      __m512i w[4];
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(b + 64 * h);
        const __m256i qh =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(BlockQ6_K, qh) + 32 * h));
        const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                   _mm512_slli_epi16(_mm512_and_si512(qh2, low2), 4));
        w[2 * h + 1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), low2), 4));
      }
      for (int j = 0; j < NR; ++j) {
        // Scale of group g (16 values) = d * scales[g] * dx[g / 2].
        const __m512 s = _mm512_mul_ps(
            dsc, _mm512_permutexvar_ps(pair_index,
                                       _mm512_castps256_ps512(_mm256_loadu_ps(tok[j].dx + 8 * sb))));
        const int8_t* x = tok[j].x + sb * kQK_K;
        for (int p = 0; p < 4; ++p) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[p],
                                                  _mm512_loadu_si512(x + 64 * p));
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                   _mm512_permutexvar_ps(QuadIndex(4 * p), s), acc[j]);
        }
        acc_offset[j] = _mm512_fmadd_ps(dsc, _mm512_loadu_ps(tok[j].sums + 16 * sb), acc_offset[j]);
      }
    }
    for (int j = 0; j < NR; ++j) {
      out[j] = _mm512_reduce_add_ps(acc[j]) - 32.0f * _mm512_reduce_add_ps(acc_offset[j]);
    }
  }
};

}  // namespace

void Avx512KQuantMatMulTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  KQuantTileWith<Avx512KQuant>(a, r0, r1, t0, t1);
}

}  // namespace kvl::ops
