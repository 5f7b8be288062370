// AMX int8 GEMM over packed Q8_0 and K-quant weights (kernel_table.h's layout), for 2 to 16 tokens
// per tile: verify steps of speculative decoding, decode of several sequences, prefill.
//
// The packed layout already is the one TDPBSUD wants for its unsigned operand: a block's (Q8_0) or
// sub-block's (K-quants) code vectors, each holding 4 consecutive values of the panel's 16 rows,
// are the rows of the B tile (depth / 4 rows x 64 bytes). The A tile is the tokens' int8
// activations of the same 32 (Q6_K: 16) values, straight from the quantized rows (one tile row per
// token, the row stride as the tile stride). One TDPBSUD leaves the block's int32 dots of 16 rows
// x up to 16 tokens in the C tile: row j of it is token j's 16 outputs, the lanes of one vector,
// exactly as the VNNI kernels hold them. Q8_0's B tile loads from the weights themselves; a
// K-quant sub-block is first unpacked (nibbles, high bits) to 4 KiB of stack, in registers, once
// per tile for all its tokens.
//
// Exactness: the dots are the same integers as vpdpbusd's (no saturation; Q8_0's + 128 offset
// removed with the same int32 correction), and the float work after them is the VNNI kernels'
// (gemm_avx512.cc, gemm_kquant_avx512.cc) operation for operation, so every output is
// bit-identical to the scalar kernel's whatever the tile, the batch or the path.
//
// Compiled with the AVX-512 table's flags plus AMX-TILE and AMX-INT8; only ever called through
// AmxEnabled() (amx.cc), which asks the CPU, the OS and the kernel's permission first.
#include <immintrin.h>

// As in kernels_avx512.cc: GCC 12's cast intrinsics trip -Wuninitialized on their undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "amx.h"
#include "kernel_table.h"
#include "kquant_kernels.h"
#include "kquant_packed_avx512.h"

#pragma GCC optimize("fp-contract=off")  // see kernels_avx512.cc

// Tile instructions with a "memory" clobber: GCC 12's _tile_loadd does not tell the compiler that
// it reads memory, so stores to the unpacked codes could be moved past it. Tile numbers must be
// literals (they are pasted into the instruction).
#define KVL_TILE_LOAD(tile, base, stride)                                        \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #tile ::"r"((const void*)(base)), \
                   "r"(static_cast<long>(stride))                                 \
                   : "memory")
#define KVL_TILE_STORE(tile, base, stride)                                       \
  __asm__ volatile("tilestored %%tmm" #tile ", (%0,%1,1)" ::"r"((void*)(base)), \
                   "r"(static_cast<long>(stride))                                \
                   : "memory")
#define KVL_TILE_ZERO(tile) __asm__ volatile("tilezero %%tmm" #tile ::)
// dst += A (signed bytes) x B (unsigned bytes), int32.
#define KVL_TILE_DPBSUD(dst, a, b) \
  __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #dst ::)

