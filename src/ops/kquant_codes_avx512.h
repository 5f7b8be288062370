// Internal: reading a K-quant super-block of one packed panel (kernel_table.h) into AVX-512
// registers: its per-sub-block factors and its code vectors. Shared by the VNNI tiles
// (gemm_kquant_avx512.cc) and the AMX tiles (gemm_amx.cc), so both multiply the same codes by the
// same factors. Include only from files built with the AVX-512 table's flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "kernel_table.h"
#include "kquant_kernels.h"

namespace kvl::ops {

// f(integral_constant<int, I>) for I = 0 .. N-1, unrolled at compile time (shift counts and
// scale indices are immediates).
template <int N, typename F>
inline __attribute__((always_inline)) void StaticFor(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

// Each 16-bit lane shifted left by N bits (right by -N).
template <int N>
inline __m512i Shift16(__m512i v) {
  if constexpr (N > 0) return _mm512_slli_epi16(v, N);
  if constexpr (N < 0) return _mm512_srli_epi16(v, -N);
  return v;
}

// Byte K of each 32-bit lane, zero-extended to the lane.
template <int K>
inline __m512i ByteOfLanes(__m512i v) {
  constexpr uint32_t kZero = 0x80808000u;  // vpshufb zeroes a byte whose index has bit 7 set
  return _mm512_shuffle_epi8(
      v, _mm512_set4_epi32(static_cast<int>(kZero + 12 + K), static_cast<int>(kZero + 8 + K),
                           static_cast<int>(kZero + 4 + K), static_cast<int>(kZero + K)));
}

template <DType T>
constexpr int kSubBlocks = T == DType::kQ6_K ? 16 : 8;  // per super-block: 32 or 16 values each

// The factors of one super-block of one panel, one vector (16 rows) per sub-block, as the scalar
// kernel computes them: Q4_K / Q5_K d * sc[s] (kMins false) or dmin * m[s] (kMins true), Q6_K
// d * scales[s].
template <DType T, bool kMins>
inline void SubBlockFactors(const uint8_t* blk, __m512* out) {
  constexpr KQuantPanelLayout kL = KQuantPanel(T);
  const __m512 d = _mm512_cvtph_ps(
      _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + (kMins ? kL.dmin : kL.d))));
  if constexpr (T == DType::kQ6_K) {
    for (int s = 0; s < 16; ++s) {
      const __m128i sc = _mm_load_si128(reinterpret_cast<const __m128i*>(blk + kL.scales + 16 * s));
      out[s] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    }
  } else {
    // The 12 packed bytes per row, as three 4-byte lanes (quant::UnpackScalesMinsWords): values
    // 0-3 are the low 6 bits of word 0 (scales) or 1 (mins); values 4-7 take their low 4 bits
    // from word 2 (low / high nibbles) and their top 2 from the top of word 0 / 1.
    const auto* p = reinterpret_cast<const __m512i*>(blk + kL.scales);
    const __m512i w01 = _mm512_load_si512(p + (kMins ? 1 : 0));
    __m512i w2 = _mm512_load_si512(p + 2);
    if constexpr (kMins) w2 = _mm512_srli_epi32(w2, 4);
    const __m512i low = _mm512_and_si512(w01, _mm512_set1_epi8(0x3F));
    const __m512i high = _mm512_or_si512(_mm512_and_si512(w2, _mm512_set1_epi8(0x0F)),
                                         _mm512_and_si512(_mm512_srli_epi32(w01, 2),
                                                          _mm512_set1_epi8(0x30)));
    StaticFor<4>([&](auto k) {
      constexpr int kK = decltype(k)::value;
      out[kK] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(ByteOfLanes<kK>(low)));
      out[kK + 4] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(ByteOfLanes<kK>(high)));
    });
  }
}

// Code vectors 2u and 2u + 1 of a super-block of one panel (lo, hi), K the index of code vector
// 2u within its sub-block; hb the sub-block's vector of high bits (Q5_K, Q6_K).
template <DType T, int K>
inline void CodePair(const uint8_t* blk, int64_t u, __m512i hb, __m512i* lo, __m512i* hi) {
  const __m512i raw = _mm512_load_si512(blk + 64 * u);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  *lo = _mm512_and_si512(raw, nibble);
  *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
  if constexpr (T == DType::kQ5_K) {
    // Bit K (K + 1) of each byte to bit 4; a 16-bit shift by at most 4 moves no bit of another
    // byte there.
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    *lo = _mm512_or_si512(*lo, _mm512_and_si512(Shift16<4 - K>(hb), bit4));
    *hi = _mm512_or_si512(*hi, _mm512_and_si512(Shift16<3 - K>(hb), bit4));
  } else if constexpr (T == DType::kQ6_K) {
    // Bits 2K, 2K + 1 (2K + 2, 2K + 3) of each byte to bits 4-5.
    const __m512i bits45 = _mm512_set1_epi8(0x30);
    *lo = _mm512_or_si512(*lo, _mm512_and_si512(Shift16<4 - 2 * K>(hb), bits45));
    *hi = _mm512_or_si512(*hi, _mm512_and_si512(Shift16<2 - 2 * K>(hb), bits45));
  }
}

// The outputs of one panel x NT tokens (y[t + j][16 * panel + ...]) from the accumulators of the
// scaled dots, acc[j]: Q6_K's as they are; for Q4_K / Q5_K the mins term is accumulated here,
// sub-block by sub-block in order, acc_min = fma(dmin * m[s], sums[s], acc_min), and subtracted
// (its scales are in cache: the dots' pass has just read them).
template <DType T, int NT>
inline void StoreKQuantOutputs(const MatMulArgs& a, int64_t panel, int64_t t, const __m512* acc) {
  constexpr KQuantPanelLayout kL = KQuantPanel(T);
  constexpr int kSub = kSubBlocks<T>;
  const int64_t cols = a.w.cols;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + panel * PackedPanelBytes(T, cols);
  const uint8_t* acts = a.acts + t * a.act_stride;
  const auto* sums = reinterpret_cast<const float*>(acts + ActKQuantSums32Offset(cols));
  const int64_t fstride = a.act_stride / 4;
  __m512 acc_min[NT];
  for (int j = 0; j < NT; ++j) acc_min[j] = _mm512_setzero_ps();
  if constexpr (T != DType::kQ6_K) {
    for (int64_t sb = 0; sb < cols / kQK_K; ++sb) {
      __m512 dm[kSub];
      SubBlockFactors<T, true>(w + sb * kL.super_bytes, dm);
      for (int s = 0; s < kSub; ++s) {
        for (int j = 0; j < NT; ++j) {
          const __m512 m = _mm512_set1_ps(sums[j * fstride + sb * kSub + s]);
          acc_min[j] = _mm512_fmadd_ps(dm[s], m, acc_min[j]);
        }
      }
    }
  }
  const int64_t rows = a.w.rows;
  const int64_t r = panel * kPanelRows;
  const __mmask16 m =
      r + kPanelRows <= rows ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (rows - r)) - 1);
  for (int j = 0; j < NT; ++j) {
    const __m512 out = T == DType::kQ6_K ? acc[j] : _mm512_sub_ps(acc[j], acc_min[j]);
    _mm512_mask_storeu_ps(a.y + (t + j) * rows + r, m, out);
  }
}

}  // namespace kvl::ops
