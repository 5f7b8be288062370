// The packed Q8_0 GEMM's batched tiles on AMX-INT8 (see gemm_amx.h).
//
// Why: in vpdpbusd's GEMM (gemm_avx512.cc) every output vector of every block costs 8 vpdpbusd
// and 4 float operations (convert, dw * dx, multiply, add) on the same two vector ports, so the
// kernel tops out near 2/3 of the int8 peak. Here the tile unit computes a block's int32 dots for
// 16 tokens x 16 rows in one TDPBSUD, and the vector ports do only the float part.
//
// A tile of 16 tokens x one panel (16 rows) walks the blocks in order. For block b, TDPBSUD
// multiplies A = the block's 32 activation bytes of each token (signed, rows of the activation
// layout, act_stride apart) by B = the block's 8 group vectors of the panel (unsigned weights
// + 128, exactly the VNNI layout B wants: group g holds bytes 4g..4g+3 of each of the 16 rows),
// giving C[token][row] = sum (w + 128) x; the tile goes to memory and the vector code adds
// -128 * sum(x), converts, and accumulates float(dot) * (dw * dx), as vpdpbusd's kernel and the
// scalar one do. The integers are exact and the float operations the same, in the same order, so
// every output is bit-identical to theirs, whatever the tile or thread.
//
// Four C tiles take the blocks in turn: the tile unit computes blocks b + 1 .. b + kLookahead
// while the vector ports scale block b (a tile's dots reach the vector code through memory, a
// round trip longer than the scaling of one block).
#include "gemm_amx.h"

// As in kernels_avx512.cc: GCC 12's cast intrinsics trip -Wuninitialized on their undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#pragma GCC optimize("fp-contract=off")  // see kernels_avx512.cc

namespace kvl::ops {
namespace {

// Linux's arch_prctl request for the AMX tile data state (asm/prctl.h, kernel 5.16+).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool DetectAmxInt8() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_tile = (edx >> 24) & 1, amx_int8 = (edx >> 25) & 1;
  if (!amx_tile || !amx_int8) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1)) return false;  // OSXSAVE
  uint32_t xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const uint32_t tile_state = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
  if ((xcr0_lo & tile_state) != tile_state) return false;
  // The kernel hands out the 8 KiB tile state only to processes that ask for it.
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  const char* env = std::getenv("KVL_AMX");
  return env == nullptr || (std::strcmp(env, "off") != 0 && std::strcmp(env, "0") != 0);
}

std::atomic<bool> g_amx_allowed{true};

// Token groups that share one pass over the weights (64 tokens: a MatMul task's token tile).
constexpr int64_t kAmxChunkGroups = 4;
// Blocks in flight on the tile unit ahead of the one being scaled (at most 3: four C tiles).
constexpr int64_t kLookahead = 2;

// The tiles' shapes (palette 1): C0-C3 16 x 16 int32; A0, A1 16 tokens x 32 bytes; B0, B1 8 group
// rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 32, 32, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 8, 8};
};

// Block b's int32 dots of 16 tokens x 16 rows, on C tile b % 4 (tmm0-3) from A tile b % 2 (tmm4-5)
// and B tile b % 2 (tmm6-7); StoreDots then writes them to memory ([token][row]). The two are
// apart so that the tile unit multiplies the next blocks while a finished one is stored: a store
// right behind its own TDPBSUD waits out the multiply's whole latency, and the tile unit with it.
// GCC's tile intrinsics paste the tile number into the instruction, hence a literal per case.
#define KVL_AMX_DOTS(kC, kA, kB)   \
  do {                             \
    _tile_zero(kC);                \
    _tile_loadd(kA, acts, stride); \
    _tile_loadd(kB, quants, 64);   \
    _tile_dpbsud(kC, kA, kB);      \
  } while (0)
