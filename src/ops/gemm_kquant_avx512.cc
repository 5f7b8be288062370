// AVX-512 VNNI int8 GEMM over K-quant weights (Q4_K, Q5_K, Q6_K) in the packed layout
// (kernel_table.h).
//
// As in gemm_avx512.cc, each vpdpbusd lane is one output row: a code vector holds 4 unsigned codes
// of each of 16 rows, the 4 activation bytes of one token are broadcast to every lane, and a
// sub-block's int32 dot of 16 rows x 1 token ends in one register, with no horizontal reduction.
// The codes are the natural unsigned operand of vpdpbusd: no offset to correct. The register tile
// is one panel (16 rows) x NT tokens; each code vector is unpacked once per tile (nibbles, and the
// high bits of Q5_K / Q6_K) and used NT times.
//
// Exactness: every output gets the float operations of the scalar kernel
// (kquant_kernels_scalar.cc) in its order, each fused multiply-add an explicit vfmadd. Per
// sub-block s in order:
//   Q4_K / Q5_K: acc = fma(d * sc[s], float(dot) * dx, acc);  acc_min = fma(dmin * m[s], sums[s],
//                acc_min); the output is acc - acc_min;
//   Q6_K:        acc = fma(d * sc[s], float(dot - 32 * isum[s]) * dx, acc); the output is acc;
// dx the activation block's scale, sums[s] = dx * (sum of the sub-block's activations) and
// -32 * isum[s] (Q6_K: the -32 offset of its codes times the sum of the group's 16 activations)
// computed once per token by ops.cc. So every output is bit-identical to the scalar path,
// whatever the tile, the batch, the thread or the ISA. Each (16 rows, token, sub-block) then
// costs the vpdpbusd of its codes and three float operations (convert, multiply, fused add) on
// the vector ports they share, plus one for the mins, where the unfused form took six (Q6_K also
// lost its second accumulator pass). Emerald Rapids VM, `matmul_bench 1 --cpu-time`, TinyLlama
// shapes, M = 64 / 512, best of 4 alternated runs on a loaded machine: Q6_K 143-176 -> 173-227
// GOPS; Q4_K 208-291 -> 194-296, within the noise (as Q8_0's tile, about 300: bound elsewhere than
// by its float operations on this core). The two accumulations of Q4_K / Q5_K are independent,
// so a tile runs them as two passes over its super-blocks, each with all the registers to itself:
// the dots, then the mins (whose scales the first pass has just brought into cache).
#include <immintrin.h>

// As in kernels_avx512.cc: GCC 12's cast intrinsics trip -Wuninitialized on their undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <array>
#include <utility>

#include "kernel_table.h"
#include "kquant_kernels.h"

#pragma GCC optimize("fp-contract=off")  // see kernels_avx512.cc

