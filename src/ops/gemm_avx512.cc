// AVX-512 VNNI int8 GEMM over Q8_0 / Q4_0 weights in the packed layout (kernel_table.h).
//
// Each vpdpbusd lane is one output row: a 64-byte vector holds 4 consecutive weight bytes of 16
// rows, and the 4 activation bytes of one token are broadcast to every lane (straight from memory),
// so 8 vpdpbusd leave a whole block's int32 dot of 16 rows x 1 token in one register, with no
// horizontal reduction. The register tile is MR panels (16 rows each) x NT tokens; each weight
// vector is loaded once per tile and used NT times, each activation broadcast used MR times.
//
// Exactness: per output, block by block in order, acc += float(dot) * (dw * dx), starting from 0,
// with no fused multiply-add: the scalar kernel's operations exactly. So every output is
// bit-identical to the scalar path, whatever the tile, the batch, the thread or the ISA.
//
// Per-block scale work (a vcvtph2ps per panel, then per output a convert, two multiplies and an
// add) goes to the FP pipes beside the 8 vpdpbusd that produced the dot.
#include <immintrin.h>

// As in kernels_avx512.cc: GCC 12's cast intrinsics trip -Wuninitialized on their undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>

#include "amx.h"
#include "kernel_table.h"

#pragma GCC optimize("fp-contract=off")  // see kernels_avx512.cc

namespace kvl::ops {
namespace {

// Weight vector g (< 8) of one packed block: 4 bytes of each of 16 rows, unsigned.
template <DType T>
inline __m512i GroupVector(const uint8_t* quants, int g) {
  if constexpr (T == DType::kQ8_0) {
    return _mm512_load_si512(quants + g * 64);
  } else {
    const __m512i v = _mm512_load_si512(quants + (g / 2) * 64);
    const __m512i nibbles = _mm512_set1_epi8(0x0F);
    if (g % 2 == 0) return _mm512_and_si512(v, nibbles);
    return _mm512_and_si512(_mm512_srli_epi16(v, 4), nibbles);
  }
}

int32_t LoadI32(const uint8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// y[t + j][16 * panel + ...] for i < MR panels, j < NT tokens.
template <DType T, int MR, int NT>
void PackedTile(const MatMulArgs& a, int64_t panel, int64_t t) {
  constexpr int kC = T == DType::kQ8_0 ? 128 : 8;
  constexpr int64_t kQB = T == DType::kQ8_0 ? 512 : 256;
  const int64_t cols = a.w.cols;
  const int64_t nb = cols / 32;
  const int64_t panel_bytes = PackedPanelBytes(T, cols);
  const int64_t pair_bytes = 2 * kQB + 64;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + panel * panel_bytes;
  const int64_t stride = a.act_stride;
  const uint8_t* acts = a.acts + t * stride;
  const auto* dx = reinterpret_cast<const float*>(acts + ActScalesOffset(cols));
  const auto* sx = reinterpret_cast<const int32_t*>(acts + ActSumsOffset(cols));
  const int64_t fstride = stride / 4;  // dx and sx rows, in elements (stride is a multiple of 64)

  StreamAhead* const ahead = a.stream_ahead;  // another task's stream, pulled by wide tiles
  const bool far = NT > 1 || OneTokenPrefetchesIntoL2();  // how the weight stream is prefetched
  __m512 facc[MR][NT];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NT; ++j) facc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pair = w + (b / 2) * pair_bytes;
    const uint8_t* quants = pair + (b % 2) * kQB;
    __m512i acc[MR][NT];
    for (int j = 0; j < NT; ++j) {
      const __m512i init = _mm512_set1_epi32(-kC * sx[j * fstride + b]);
      for (int i = 0; i < MR; ++i) acc[i][j] = init;
    }
    const uint8_t* xb = acts + b * 32;
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      if constexpr (NT > 1) {
        if (ahead != nullptr) ahead->IssueAt(g);
      }
      __m512i wv[MR];
      for (int i = 0; i < MR; ++i) {
        const uint8_t* q = quants + i * panel_bytes;
        if (T == DType::kQ8_0 || g % 2 == 0) {
          const char* line = reinterpret_cast<const char*>(q + g * 64);
          if (!far) {
            _mm_prefetch(line + kPackedPrefetchBytes, _MM_HINT_T0);
          } else {
            _mm_prefetch(line + kBatchedPrefetchL1Bytes, _MM_HINT_T0);
            _mm_prefetch(line + kBatchedPrefetchL2Bytes, _MM_HINT_T1);
          }
        }
        wv[i] = GroupVector<T>(q, g);
      }
      for (int j = 0; j < NT; ++j) {
        const __m512i xv = _mm512_set1_epi32(LoadI32(xb + j * stride + 4 * g));
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[i], xv);
      }
    }
    for (int i = 0; i < MR; ++i) {
      const auto* scales = pair + i * panel_bytes + 2 * kQB + (b % 2) * 32;
      const __m512 dw =
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales)));
      for (int j = 0; j < NT; ++j) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx[j * fstride + b]));
        facc[i][j] = _mm512_add_ps(facc[i][j], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][j]), s));
      }
    }
  }
  const int64_t rows = a.w.rows;
  for (int i = 0; i < MR; ++i) {
    const int64_t r = (panel + i) * kPanelRows;
    const __mmask16 m =
        r + kPanelRows <= rows ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (rows - r)) - 1);
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(a.y + (t + j) * rows + r, m, facc[i][j]);
  }
}