namespace kvl::ops {
namespace {

using namespace kquant_packed;  // NOLINT: the K-quant pieces shared with the VNNI kernel

// The tile shapes: tmm0-3 C (tokens x 16 int32), tmm4 / tmm5 A (tokens x depth bytes), tmm6 /
// tmm7 B (depth / 4 x 64 bytes). Block i of a tile goes to C tile i % 4 and A / B tiles i % 2, and
// its dots are scaled two blocks later: a tile store takes as long as several products here
// (Sapphire Rapids VM: ~6 ns a store against ~4 ns a 9-token product), so four blocks are in
// flight at once.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The shape this thread's tiles are configured for (0 tokens: none yet). ldtilecfg costs far more
// than a tile instruction, and one MatMul call keeps one shape, so it runs only when that changes.
struct TileShape {
  int tokens = 0;
  int depth = 0;
};
thread_local TileShape t_shape;

inline void ConfigureTiles(int tokens, int depth) {
  if (t_shape.tokens == tokens && t_shape.depth == depth) return;
  TileConfig cfg;
  for (int c = 0; c < 4; ++c) {
    cfg.rows[c] = static_cast<uint8_t>(tokens);
    cfg.colsb[c] = 64;
  }
  for (int c = 4; c < 6; ++c) {
    cfg.rows[c] = static_cast<uint8_t>(tokens);
    cfg.colsb[c] = static_cast<uint16_t>(depth);
    cfg.rows[c + 2] = static_cast<uint8_t>(depth / 4);
    cfg.colsb[c + 2] = 64;
  }
  // The whole 64-byte struct as the operand (GCC 12's _tile_loadconfig names only 8 of its bytes,
  // so the compiler may leave the rest unwritten).
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  t_shape = {tokens, depth};
}

// C tile i % 4 = A x B, stored to dots[i % 4] ([token][row] int32): the int32 dots of one block.
inline void IssueBlockDots(int64_t i, const uint8_t* b_tile, const uint8_t* a_rows, int64_t stride,
                           int32_t (*dots)[16 * 16]) {
  switch (i % 4) {
    case 0:
      KVL_TILE_LOAD(6, b_tile, 64);
      KVL_TILE_LOAD(4, a_rows, stride);
      KVL_TILE_ZERO(0);
      KVL_TILE_DPBSUD(0, 4, 6);
      KVL_TILE_STORE(0, dots[0], 64);
      break;
    case 1:
      KVL_TILE_LOAD(7, b_tile, 64);
      KVL_TILE_LOAD(5, a_rows, stride);
      KVL_TILE_ZERO(1);
      KVL_TILE_DPBSUD(1, 5, 7);
      KVL_TILE_STORE(1, dots[1], 64);
      break;
    case 2:
      KVL_TILE_LOAD(6, b_tile, 64);
      KVL_TILE_LOAD(4, a_rows, stride);
      KVL_TILE_ZERO(2);
      KVL_TILE_DPBSUD(2, 4, 6);
      KVL_TILE_STORE(2, dots[2], 64);
      break;
    default:
      KVL_TILE_LOAD(7, b_tile, 64);
      KVL_TILE_LOAD(5, a_rows, stride);
      KVL_TILE_ZERO(3);
      KVL_TILE_DPBSUD(3, 5, 7);
      KVL_TILE_STORE(3, dots[3], 64);
      break;
  }
}

inline void PrefetchStream(const uint8_t* p, int64_t lines) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t l = 0; l < lines; ++l) {
    _mm_prefetch(c + kBatchedPrefetchL1Bytes + 64 * l, _MM_HINT_T0);
    _mm_prefetch(c + kBatchedPrefetchL2Bytes + 64 * l, _MM_HINT_T1);
  }
}

inline __mmask16 PanelMask(int64_t rows, int64_t r) {
  return r + kPanelRows <= rows ? __mmask16{0xFFFF}
                                : static_cast<__mmask16>((1u << (rows - r)) - 1);
}

// ---- Q8_0 -------------------------------------------------------------------------------------

