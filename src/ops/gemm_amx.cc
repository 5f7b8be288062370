// AMX tiles for the AVX-512 table's packed int8 GEMM (amx.h): Q8_0 / Q4_0 blocks as tdpbsud
// tiles, their float operations on the vector ports as in the VNNI tiles.
//
// One call covers one panel (16 rows) x up to 16 tokens. Per 32-value block: A = the tokens'
// activation bytes of the block (int8, tokens x 32 bytes, read where they lie), B = the block's
// code vectors (unsigned, 8 rows of 64 bytes: Q8_0's straight from the packed weights, Q4_0's
// unpacked to a buffer), C = tdpbsud(A, B): the int32 dot of every (token, row), stored to a
// buffer. The vector ports then give each dot the float operations of the VNNI tile, in its
// order, so every output is bit-identical to the scalar kernel's.
//
// Two sets of tile registers take consecutive blocks in turn, and the vector ports finish one
// block while TMUL multiplies the next.
#include <immintrin.h>

// As in kernels_avx512.cc: GCC 12's cast intrinsics trip -Wuninitialized on their undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <array>
#include <utility>

#include "amx.h"
#include "kernel_table.h"
#include "kvl/status.h"

#pragma GCC optimize("fp-contract=off")  // see kernels_avx512.cc

namespace kvl::ops {
namespace {

// Tokens per tile: the rows of an A and a C tile.
constexpr int kMaxTileTokens = static_cast<int>(kAmxMaxTokens);

// Tile registers: set S (0 or 1) uses C = tmm(0 + S) for the dots, A = tmm(2 + S) for the
// activations and B = tmm(4 + S) for the codes. (GCC's tile intrinsics paste the register number
// into their assembly text: it must be a literal, hence the two spelled-out sets below.)
constexpr int kDots = 0;
constexpr int kActs = 2;
constexpr int kCodes = 4;

// The ldtilecfg operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Loads the tile shapes of one call (one panel): an ldtilecfg per panel is noise beside its
// blocks, and nothing has to track which shapes a thread's tiles hold.
void ConfigureTiles(int tokens, int block_bytes) {
  TileConfig c;
  for (int s = 0; s < 2; ++s) {
    c.rows[kDots + s] = static_cast<uint8_t>(tokens);
    c.colsb[kDots + s] = 64;
    c.rows[kActs + s] = static_cast<uint8_t>(tokens);
    c.colsb[kActs + s] = static_cast<uint16_t>(block_bytes);
    c.rows[kCodes + s] = static_cast<uint8_t>(block_bytes / 4);
    c.colsb[kCodes + s] = 64;
  }
  // Not _tile_loadconfig: GCC 12 does not see that builtin read the shapes and drops their stores
  // (palette 1 with no tile configured: the first tileloadd then faults).
  asm volatile("ldtilecfg %0" : : "m"(c));
}

// dots[j][i] = sum over the block of acts[j * act_stride + k] * code k of row i: tokens x 16
// int32, with tile set S, from a block's 512 bytes of codes. GCC's tile intrinsics are asm statements that
// name no memory: the empty asm statements around them tell the compiler that the codes written
// before are read here and the dots read after are written here.
template <int S, int kDotCount>
inline void TileDots(const uint8_t* acts, int64_t act_stride, const uint8_t* codes,
                     int32_t* dots) {
  asm volatile("" : : "m"(*reinterpret_cast<const uint8_t(*)[512]>(codes)));
  if constexpr (S == 0) {
    _tile_loadd(2, acts, act_stride);
    _tile_loadd(4, codes, 64);
    _tile_zero(0);
    _tile_dpbsud(0, 2, 4);
    _tile_stored(0, dots, 64);
  } else {
    _tile_loadd(3, acts, act_stride);
    _tile_loadd(5, codes, 64);
    _tile_zero(1);
    _tile_dpbsud(1, 3, 5);
    _tile_stored(1, dots, 64);
  }
  asm volatile("" : "=m"(*reinterpret_cast<int32_t(*)[kDotCount]>(dots)));
}

// The weight stream's prefetch, as the VNNI tiles' for batched decode (kernel_table.h).
inline void PrefetchLines(const uint8_t* p, int lines) {
  const char* here = reinterpret_cast<const char*>(p);
  for (int l = 0; l < lines; ++l) {
    _mm_prefetch(here + kBatchedPrefetchL1Bytes + 64 * l, _MM_HINT_T0);
    _mm_prefetch(here + kBatchedPrefetchL2Bytes + 64 * l, _MM_HINT_T1);
  }
}

// Q8_0 / Q4_0: y[t + j][16 * panel + ...] for j < NT tokens. Per block, as the VNNI tile:
// acc += float(dot - C * sum(x)) * (dw * dx).
template <DType T, int NT>
class BlockPanel {
 public:
  BlockPanel(const MatMulArgs& a, int64_t panel, int64_t t)
      : a_(a),
        w_(static_cast<const uint8_t*>(a.w.data) + panel * PackedPanelBytes(T, a.w.cols)),
        acts_(a.acts + t * a.act_stride),
        dx_(reinterpret_cast<const float*>(acts_ + ActScalesOffset(a.w.cols))),
        sx_(reinterpret_cast<const int32_t*>(acts_ + ActSumsOffset(a.w.cols))),
        fstride_(a.act_stride / 4),
        panel_(panel),
        t_(t) {}

