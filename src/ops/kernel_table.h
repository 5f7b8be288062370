// Internal: the per-ISA kernel table that ops.cc dispatches through, and the layout of quantized
// activations in OpsContext scratch. Each kernels_<isa>.cc fills one table; nothing here needs ISA
// compile flags.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvl/ops.h"
#include "isa_features.h"

namespace kvl::ops {

inline int64_t AlignUp64(int64_t n) { return (n + 63) & ~int64_t{63}; }

// Activations quantized for Q8_0/Q4_0 and K-quant weights, one row per token:
//   [blocks*32] int8 values (signed, q = rint(x / d)), padded to 64 bytes,
//   [blocks] float scales d = amax / 127 (kept in fp32, unlike llama.cpp's fp16), padded,
//   [blocks] int32 sums of each block's 32 values (for the packed kernels' unsigned-weight
//   correction; filled by ops.cc after quantize_acts), padded,
//   [blocks] floats d * (sum of a 32-value block) (KQuantActSums, for the packed Q4_K / Q5_K mins)
//   and [2 * blocks] int32 -32 * (sum of a 16-value half block) (Q6_K's code offset: its integer
//   dots start from it), both filled by ops.cc only when a packed K-quant matrix reads the row,
//   padded.
// Quantization is the same function of a row on every ISA, so the quantized bytes never depend on
// the ISA, the batch or the thread.
inline int64_t ActScalesOffset(int64_t cols) { return AlignUp64(cols); }
inline int64_t ActSumsOffset(int64_t cols) { return AlignUp64(cols) + AlignUp64(cols / 32 * 4); }
inline int64_t ActKQuantSums32Offset(int64_t cols) {
  return ActSumsOffset(cols) + AlignUp64(cols / 32 * 4);
}
inline int64_t ActQ6OffsetsOffset(int64_t cols) {
  return ActKQuantSums32Offset(cols) + AlignUp64(cols / 32 * 4);
}
inline int64_t ActRowStride(int64_t cols) {
  return ActQ6OffsetsOffset(cols) + AlignUp64(cols / 16 * 4);
}

inline constexpr bool IsKQuant(DType type) {
  return type == DType::kQ4_K || type == DType::kQ5_K || type == DType::kQ6_K;
}

// The packed layout of Q8_0 / Q4_0 weights (MatrixLayout::kPacked, built by PackMatrix) for int8
// dot-product kernels whose vector lanes are 16 output rows (vpdpbusd: 16 int32 lanes, 4 bytes
// each). Rows are grouped in panels of 16 (the last one padded with zero rows); a panel is
// contiguous, its blocks in order, two blocks at a time:
//   [quants of block 2p][quants of block 2p + 1][16 f16 scales of 2p][16 f16 scales of 2p + 1]
// (a missing last block of an odd count is zeros), so a pair takes the bytes of 16 rows x 2 blocks
// in the GGUF layout and stays 64-byte aligned. One block's quants, in 64-byte vectors:
//   Q8_0: vector g < 8 holds elements 4g..4g+3 of the 16 rows, row i at bytes 4i..4i+3, each
//         stored as w + 128 (unsigned, as vpdpbusd wants its first operand);
//   Q4_0: vector v < 4 holds elements 8v..8v+3 (low nibbles) and 8v+4..8v+7 (high nibbles) of the
//         16 rows, row i at bytes 4i..4i+3, each the stored nibble w + 8.
// A kernel takes sum((w + C) * x) - C * sum(x) with C = 128 or 8: the same integer as sum(w * x).
//
// K-quants (Q4_K, Q5_K, Q6_K) use the same panels of 16 rows, one 256-value super-block after
// another, each in the bytes of its 16 rows in the GGUF file (Q6_K: 32 more, for alignment).
// "Code vector" c < 64 of a super-block holds the unsigned codes of elements 4c..4c+3 of the 16
// rows, row i at bytes 4i..4i+3, so that vpdpbusd multiplies it with 4 activation bytes broadcast
// to every lane. A super-block of a panel, at byte offsets (KQuantPanelLayout):
//   codes    32 vectors of 64 bytes; vector u holds the low 4 bits of code vector 2u in its low
//            nibbles and those of code vector 2u + 1 in its high nibbles (Q4_K: the whole code);
//   bits     Q5_K: 8 vectors, vector s holds bit 4 of code vector 8s + k in bit k of each byte;
//            Q6_K: 16 vectors, vector g holds bits 4-5 of code vector 4g + k in bits 2k, 2k + 1;
//   d        16 fp16 super-block scales (row i at 2i);
//   dmin     Q4_K / Q5_K: 16 fp16 super-block mins;
//   scales   Q4_K / Q5_K: the 12 packed bytes of the 6-bit scales and mins (quant::
//            UnpackScalesMins) as 3 vectors, bytes 4k..4k+3 of row i at 64k + 4i;
//            Q6_K: 16 groups of 16 int8 scales, group g's of row i at 16g + i.
// Everything stays as compact as in the file; the kernels unpack codes and 6-bit scales in
// registers, once per tile for all of its tokens.
inline constexpr int64_t kPanelRows = 16;
inline int64_t PackedBlockQuantBytes(DType type) { return type == DType::kQ8_0 ? 512 : 256; }
inline int64_t PackedPairBytes(DType type) { return 2 * PackedBlockQuantBytes(type) + 64; }

struct KQuantPanelLayout {
  // Byte offsets inside a super-block (codes start at 0); 0 for a part the type does not have.
  int64_t bits, d, dmin, scales;
  int64_t super_bytes;  // bytes of one super-block of one panel
};
inline constexpr KQuantPanelLayout KQuantPanel(DType type) {
  if (type == DType::kQ4_K) return {0, 2048, 2080, 2112, 2304};
  if (type == DType::kQ5_K) return {2048, 2560, 2592, 2624, 2816};
  return {2048, 3328, 0, 3072, 3392};  // Q6_K: 3360 bytes of data, 32 of padding
}

inline int64_t PackedPanelBytes(DType type, int64_t cols) {
  if (IsKQuant(type)) return cols / 256 * KQuantPanel(type).super_bytes;
  return (cols / 32 + 1) / 2 * PackedPairBytes(type);
}
inline int64_t PackedPanels(int64_t rows) { return (rows + kPanelRows - 1) / kPanelRows; }

// Decode streams the packed weights from DRAM; the kernels prefetch each panel's stream 8 KiB
// (about 15 blocks of a Q8_0 panel, 3.5 super-blocks of a Q4_K one) ahead, enough to cover DRAM
// latency while the dot products of 8 tokens run (TinyLlama Q8_0, 1 thread: np8 decode 115 tok/s
// with 1 KiB, 167 with 4 KiB, 180-197 with 8 KiB, 156-174 with 16-32 KiB; np1 unchanged).
inline constexpr int64_t kPackedPrefetchBytes = 8192;
// Batched decode (2 to 8 tokens per weight) spends about as long on the dot products of a block as
// the memory takes to deliver it, and prefetching into L1 alone covers too little of the stream
// to overlap the two (L1 has few miss buffers): the stream is also prefetched into L2 far ahead,
// and into L1 nearer. Zen 4, 2 threads, TinyLlama ffn_gate/up from DRAM (`matmul_bench --cold`):
// M=8 335 -> 543 GOPS, M=4 284 -> 389; M=1 is left as it was (the L2 prefetch cost it ~10%).
inline constexpr int64_t kBatchedPrefetchL1Bytes = 4096;
inline constexpr int64_t kBatchedPrefetchL2Bytes = 32768;
// Whether one-token decode prefetches like batched decode (into L2 far ahead and L1 nearer)
// rather than into L1 alone, kPackedPrefetchBytes ahead. Which wins depends on the CPU: on Zen 4
// the L2 prefetch cost one-token decode ~10%; on a 2-vCPU Sapphire Rapids VM it gains it 10-15%
// (TinyLlama Q8_0 tg64, `kvl bench -t 2 -p 0 -n 64`, alternated: 19.3-20.0 -> 21.7-22.9 t/s,
// 26.8 GB/s of weights against `membw`'s 26.3; Qwen3-0.6B Q8_0 +5%). Chosen once per process by
// the CPU's vendor, for the Q8_0 / Q4_0 tiles: the K-quant ones keep L1 alone (on the same VM the
// change moved Q4_K_M tg64 both ways, TinyLlama -3%, Qwen3-0.6B +5%).
bool OneTokenPrefetchesIntoL2();
// Tokens per register tile of the AVX-512 Q8_0 / Q4_0 kernels beyond kDecodeNT (gemm_avx512.cc):
// StreamAhead spreads its lines over the blocks of tiles this wide.
inline constexpr int kPackedTileTokens = 6;

// Writes row i (< kPanelRows) of a panel from its GGUF row (pack.cc); the panel starts zeroed.
void PackPanelRow(DType type, const uint8_t* row, int64_t cols, int64_t i, uint8_t* panel);

// Covers units [u0, u1) (weight rows, or panels of rows) x tokens [t0, t1) with a kernel's tiles.
// Up to kWide tokens (decode of a few sequences, a verify step): kWideMR units at a time against
// all of them, wide(u, mr, n_tokens), each unit read once; one token, and the units left over,
// take one unit at a time (mr = 1), so one-row decode streams its weights in one sequential run
// per thread. Otherwise tiles of up
// to MR units x NR tokens, tile(u, t, mr, nr), units outer so a tile's weights stay in cache for
// every token. The tokens are cut into as few tiles as NR allows, of sizes that differ by at most
// one (BalancedTokenTile): a prefill task of 64 tokens is 11+11+11+11+10+10 for NR = 12, not
// 12 x 5 + 4, whose narrow tile decodes its weights for a third of the tokens (Qwen3-0.6B Q4_K_M
// pp512: the 4-token tile took 7.3% of the time for 6.25% of the work at 2.6x the cost per token).
// Kernels give every output the same operations whatever its tile.
struct TokenTile {
  int64_t start, count;
};
// Tile i (< ceil(n / max) of them) of n tokens cut into tiles of at most max, balanced: the first
// n % tiles get one token more than the rest.
inline TokenTile BalancedTokenTile(int64_t n, int64_t max, int64_t i) {
  const int64_t tiles = (n + max - 1) / max;
  const int64_t base = n / tiles, extra = n % tiles;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}
template <int64_t kWide, int64_t kWideMR, int64_t MR, int64_t NR, typename WideFn,
          typename TileFn>
inline void ForEachTile(int64_t u0, int64_t u1, int64_t t0, int64_t t1, WideFn&& wide,
                        TileFn&& tile) {
  const int64_t n = t1 - t0;
  if (n <= kWide) {
    const int64_t mr = n == 1 ? 1 : kWideMR;
    int64_t u = u0;
    for (; u + mr <= u1; u += mr) wide(u, mr, n);
    for (; u < u1; ++u) wide(u, int64_t{1}, n);
    return;
  }
  const int64_t tiles = (n + NR - 1) / NR;
  for (int64_t u = u0; u < u1; u += MR) {
    for (int64_t i = 0; i < tiles; ++i) {
      const TokenTile tt = BalancedTokenTile(n, NR, i);
      tile(u, t0 + tt.start, std::min(MR, u1 - u), tt.count);
    }
  }
}

// Bytes another task will stream next, pulled into L2 by a call whose arithmetic outlasts its
// own weights (MatMulGroup pairs such calls with a decode matrix's stream: ops/stream_pairs.h),
// lines_per_block lines per weight block it computes, spread over the block's 8 steps so the
// requests reach memory at an even pace. A hint only: no output depends on it.
struct StreamAhead {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t lines_per_block = 0;
  void IssueAt(int step) {  // step < 8 of a block
    const int64_t count = (lines_per_block * (step + 1)) / 8 - (lines_per_block * step) / 8;
    for (int64_t i = 0; i < count && next < end; ++i, next += 64) {
      __builtin_prefetch(next, /*rw=*/0, /*locality=*/2);  // prefetcht1: into L2, not L1
    }
  }
};

// One MatMul call as the tile kernels see it. Exactly one of x / acts is used, by weight type.
struct MatMulArgs {
  MatrixView w;
  const float* x = nullptr;      // [n_tokens][w.cols] f32 (F32/F16/BF16 weights)
  const uint8_t* acts = nullptr;  // [n_tokens][ActRowStride(w.cols)] (Q8_0/Q4_0 weights)
  int64_t act_stride = 0;
  float* y = nullptr;  // [n_tokens][w.rows]
  StreamAhead* stream_ahead = nullptr;  // see StreamAhead; null: nothing rides along
};

struct KernelTable {
  // Computes y[t][r] for r in [r0, r1), t in [t0, t1). Every y element gets the same sequence of
  // float operations whatever the range it is computed in (batch invariance; see ops.h).
  void (*matmul_tile)(const MatMulArgs& args, int64_t r0, int64_t r1, int64_t t0, int64_t t1);
  // The same for Q8_0 / Q4_0 / K-quant weights in the packed layout above (r0 a multiple of
  // kPanelRows). Null: this ISA has no packed kernel, and PackMatrix leaves weights as they are.
  // Each output is exactly what the scalar tile gives: for Q8_0 / Q4_0 every block's int32 dot,
  // converted to float, times (weight scale * activation scale), added in block order to an
  // accumulator starting at 0; for K-quants the operations of kquant_kernels_scalar.cc.
  void (*matmul_packed_tile)(const MatMulArgs& args, int64_t r0, int64_t r1, int64_t t0,
                             int64_t t1) = nullptr;
  // Quantizes one row of cols floats (cols % 32 == 0) into the activation layout above. Must give
  // the same bytes on every ISA.
  void (*quantize_acts)(const float* x, int64_t cols, uint8_t* out);
  void (*rms_norm)(const float* x, const float* weight, int64_t n, float eps, float* out);
  void (*rope)(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
               bool neox);
  void (*softmax)(float* x, int64_t n);
  void (*swiglu)(float* gate, const float* up, int64_t n);
  void (*add)(float* y, const float* x, int64_t n);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float alpha, const float* x, float* y, int64_t n);
  // y += sum_i weights[i] * rows[i * stride] for i in [0, count), rows taken in order; each y
  // element sees exactly the operations `count` calls of axpy would apply (so how a run of rows is
  // split into calls never changes the result). Null: ops.cc loops over axpy.
  void (*axpy_rows)(const float* weights, const float* rows, int64_t stride, int64_t count,
                    int64_t n, float* y) = nullptr;
  // out[i] = dot(q, rows[i * stride]) * scale, exactly as dot would give. Null: ops.cc loops.
  void (*dot_rows)(const float* q, const float* rows, int64_t stride, int64_t count, int64_t n,
                   float scale, float* out) = nullptr;
  // Attention over f16 / bf16 rows (ops.h, DotRowsHalf / AxpyRowsHalf): exactly dot_rows /
  // axpy_rows (or their loops) over the rows widened to f32. Required in every table, with no
  // scalar fallback: the exactness promise is per ISA. type is already checked to be F16 or BF16.
  void (*dot_rows_half)(DType type, const float* q, const uint16_t* rows, int64_t stride,
                        int64_t count, int64_t n, float scale, float* out) = nullptr;
  void (*axpy_rows_half)(DType type, const float* weights, const uint16_t* rows, int64_t stride,
                         int64_t count, int64_t n, float* y) = nullptr;
  // f32 <-> f16 / bf16 rows (ops.h, NarrowRow / WidenRow). narrow_row must give the bytes of
  // quant::Fp32ToFp16 / Fp32ToBf16 on every ISA.
  void (*narrow_row)(DType type, const float* x, int64_t n, uint16_t* out) = nullptr;
  void (*widen_row)(DType type, const uint16_t* x, int64_t n, float* out) = nullptr;
  // Columns [col, col + n) of a q8_0 / q4_0 row as f32 (ops.h, DequantizeCols): the values of
  // quant::DequantizeRow on every ISA. type already checked. Required in every table.
  void (*dequantize_cols)(DType type, const uint8_t* row, int64_t col, int64_t n,
                          float* out) = nullptr;
  // Attention over compressed KV pages (ops.h, DotRowsK* / AxpyRowsV*); arguments already
  // validated by ops.cc. Null: ops.cc uses the scalar table's entry.
  void (*dot_rows_k_int8)(const float* q, const QuantKvLayerView& page, int64_t first_row,
                          int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                          float* out) = nullptr;
  void (*dot_rows_k_int4)(const float* q, const QuantKvLayerView& page, int64_t first_row,
                          int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                          float* out) = nullptr;
  void (*axpy_rows_v_int8)(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                           int64_t count, int64_t head_offset, int64_t head_dim,
                           float* y) = nullptr;
  void (*axpy_rows_v_int4)(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                           int64_t count, int64_t head_offset, int64_t head_dim,
                           float* y) = nullptr;
  // Tiled online-softmax attention (ops.h, PackAttentionKeys / AttentionTile); arguments already
  // validated by ops.cc. Required in every table: each row's arithmetic must not depend on the
  // rows beside it, which each table guarantees for itself.
  void (*pack_attention_keys)(DType type, const void* rows, int64_t stride, int64_t count,
                              int64_t head_dim, float* kt, int64_t width, int64_t col) = nullptr;
  void (*attention_tile)(const float* kt, int64_t width, const float* const* v, int64_t count,
                         int64_t head_dim, float scale, const AttentionRows& rows) = nullptr;
  // The Walsh-Hadamard rotation of `rows` rows of n floats in place, times scale (ops.h,
  // HadamardRotate; n a power of two, checked by ops.cc). Required in every table: the bits must
  // be the scalar kernel's (rotation_kernels_scalar.cc), so rows rotated on any ISA match.
  void (*hadamard_rows)(float* x, int64_t rows, int64_t n, float scale) = nullptr;
};

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