// y[t + j][16 * panel + ...] for j < NT tokens, Q8_0: per block, in order,
// facc += float(dot) * (dw * dx), as gemm_avx512.cc's PackedTile.
template <int NT>
void AmxQ8Tile(const MatMulArgs& a, int64_t panel, int64_t t) {
  constexpr int64_t kQB = 512;  // quant bytes of one block of a panel
  const int64_t cols = a.w.cols;
  const int64_t nb = cols / 32;
  const int64_t pair_bytes = PackedPairBytes(DType::kQ8_0);
  const uint8_t* w =
      static_cast<const uint8_t*>(a.w.data) + panel * PackedPanelBytes(DType::kQ8_0, cols);
  const int64_t stride = a.act_stride;
  const uint8_t* acts = a.acts + t * stride;
  const auto* dx = reinterpret_cast<const float*>(acts + ActScalesOffset(cols));
  const auto* sx = reinterpret_cast<const int32_t*>(acts + ActSumsOffset(cols));
  const int64_t fstride = stride / 4;  // dx and sx rows, in elements

  alignas(64) int32_t dots[4][16 * 16];
  __m512 facc[NT];
  for (int j = 0; j < NT; ++j) facc[j] = _mm512_setzero_ps();
  // Block b's dots (in dots[b % 4]) into the accumulators.
  auto accumulate = [&](int64_t b) {
    const uint8_t* pair = w + (b / 2) * pair_bytes;
    const __m512 dw = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(pair + 2 * kQB + (b % 2) * 32)));
    const int32_t* d = dots[b % 4];
    for (int j = 0; j < NT; ++j) {
      const __m512i dot = _mm512_add_epi32(_mm512_load_si512(d + 16 * j),
                                           _mm512_set1_epi32(-128 * sx[j * fstride + b]));
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx[j * fstride + b]));
      facc[j] = _mm512_add_ps(facc[j], _mm512_mul_ps(_mm512_cvtepi32_ps(dot), s));
    }
  };
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pair = w + (b / 2) * pair_bytes;
    if (b % 2 == 0) PrefetchStream(pair, pair_bytes / 64);
    IssueBlockDots(b, pair + (b % 2) * kQB, acts + b * 32, stride, dots);
    if (b >= 2) accumulate(b - 2);
  }
  for (int64_t b = std::max<int64_t>(0, nb - 2); b < nb; ++b) accumulate(b);

  const __mmask16 m = PanelMask(a.w.rows, panel * kPanelRows);
  for (int j = 0; j < NT; ++j) {
    _mm512_mask_storeu_ps(a.y + (t + j) * a.w.rows + panel * kPanelRows, m, facc[j]);
  }
}

// ---- K-quants ---------------------------------------------------------------------------------

// The code vectors of super-block blk, unpacked to bytes: [sub-block][code vector][64 bytes].
template <DType T>
inline void UnpackCodes(const uint8_t* blk, uint8_t* out) {
  constexpr KQuantPanelLayout kL = KQuantPanel(T);
  constexpr int kSub = kSubBlocks<T>;
  constexpr int kLoads = 32 / kSub;  // code loads per sub-block, two code vectors each
  const uint8_t* high_bits = blk + kL.bits;  // Q5_K, Q6_K (outside the lambda: GCC 12 ICEs on kL)
  StaticFor<kSub>([&](auto sc) {
    constexpr int kS = decltype(sc)::value;
    __m512i hb = _mm512_setzero_si512();
    if constexpr (T != DType::kQ4_K) hb = _mm512_load_si512(high_bits + 64 * kS);
    StaticFor<kLoads>([&](auto v) {
      constexpr int kV = decltype(v)::value;
      __m512i lo, hi;
      CodePair<T, 2 * kV>(blk, kS * kLoads + kV, hb, &lo, &hi);
      _mm512_store_si512(out + 128 * (kS * kLoads + kV), lo);
      _mm512_store_si512(out + 128 * (kS * kLoads + kV) + 64, hi);
    });
  });
}