inline void ComputeDots(int64_t b, const uint8_t* acts, int64_t stride, const uint8_t* quants) {
  switch (b % 4) {
    case 0: KVL_AMX_DOTS(0, 4, 6); break;
    case 1: KVL_AMX_DOTS(1, 5, 7); break;
    case 2: KVL_AMX_DOTS(2, 4, 6); break;
    default: KVL_AMX_DOTS(3, 5, 7); break;
  }
}
#undef KVL_AMX_DOTS
inline void StoreDots(int64_t b, int32_t* out) {
  switch (b % 4) {
    case 0: _tile_stored(0, out, 64); break;
    case 1: _tile_stored(1, out, 64); break;
    case 2: _tile_stored(2, out, 64); break;
    default: _tile_stored(3, out, 64); break;
  }
}

// A token group's per-block activation terms, transposed to [block][token] so that the scaling
// reads each as one broadcast operand from memory: -128 * sum(x) over the block (what the
// unsigned weights' +128 adds to the dot) and the activation scale dx.
struct GroupTerms {
  int32_t* neg_sums;  // [nb][kAmxTokens]
  float* dx;          // [nb][kAmxTokens]
};

// The terms of up to kAmxChunkGroups groups of rows nb blocks wide, in memory of the calling
// thread that grows to the widest rows it has seen and is then reused: allocated on a thread's
// first call, not in every thread's static TLS (which glibc zeroes at each thread's start).
GroupTerms ThreadGroupTerms(int64_t g, int64_t nb) {
  thread_local std::vector<int32_t> storage;  // [group][neg_sums, dx][nb][kAmxTokens]
  const size_t group_words = static_cast<size_t>(2 * nb * kAmxTokens);
  if (storage.size() < kAmxChunkGroups * group_words) storage.resize(kAmxChunkGroups * group_words);
  int32_t* base = storage.data() + static_cast<size_t>(g) * group_words;
  return {base, reinterpret_cast<float*>(base + nb * kAmxTokens)};
}

void FillGroupTerms(const uint8_t* acts, int64_t stride, int64_t cols, const GroupTerms& terms) {
  const int64_t nb = cols / 32;
  for (int64_t j = 0; j < kAmxTokens; ++j) {
    const uint8_t* row = acts + j * stride;
    const auto* dx = reinterpret_cast<const float*>(row + ActScalesOffset(cols));
    const auto* sx = reinterpret_cast<const int32_t*>(row + ActSumsOffset(cols));
    for (int64_t b = 0; b < nb; ++b) {
      terms.neg_sums[b * kAmxTokens + j] = -128 * sx[b];
      terms.dx[b * kAmxTokens + j] = dx[b];
    }
  }
}

// facc[j] += float(dot[j] - 128 * sum(x_j)) * (dw * dx_j) for block b's 16 tokens.
inline void ScaleBlock(const int32_t* dots, const uint8_t* scales, const int32_t* neg_sums,
                       const float* dx, __m512* facc) {
  const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales)));
#pragma GCC unroll 16
  for (int j = 0; j < kAmxTokens; ++j) {
    const __m512i dot =
        _mm512_add_epi32(_mm512_load_si512(dots + 16 * j), _mm512_set1_epi32(neg_sums[j]));
    const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx[j]));
    facc[j] = _mm512_add_ps(facc[j], _mm512_mul_ps(_mm512_cvtepi32_ps(dot), s));
  }
}

// A step's K/V weights come from DRAM: the first token group streams each panel's blocks, and
// the tile loads have no prefetch of their own, so the next blocks are asked for ahead, as the
// vpdpbusd kernel does (kernel_table.h: near into L1, far into L2). The later groups find the
// task's panels in L2.
inline void PrefetchBlock(const uint8_t* quants) {
  const char* p = reinterpret_cast<const char*>(quants);
  for (int line = 0; line < 8; ++line) {
    _mm_prefetch(p + kBatchedPrefetchL1Bytes + 64 * line, _MM_HINT_T0);
    _mm_prefetch(p + kBatchedPrefetchL2Bytes + 64 * line, _MM_HINT_T1);
  }
}

}  // namespace

bool AmxInt8Usable() {
  static const bool present = DetectAmxInt8();
  return present && g_amx_allowed.load(std::memory_order_relaxed);
}

