// AVX2 K-quant MatMul tile: as the AVX-512 one (kquant_kernels_avx512.cc) with 32 values per
// ymm, one sub-block of Q4_K / Q5_K or two of Q6_K. Without VNNI, unsigned codes x signed int8
// activations go through vpmaddubsw (pairs summed to int16: at most 2 * 63 * 128, no saturation)
// and vpmaddwd against ones (int32 lanes of 4 values).
#include <immintrin.h>

#include <cstddef>
#include <type_traits>

#include "kvl/kquant.h"
#include "kquant_kernels.h"

// Every fused multiply-add is an explicit intrinsic (see kernels_avx512.cc).
#pragma GCC optimize("fp-contract=off")

namespace kvl::ops {
namespace {

__m256i Load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// int32 lanes of sum(codes * x) over 4 consecutive bytes.
__m256i Dot4(__m256i codes, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), _mm256_set1_epi16(1));
}

float Sum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

struct Avx2KQuant {
  // Eight decoded ymm plus two accumulators per token fit the 16 registers for two tokens.
  static constexpr int kMaxTokens = 2;

  // Q4_K / Q5_K: ymm s holds sub-block s (low nibbles of qs[32(s/2)..] for even s, high for odd,
  // plus bit s of qh for Q5_K).
  template <typename Block, int NR>
  static void ScaledMinRow(const uint8_t* row, int64_t n_sb, const KQuantToken* tok,
                           float* out) {
    constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi8(1);
    __m256 acc[NR], acc_min[NR];
    for (int j = 0; j < NR; ++j) acc[j] = acc_min[j] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      const uint8_t* b = row + sb * static_cast<int64_t>(sizeof(Block));
      _mm_prefetch(reinterpret_cast<const char*>(b) + kKQuantPrefetchBytes, _MM_HINT_T0);
      uint32_t words[4];
      quant::UnpackScalesMinsWords(b + offsetof(Block, scales), words);
      const __m128i sc_m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words));
      const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(LoadHalfF16c(b)),
                                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc_m)));
      const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(LoadHalfF16c(b + 2)),
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sc_m, 8))));
      const uint8_t* qs = b + offsetof(Block, qs);
      __m256i w[8];
      for (int c = 0; c < 4; ++c) {
        const __m256i q = Load32(qs + 32 * c);
        w[2 * c] = _mm256_and_si256(q, low4);
        w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      }
      if constexpr (kQ5) {
        const __m256i qh = Load32(b + offsetof(Block, qh));
        for (int s = 0; s < 8; ++s) {
          const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), one);
          w[s] = _mm256_or_si256(w[s], _mm256_slli_epi16(bit, 4));
        }
      }
      for (int j = 0; j < NR; ++j) {
        const __m256 s = _mm256_mul_ps(dsc, _mm256_loadu_ps(tok[j].dx + 8 * sb));
        const int8_t* x = tok[j].x + sb * kQK_K;
        for (int i = 0; i < 8; ++i) {
          const __m256i dot = Dot4(w[i], Load32(x + 32 * i));
          acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_permutevar8x32_ps(s, _mm256_set1_epi32(i)), acc[j]);
        }
        acc_min[j] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(tok[j].sums + 8 * sb), acc_min[j]);
      }
    }
    for (int j = 0; j < NR; ++j) out[j] = Sum8(acc[j]) - Sum8(acc_min[j]);
  }

  // Q6_K: ymm p holds values 32p..32p+32 (groups 2p and 2p + 1): for half h = p / 4 and
  // i = p % 4, nibble i / 2 of ql[64h + 32(i % 2)..] with bits 2i..2i+1 of qh[32h..].
  template <int NR>
  static void Q6Row(const uint8_t* row, int64_t n_sb, const KQuantToken* tok, float* out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i low2 = _mm256_set1_epi8(0x03);
    const __m256i lo_pairs = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
    const __m256i hi_pairs = _mm256_set_epi32(7, 7, 6, 6, 5, 5, 4, 4);
    __m256 acc[NR], acc_offset[NR];
    for (int j = 0; j < NR; ++j) acc[j] = acc_offset[j] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < n_sb; ++sb) {
      const uint8_t* b = row + sb * static_cast<int64_t>(sizeof(BlockQ6_K));
      _mm_prefetch(reinterpret_cast<const char*>(b) + kKQuantPrefetchBytes, _MM_HINT_T0);
      const __m256 d = _mm256_set1_ps(LoadHalfF16c(b + offsetof(BlockQ6_K, d)));
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(BlockQ6_K, scales)));
      const __m256 dsc_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
      const __m256 dsc_hi =
          _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
      __m256i w[8];
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = Load32(b + 64 * h);
        const __m256i ql1 = Load32(b + 64 * h + 32);
        const __m256i qh = Load32(b + offsetof(BlockQ6_K, qh) + 32 * h);
        for (int i = 0; i < 4; ++i) {
          const __m256i ql = i % 2 == 0 ? ql0 : ql1;
          const __m256i nibble = _mm256_and_si256(i < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
          const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), low2);
          w[4 * h + i] = _mm256_or_si256(nibble, _mm256_slli_epi16(high, 4));
        }
      }
      for (int j = 0; j < NR; ++j) {
        // Scale of group g = d * scales[g] * dx[g / 2], groups 0-7 and 8-15.
        const __m256 dx = _mm256_loadu_ps(tok[j].dx + 8 * sb);
        const __m256 s_lo = _mm256_mul_ps(dsc_lo, _mm256_permutevar8x32_ps(dx, lo_pairs));
        const __m256 s_hi = _mm256_mul_ps(dsc_hi, _mm256_permutevar8x32_ps(dx, hi_pairs));
        const int8_t* x = tok[j].x + sb * kQK_K;
        for (int p = 0; p < 8; ++p) {
          const int g = 2 * (p % 4);
          const __m256i idx = _mm256_set_epi32(g + 1, g + 1, g + 1, g + 1, g, g, g, g);
          const __m256i dot = Dot4(w[p], Load32(x + 32 * p));
          acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_permutevar8x32_ps(p < 4 ? s_lo : s_hi, idx), acc[j]);
        }
        const float* sums = tok[j].sums + 16 * sb;
        acc_offset[j] = _mm256_fmadd_ps(dsc_lo, _mm256_loadu_ps(sums), acc_offset[j]);
        acc_offset[j] = _mm256_fmadd_ps(dsc_hi, _mm256_loadu_ps(sums + 8), acc_offset[j]);
      }
    }
    for (int j = 0; j < NR; ++j) out[j] = Sum8(acc[j]) - 32.0f * Sum8(acc_offset[j]);
  }
};

}  // namespace

void Avx2KQuantMatMulTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  KQuantTileWith<Avx2KQuant>(a, r0, r1, t0, t1);
}

}  // namespace kvl::ops