using PackedTileFn = void (*)(const MatMulArgs&, int64_t, int64_t);

// Prefill: 2 panels (32 rows) x up to 6 tokens: 12 int32 and 12 float accumulators.
constexpr int kMR = 2;
constexpr int kNT = kPackedTileTokens;
template <DType T>
constexpr PackedTileFn kPackedTiles[kMR][kNT] = {
    {PackedTile<T, 1, 1>, PackedTile<T, 1, 2>, PackedTile<T, 1, 3>, PackedTile<T, 1, 4>,
     PackedTile<T, 1, 5>, PackedTile<T, 1, 6>},
    {PackedTile<T, 2, 1>, PackedTile<T, 2, 2>, PackedTile<T, 2, 3>, PackedTile<T, 2, 4>,
     PackedTile<T, 2, 5>, PackedTile<T, 2, 6>},
};
// Decode of up to 9 rows (8 sequences, or a 1 + 8-row verify step): every token against three
// panels at a time, each panel read once, so the weights stream once while 3 x 9 int32 dots
// accumulate in registers (GCC keeps the float sums of a 3 x 9 tile on the stack, touched once per
// block). One row takes one panel at a time (a single sequential stream: two or three panels
// measured the same or moved tg64 both ways). Before, 2-8 rows took one panel and 9 rows
// 2 x (5 + 4) tiles, which read each panel pair twice, the second time from L2 while DRAM idled.
// TinyLlama Q8_0, 2 threads, a step of 9 rows / a one-row step (`kvl bench spec --steps-only
// -r 11`, three or four alternations each): 1 x k panels, 2 x (5 + 4): 1.45-1.67x; 1 x 9:
// 1.41-1.50x; 2 x 9: 1.29-1.39x; 3 x 9: 1.18-1.33x; 4 x 9: 1.35-1.44x (its int32 dots no longer
// fit the registers); 3 x (5 + 4): 1.37-1.59x.
constexpr int kDecodeNT = 9;
constexpr int kDecodeMR = 3;
// [mr == 1 ? 0 : 1][n - 1]: one panel (one row, and the panels left over at the end of a run),
// or kDecodeMR panels.
template <DType T>
constexpr PackedTileFn kDecodeTiles[2][kDecodeNT] = {
    {PackedTile<T, 1, 1>, PackedTile<T, 1, 2>, PackedTile<T, 1, 3>, PackedTile<T, 1, 4>,
     PackedTile<T, 1, 5>, PackedTile<T, 1, 6>, PackedTile<T, 1, 7>, PackedTile<T, 1, 8>,
     PackedTile<T, 1, 9>},
    {PackedTile<T, 3, 1>, PackedTile<T, 3, 2>, PackedTile<T, 3, 3>, PackedTile<T, 3, 4>,
     PackedTile<T, 3, 5>, PackedTile<T, 3, 6>, PackedTile<T, 3, 7>, PackedTile<T, 3, 8>,
     PackedTile<T, 3, 9>}};

template <DType T>
void MatMulPackedTileT(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  ForEachTile<kDecodeNT, kDecodeMR, kMR, kNT>(
      r0 / kPanelRows, PackedPanels(r1), t0, t1,
      [&](int64_t p, int64_t mr, int64_t nt) { kDecodeTiles<T>[mr == 1 ? 0 : 1][nt - 1](a, p, t0); },
      [&](int64_t p, int64_t t, int64_t mr, int64_t nt) { kPackedTiles<T>[mr - 1][nt - 1](a, p, t); });
}

}  // namespace

void Avx512MatMulPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  if (AmxTakes(a.w.type, t1 - t0) && AmxEnabled()) return AmxMatMulPackedTile(a, r0, r1, t0, t1);
  if (IsKQuant(a.w.type)) return Avx512KQuantPackedTile(a, r0, r1, t0, t1);
  if (a.w.type == DType::kQ8_0) return MatMulPackedTileT<DType::kQ8_0>(a, r0, r1, t0, t1);
  MatMulPackedTileT<DType::kQ4_0>(a, r0, r1, t0, t1);
}

}  // namespace kvl::ops