// Scalar pieces the SIMD tables reuse where a vector version would not pay (or must match bytes).
void ScalarQuantizeActs(const float* x, int64_t cols, uint8_t* out);
void ScalarRope(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
                bool neox);

// The scalar dequantize_cols (kv_kernels_scalar.cc), and the walk over a row's blocks that the
// SIMD tables share: whole blocks inside [col, col + n) go to `block` (32 values to out), the
// partial ones at the edges to the scalar reference.
void ScalarDequantizeCols(DType type, const uint8_t* row, int64_t col, int64_t n, float* out);
using DequantizeBlockFn = void (*)(DType type, const uint8_t* block, float* out);
void DequantizeColsBy(DequantizeBlockFn block, DType type, const uint8_t* row, int64_t col,
                      int64_t n, float* out);

// The packed int8 GEMM (gemm_avx512.cc): KernelTable::matmul_packed_tile for kAvx512. K-quant
// weights go on to gemm_kquant_avx512.cc.
void Avx512MatMulPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);
void Avx512KQuantPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);

// Compressed-KV attention kernels (kv_kernels_scalar.cc, kv_kernels_avx512.cc); arguments are
// validated by ops.cc before any of these runs.
void ScalarDotRowsKInt8(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out);
void ScalarDotRowsKInt4(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out);
void ScalarAxpyRowsVInt8(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y);
void ScalarAxpyRowsVInt4(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y);
void Avx512DotRowsKInt8(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out);
void Avx512DotRowsKInt4(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out);
void Avx512AxpyRowsVInt8(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y);
void Avx512AxpyRowsVInt4(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y);