void SetAmxInt8Allowed(bool allowed) { g_amx_allowed.store(allowed, std::memory_order_relaxed); }

void AmxPackedTileQ8_0(const MatMulArgs& a, int64_t p0, int64_t p1, int64_t t0, int64_t t1) {
  constexpr int64_t kQB = 512;  // quant bytes of one block of a panel
  const int64_t cols = a.w.cols;
  const int64_t nb = cols / 32;
  const int64_t rows = a.w.rows;
  const int64_t panel_bytes = PackedPanelBytes(DType::kQ8_0, cols);
  const int64_t pair_bytes = PackedPairBytes(DType::kQ8_0);
  const int64_t stride = a.act_stride;
  // The tiles are configured for this call and released after it, so a thread that is not in
  // here carries no tile state (an 8 KiB save at every context switch otherwise).
  static const TileConfig kConfig;
  _tile_loadconfig(&kConfig);
  alignas(64) int32_t dots[4][kAmxTokens * 16];
  // Chunks of up to kAmxChunkGroups token groups; in a chunk, panels outer and groups inner, so a
  // panel's weights come from memory once and serve every group from cache, and the next panel's
  // are prefetched into L2 a few lines per block meanwhile, never waited for.
  for (int64_t chunk = t0; chunk < t1; chunk += kAmxChunkGroups * kAmxTokens) {
    const int64_t groups = std::min(kAmxChunkGroups, (t1 - chunk) / kAmxTokens);
    for (int64_t g = 0; g < groups; ++g) {
      FillGroupTerms(a.acts + (chunk + g * kAmxTokens) * stride, stride, cols, ThreadGroupTerms(g, nb));
    }
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* w = static_cast<const uint8_t*>(a.w.data) + p * panel_bytes;
      // Blocks go in pairs: quants of the even block, of the odd one, then both blocks' scales.
      auto pair = [&](int64_t b) { return w + (b / 2) * pair_bytes; };
      // The next panel's lines spread evenly over this panel's blocks of every group.
      const char* next_panel = reinterpret_cast<const char*>(w + panel_bytes);
      const int64_t lines_per_block = (panel_bytes / 64 + nb * groups - 1) / (nb * groups);
      int64_t prefetched = p + 1 < p1 ? 0 : panel_bytes;  // bytes of the next panel asked for
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t t = chunk + g * kAmxTokens;
        const uint8_t* acts = a.acts + t * stride;
        const GroupTerms tg = ThreadGroupTerms(g, nb);
        const bool cold = p == p0 && g == 0;  // the chunk's first panel, not prefetched
        __m512 facc[kAmxTokens];
        for (__m512& f : facc) f = _mm512_setzero_ps();
        auto compute = [&](int64_t b) {
          ComputeDots(b, acts + b * 32, stride, pair(b) + (b % 2) * kQB);
        };
        for (int64_t b = 0; b < std::min(nb, kLookahead); ++b) compute(b);
        for (int64_t b = 0; b < nb; ++b) {
          if (cold) PrefetchBlock(pair(b) + (b % 2) * kQB);
          if (prefetched < panel_bytes) {
            for (int64_t line = 0; line < lines_per_block; ++line) {
              _mm_prefetch(next_panel + prefetched + 64 * line, _MM_HINT_T1);
            }
            prefetched += 64 * lines_per_block;
          }
          if (b + kLookahead < nb) compute(b + kLookahead);
          StoreDots(b, dots[b % 4]);
          ScaleBlock(dots[b % 4], pair(b) + 2 * kQB + (b % 2) * 32, tg.neg_sums + b * kAmxTokens,
                     tg.dx + b * kAmxTokens, facc);
        }
        const int64_t r = p * kPanelRows;
        const __mmask16 m = r + kPanelRows <= rows ? __mmask16{0xFFFF}
                                                   : static_cast<__mmask16>((1u << (rows - r)) - 1);
        for (int j = 0; j < kAmxTokens; ++j) {
          _mm512_mask_storeu_ps(a.y + (t + j) * rows + r, m, facc[j]);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace kvl::ops