namespace kvl::ops {
namespace {

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

// y[t + j][16 * (panel + i) + ...] for j < NT tokens, i < MR panels.
template <DType T, int NT, int MR = 1>
void PackedKQuantTile(const MatMulArgs& a, int64_t panel, int64_t t) {
  constexpr KQuantPanelLayout kL = KQuantPanel(T);
  constexpr int kSub = kSubBlocks<T>;
  constexpr int kLoads = 32 / kSub;  // code loads per sub-block, two code vectors each
  constexpr int kLines = kL.super_bytes / 64;
  const int64_t cols = a.w.cols;
  const int64_t n_sb = cols / kQK_K;
  const int64_t panel_bytes = PackedPanelBytes(T, cols);
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + panel * panel_bytes;
  const int64_t stride = a.act_stride;
  const uint8_t* acts = a.acts + t * stride;
  const auto* dx = reinterpret_cast<const float*>(acts + ActScalesOffset(cols));
  const auto* sums = reinterpret_cast<const float*>(acts + ActKQuantSums32Offset(cols));
  const auto* q6_offsets = reinterpret_cast<const int32_t*>(acts + ActQ6OffsetsOffset(cols));
  const int64_t fstride = stride / 4;  // dx, sums, offsets rows in elements (stride % 64 == 0)

  // Pass 1: acc, sub-block by sub-block.
  __m512 acc[MR][NT];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < n_sb; ++sb) {
    const uint8_t* blk[MR];
    __m512 dsc[MR][kSub];
    for (int i = 0; i < MR; ++i) {
      blk[i] = w + i * panel_bytes + sb * kL.super_bytes;
      SubBlockFactors<T, false>(blk[i], dsc[i]);
    }
    for (int s = 0; s < kSub; ++s) {
      // Batched decode also prefetches into L2 far ahead (kernel_table.h).
      for (int i = 0; i < MR; ++i) {
        const char* here = reinterpret_cast<const char*>(blk[i]);
        for (int l = s * kLines / kSub; l < (s + 1) * kLines / kSub; ++l) {
          if constexpr (NT == 1) {
            _mm_prefetch(here + kPackedPrefetchBytes + 64 * l, _MM_HINT_T0);
          } else {
            _mm_prefetch(here + kBatchedPrefetchL1Bytes + 64 * l, _MM_HINT_T0);
            _mm_prefetch(here + kBatchedPrefetchL2Bytes + 64 * l, _MM_HINT_T1);
          }
        }
      }
      __m512i hb[MR];
      for (int i = 0; i < MR; ++i) {
        hb[i] = _mm512_setzero_si512();
        if constexpr (T != DType::kQ4_K) hb[i] = _mm512_load_si512(blk[i] + kL.bits + 64 * s);
      }
      // Q6_K's dots start from -32 * (sum of the group's activations), a broadcast load rather
      // than a subtraction on the vector ports.
      __m512i dot[MR][NT];
      for (int j = 0; j < NT; ++j) {
        const __m512i init = T == DType::kQ6_K
                                 ? _mm512_set1_epi32(q6_offsets[j * fstride + sb * kSub + s])
                                 : _mm512_setzero_si512();
        for (int i = 0; i < MR; ++i) dot[i][j] = init;
      }
      StaticFor<kLoads>([&](auto v) {
        constexpr int kV = decltype(v)::value;
        const int64_t u = s * kLoads + kV;
        __m512i lo[MR], hi[MR];
        for (int i = 0; i < MR; ++i) CodePair<T, 2 * kV>(blk[i], u, hb[i], &lo[i], &hi[i]);
        const uint8_t* x = acts + sb * kQK_K + 8 * u;  // code vector 2u: elements 8u..8u+3
        for (int j = 0; j < NT; ++j) {
          int32_t four;
          __builtin_memcpy(&four, x + j * stride, 4);
          const __m512i xv = _mm512_set1_epi32(four);
          for (int i = 0; i < MR; ++i) dot[i][j] = _mm512_dpbusd_epi32(dot[i][j], lo[i], xv);
        }
        for (int j = 0; j < NT; ++j) {
          int32_t four;
          __builtin_memcpy(&four, x + j * stride + 4, 4);
          const __m512i xv = _mm512_set1_epi32(four);
          for (int i = 0; i < MR; ++i) dot[i][j] = _mm512_dpbusd_epi32(dot[i][j], hi[i], xv);
        }
      });
      const int64_t b = sb * 8 + s * 8 / kSub;  // the activation block holding sub-block s
      for (int j = 0; j < NT; ++j) {
        const __m512 dxj = _mm512_set1_ps(dx[j * fstride + b]);
        for (int i = 0; i < MR; ++i) {
          const __m512 xd = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[i][j]), dxj);
          acc[i][j] = _mm512_fmadd_ps(dsc[i][s], xd, acc[i][j]);
        }
      }
    }
  }

  const int64_t rows = a.w.rows;
  for (int i = 0; i < MR; ++i) {
    // Pass 2 (Q4_K / Q5_K): acc_min, sub-block by sub-block.
    __m512 acc_min[NT];
    for (int j = 0; j < NT; ++j) acc_min[j] = _mm512_setzero_ps();
    if constexpr (T != DType::kQ6_K) {
      for (int64_t sb = 0; sb < n_sb; ++sb) {
        __m512 dm[kSub];
        SubBlockFactors<T, true>(w + i * panel_bytes + sb * kL.super_bytes, dm);
        for (int s = 0; s < kSub; ++s) {
          for (int j = 0; j < NT; ++j) {
            const __m512 m = _mm512_set1_ps(sums[j * fstride + sb * kSub + s]);
            acc_min[j] = _mm512_fmadd_ps(dm[s], m, acc_min[j]);
          }
        }
      }
    }
    const int64_t r = (panel + i) * kPanelRows;
    const __mmask16 m = r + kPanelRows <= rows ? __mmask16{0xFFFF}
                                               : static_cast<__mmask16>((1u << (rows - r)) - 1);
    for (int j = 0; j < NT; ++j) {
      const __m512 out = T == DType::kQ6_K ? acc[i][j] : _mm512_sub_ps(acc[i][j], acc_min[j]);
      _mm512_mask_storeu_ps(a.y + (t + j) * rows + r, m, out);
    }
  }
}