// y[t + j][16 * panel + ...] for j < NT tokens: pass 1 (acc) with the sub-block dots from the tile
// unit, as gemm_kquant_avx512.cc's PackedKQuantTile computes them with vpdpbusd; pass 2 and the
// store are that kernel's (FinishTile). Super-block sb + 1 is unpacked while sb's sub-blocks are
// in the tile unit, so no tile load reads bytes stored just before it.
template <DType T, int NT>
void AmxKQuantTile(const MatMulArgs& a, int64_t panel, int64_t t) {
  constexpr KQuantPanelLayout kL = KQuantPanel(T);
  constexpr int kSub = kSubBlocks<T>;
  constexpr int kDepth = kQK_K / kSub;  // values per sub-block: the A tile's bytes per row
  const int64_t cols = a.w.cols;
  const int64_t n_sb = cols / kQK_K;
  const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + panel * PackedPanelBytes(T, cols);
  const int64_t stride = a.act_stride;
  const uint8_t* acts = a.acts + t * stride;
  const auto* dx = reinterpret_cast<const float*>(acts + ActScalesOffset(cols));
  const int64_t fstride = stride / 4;  // dx rows, in elements

  alignas(64) uint8_t codes[2][64 * 64];  // two super-blocks' code vectors, [sb % 2]
  alignas(64) int32_t dots[4][16 * 16];   // C tiles: [sub-block % 4][token][row]
  __m512 dsc[2][kSub];                    // the sub-blocks' d * sc, [sb % 2]
  __m512 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_ps();
  // Sub-block i (counted over the whole row) into the accumulators, from dots[i % 4].
  auto accumulate = [&](int64_t i) {
    const int64_t sb = i / kSub;
    const int s = static_cast<int>(i % kSub);
    const int64_t b = sb * 8 + s * 8 / kSub;  // the activation block holding sub-block s
    const __m512 f = dsc[sb % 2][s];
    for (int j = 0; j < NT; ++j) {
      const __m512 scale = _mm512_mul_ps(f, _mm512_set1_ps(dx[j * fstride + b]));
      const __m512i dot = _mm512_load_si512(dots[i % 4] + 16 * j);
      acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(dot)));
    }
  };
  UnpackCodes<T>(w, codes[0]);
  for (int64_t sb = 0; sb < n_sb; ++sb) {
    const uint8_t* blk = w + sb * kL.super_bytes;
    PrefetchStream(blk, kL.super_bytes / 64);
    SubBlockFactors<T, false>(blk, dsc[sb % 2]);
    const uint8_t* b_tiles = codes[sb % 2];
    for (int s = 0; s < kSub; ++s) {
      const int64_t i = sb * kSub + s;
      IssueBlockDots(i, b_tiles + s * kDepth * 16, acts + sb * kQK_K + s * kDepth, stride, dots);
      if (i >= 2) accumulate(i - 2);
    }
    if (sb + 1 < n_sb) UnpackCodes<T>(blk + kL.super_bytes, codes[(sb + 1) % 2]);
  }
  for (int64_t i = std::max<int64_t>(0, n_sb * kSub - 2); i < n_sb * kSub; ++i) accumulate(i);

  FinishTile<T, NT>(a, panel, t, acc);
}

// ---- Dispatch ---------------------------------------------------------------------------------

using TileFn = void (*)(const MatMulArgs&, int64_t, int64_t);
constexpr int kMaxTokens = 16;  // rows of a tile

template <int... N>
constexpr std::array<TileFn, sizeof...(N)> Q8Tiles(std::integer_sequence<int, N...>) {
  return {AmxQ8Tile<N + 1>...};
}
template <DType T, int... N>
constexpr std::array<TileFn, sizeof...(N)> KQuantTiles(std::integer_sequence<int, N...>) {
  return {AmxKQuantTile<T, N + 1>...};
}
constexpr auto kQ8Tiles = Q8Tiles(std::make_integer_sequence<int, kMaxTokens>{});
template <DType T>
constexpr auto kKQuantTiles = KQuantTiles<T>(std::make_integer_sequence<int, kMaxTokens>{});

// Token tiles of up to 16 outer, panels inner: up to 16 tokens (decode, verify) stream the
// weights once; a prefill task (64 rows x 64 tokens, ops.cc) reads its panels from L2 again for
// each token tile, and reconfigures the tiles at most once, for the last, shorter token tile.
void ForEachAmxTile(const std::array<TileFn, kMaxTokens>& tiles, int depth, const MatMulArgs& a,
                    int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t += kMaxTokens) {
    const int64_t nt = std::min<int64_t>(kMaxTokens, t1 - t);
    ConfigureTiles(static_cast<int>(nt), depth);
    for (int64_t p = r0 / kPanelRows; p < PackedPanels(r1); ++p) tiles[nt - 1](a, p, t);
  }
}

}  // namespace

void AmxQ8PackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  ForEachAmxTile(kQ8Tiles, 32, a, r0, r1, t0, t1);
}

void AmxKQuantPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  switch (a.w.type) {
    case DType::kQ4_K:
      return ForEachAmxTile(kKQuantTiles<DType::kQ4_K>, 32, a, r0, r1, t0, t1);
    case DType::kQ5_K:
      return ForEachAmxTile(kKQuantTiles<DType::kQ5_K>, 32, a, r0, r1, t0, t1);
    default:
      return ForEachAmxTile(kKQuantTiles<DType::kQ6_K>, 16, a, r0, r1, t0, t1);
  }
}

}  // namespace kvl::ops