// One row of a compressed page decoded to f32 (ops.h, DequantizeQuantKvRow); no SIMD version.
void ScalarDequantizeQuantKvRow(const QuantKvLayerView& page, int64_t row, int64_t head_offset,
                                int64_t head_dim, float* k_out, float* v_out);

// Tiled attention kernels (attention_kernels_<isa>.cc). The AVX2 table packs keys with the scalar
// kernel (an exact widening either way).
void ScalarPackAttentionKeys(DType type, const void* rows, int64_t stride, int64_t count,
                             int64_t head_dim, float* kt, int64_t width, int64_t col);
void ScalarAttentionTile(const float* kt, int64_t width, const float* const* v, int64_t count,
                         int64_t head_dim, float scale, const AttentionRows& rows);
void Avx2AttentionTile(const float* kt, int64_t width, const float* const* v, int64_t count,
                       int64_t head_dim, float scale, const AttentionRows& rows);
void Avx512PackAttentionKeys(DType type, const void* rows, int64_t stride, int64_t count,
                             int64_t head_dim, float* kt, int64_t width, int64_t col);
void Avx512AttentionTile(const float* kt, int64_t width, const float* const* v, int64_t count,
                         int64_t head_dim, float scale, const AttentionRows& rows);

// The Walsh-Hadamard rotation kernels (rotation_kernels_<isa>.cc).
void ScalarHadamardRows(float* x, int64_t rows, int64_t n, float scale);
void Avx2HadamardRows(float* x, int64_t rows, int64_t n, float scale);
void Avx512HadamardRows(float* x, int64_t rows, int64_t n, float scale);

}  // namespace kvl::ops