  void Run() {
    ConfigureTiles(NT, 32);
    for (int j = 0; j < NT; ++j) acc_[j] = _mm512_setzero_ps();
    // Block b's codes are unpacked at step b, multiplied at step b + 1 (the tile sets in turn)
    // and finished at step b + kDepth - 1, so that neither a tile load nor a vector load waits on
    // a store still in flight (neither is forwarded from the store buffer: each would wait for
    // the store to reach the cache).
    const int64_t nb = a_.w.cols / 32;
    for (int64_t step = 0; step < nb + kDepth - 1; ++step) {
      if (step < nb) Unpack(step);
      if (step >= 1 && step - 1 < nb) {
        if ((step - 1) % 2 == 0) {
          Multiply<0>(step - 1);
        } else {
          Multiply<1>(step - 1);
        }
      }
      if (step >= kDepth - 1) Finish(step - (kDepth - 1));
    }
    const int64_t rows = a_.w.rows;
    const int64_t r = panel_ * kPanelRows;
    const __mmask16 m = r + kPanelRows <= rows ? __mmask16{0xFFFF}
                                               : static_cast<__mmask16>((1u << (rows - r)) - 1);
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(a_.y + (t_ + j) * rows + r, m, acc_[j]);
  }

 private:
  static constexpr int kC = T == DType::kQ8_0 ? 128 : 8;  // the codes' offset
  static constexpr int64_t kQB = T == DType::kQ8_0 ? 512 : 256;  // a block's code bytes
  static constexpr int64_t kPairBytes = 2 * kQB + 64;

  static constexpr int kDepth = 4;  // blocks in flight: unpacked, multiplied, finished

  const uint8_t* Pair(int64_t b) const { return w_ + (b / 2) * kPairBytes; }
  const uint8_t* Quants(int64_t b) const { return Pair(b) + (b % 2) * kQB; }

  // Q4_0: block b's 8 code vectors to codes_[b % kDepth] (vector v of the block holds code
  // vectors 2v, low nibbles, and 2v + 1, high nibbles). Q8_0's are in the panel as they are.
  void Unpack(int64_t b) {
    const uint8_t* quants = Quants(b);
    PrefetchLines(quants, kQB / 64);
    if constexpr (T == DType::kQ4_0) {
      uint8_t* codes = codes_[b % kDepth];
      const __m512i nibble = _mm512_set1_epi8(0x0F);
      for (int v = 0; v < 4; ++v) {
        const __m512i raw = _mm512_load_si512(quants + 64 * v);
        _mm512_store_si512(codes + 128 * v, _mm512_and_si512(raw, nibble));
        _mm512_store_si512(codes + 128 * v + 64,
                           _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble));
      }
    }
  }

  template <int S>
  void Multiply(int64_t b) {
    const uint8_t* codes = T == DType::kQ4_0 ? codes_[b % kDepth] : Quants(b);
    TileDots<S, NT * 16>(acts_ + b * 32, a_.act_stride, codes, dots_[b % kDepth]);
  }

  void Finish(int64_t b) {
    const auto* scales = Pair(b) + 2 * kQB + (b % 2) * 32;
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales)));
    const int32_t* dots = dots_[b % kDepth];
    for (int j = 0; j < NT; ++j) {
      const __m512i dot = _mm512_add_epi32(_mm512_load_si512(dots + 16 * j),
                                           _mm512_set1_epi32(-kC * sx_[j * fstride_ + b]));
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx_[j * fstride_ + b]));
      acc_[j] = _mm512_add_ps(acc_[j], _mm512_mul_ps(_mm512_cvtepi32_ps(dot), s));
    }
  }

  const MatMulArgs& a_;
  const uint8_t* w_;
  const uint8_t* acts_;
  const float* dx_;
  const int32_t* sx_;
  const int64_t fstride_;
  const int64_t panel_, t_;
  __m512 acc_[NT];
  alignas(64) uint8_t codes_[kDepth][512];  // Q4_0: a block's 8 code vectors
  alignas(64) int32_t dots_[kDepth][NT * 16];
};

using PanelFn = void (*)(const MatMulArgs&, int64_t panel, int64_t t);

template <DType T, int NT>
void RunPanel(const MatMulArgs& a, int64_t panel, int64_t t) {
  BlockPanel<T, NT>(a, panel, t).Run();
}

template <DType T, int... I>
constexpr std::array<PanelFn, sizeof...(I)> PanelTable(std::integer_sequence<int, I...>) {
  return {RunPanel<T, I + 1>...};
}
template <DType T>
constexpr auto kPanels = PanelTable<T>(std::make_integer_sequence<int, kMaxTileTokens>{});

template <DType T>
void AmxPackedTileT(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  const int64_t n = t1 - t0;  // at most kAmxMaxTokens (AmxTakes): one tile per panel
  KVL_CHECK(n >= 1 && n <= kAmxMaxTokens);
  for (int64_t p = r0 / kPanelRows; p < PackedPanels(r1); ++p) kPanels<T>[n - 1](a, p, t0);
}

}  // namespace

void AmxMatMulPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  switch (a.w.type) {
    case DType::kQ8_0:
      return AmxPackedTileT<DType::kQ8_0>(a, r0, r1, t0, t1);
    case DType::kQ4_0:
      return AmxPackedTileT<DType::kQ4_0>(a, r0, r1, t0, t1);
    default:
      KVL_CHECK_MSG(false, "AMX tiles: no kernel for this weight type (AmxTakes says which)");
  }
}

}  // namespace kvl::ops