using PackedTileFn = void (*)(const MatMulArgs&, int64_t, int64_t);

// Tiles of one panel (16 rows) x up to 12 tokens: 12 int32 and 12 float accumulators. One panel
// rather than 2 x 6 as for Q8_0: the code unpacking (1.5 instructions per code vector for Q4_K,
// about 4 for Q6_K) is shared by twice the tokens; TinyLlama shapes, 1 thread, M = 64 / 512:
// Q4_K 460-545 / 440-465 GOPS with 2 x 6, 495-545 / 465-510 with 1 x 12; Q6_K 345-405 / 340-350
// with 2 x 6, 385-400 / 360-385 with 1 x 12 (1 x 8 and 1 x 10 in between). On the Sapphire Rapids
// VM of issue 25 (1 thread, M = 12 / 24, best of 4 on a loaded machine) 1 x 12 stays ahead: Q4_K
// 250-310 GOPS against 255-297 for 2 x 6 and 231-270 for 3 x 4; Q6_K 185-203 against 173-193 and
// 144-168. One-row decode takes the one-token tile, each thread streaming one sequential run of
// weights; 2-9 rows take the three-panel tiles below.
constexpr int kNT = 12;

template <DType T, int... NT>
constexpr std::array<PackedTileFn, sizeof...(NT)> TileTable(std::integer_sequence<int, NT...>) {
  return {PackedKQuantTile<T, NT + 1>...};
}
template <DType T>
constexpr auto kTiles = TileTable<T>(std::make_integer_sequence<int, kNT>{});

// Decode of 2-9 rows (a few sequences, or a 1 + 8-row verify step): three panels at a time against
// every token, each token's activation bytes broadcast once for the three. TinyLlama Q4_K_M,
// 2 threads, a step of k rows / a one-row step (`kvl bench spec --steps-only -r 11`, three
// alternations), one panel / two / three: 3 rows 1.12-1.15x / 1.03-1.07x / 1.00-1.04x, 5 rows
// 1.22-1.31x / 1.20-1.26x / 1.12-1.19x, 9 rows 1.70-1.83x / 1.67-1.76x / 1.70-1.75x. (Unlike
// Q8_0 the 9-row step stays arithmetic-bound: each panel's codes are unpacked for its own dots.)
constexpr int kDecodeMR = 3;
constexpr int kDecodeNT = 9;
template <DType T, int... NT>
constexpr std::array<PackedTileFn, sizeof...(NT)> DecodeTable(std::integer_sequence<int, NT...>) {
  return {PackedKQuantTile<T, NT + 1, kDecodeMR>...};
}
template <DType T>
constexpr auto kDecodeTiles = DecodeTable<T>(std::make_integer_sequence<int, kDecodeNT>{});

template <DType T>
void KQuantPackedTileT(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  ForEachTile<kDecodeNT, kDecodeMR, 1, kNT>(
      r0 / kPanelRows, PackedPanels(r1), t0, t1,
      [&](int64_t p, int64_t mr, int64_t nt) {
        (mr == 1 ? kTiles<T>[nt - 1] : kDecodeTiles<T>[nt - 1])(a, p, t0);
      },
      [&](int64_t p, int64_t t, int64_t, int64_t nt) { kTiles<T>[nt - 1](a, p, t); });
}

}  // namespace

void Avx512KQuantPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  switch (a.w.type) {
    case DType::kQ4_K:
      return KQuantPackedTileT<DType::kQ4_K>(a, r0, r1, t0, t1);
    case DType::kQ5_K:
      return KQuantPackedTileT<DType::kQ5_K>(a, r0, r1, t0, t1);
    default:
      return KQuantPackedTileT<DType::kQ6_K>(a, r0, r1, t0, t1);
  }
}

}  // namespace kvl::ops
