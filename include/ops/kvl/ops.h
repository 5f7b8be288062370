// Numeric kernels: matmul over weights in their stored format, norms, RoPE, softmax, activations,
// and the dot/axpy primitives attention is built from. This is the only layer with SIMD code: each
// ISA path lives in its own file compiled with its own flags, and the path is chosen at run time
// from what the CPU reports (never from how the binary was built).
//
// Batch invariance (an invariant the KV hierarchy relies on): every output element of MatMul is
// computed by the same sequence of floating-point operations whatever the number of tokens, the
// tiling and the thread count. So a token's projections are bit-identical whether it was computed
// in a 512-token prefill, alone in decode, or again later in a recompute.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/status.h"
#include "kvl/thread_pool.h"

namespace kvl::ops {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view IsaName(Isa isa);
// What kvl prints as its kernels: IsaName, with "+amx" where the AVX-512 table's packed GEMM uses
// the AMX tiles (src/ops/amx.h). Profiles stay keyed on IsaName (KVL_AMX=0 on the same machine
// shares them; the engine's measured corrections follow the step's cost either way).
std::string KernelsName(Isa isa);
// The best path this CPU can run among those compiled in.
Isa BestIsa();
// Every path compiled in that this CPU can run (tests check each against kScalar): those whose
// required CPU features (one list per ISA, src/ops/isa_features.h) the CPU all has.
std::vector<Isa> RunnableIsas();
// OK when this CPU can run isa; otherwise UNIMPLEMENTED naming the features it lacks. OpsContext
// refuses (KVL_CHECK) an isa that fails this.
Status CheckIsaRunnable(Isa isa);
// Human-readable CPU feature summary, e.g. "AVX512F AVX512BW AVX512VNNI AVX512BF16 AVX2 FMA F16C".
std::string CpuFeatureString();

// MatrixView (a weight matrix in its stored format) is declared in kvl/dtype.h.
using ::kvl::MatrixView;

struct KernelTable;  // per-ISA function pointers (internal)

// What the kernels need besides their operands: the chosen ISA, the thread pool and scratch for
// quantized activations. Sized once (Reserve) so the per-token path never allocates.
// Thread-safety: one OpsContext per step loop; not shared between concurrent callers.
class OpsContext {
 public:
  OpsContext(Isa isa, ThreadPool* pool);
  ~OpsContext();
  OpsContext(const OpsContext&) = delete;
  OpsContext& operator=(const OpsContext&) = delete;

  // Room for activations of up to max_tokens rows of up to max_cols columns.
  void Reserve(int64_t max_tokens, int64_t max_cols);

  Isa isa() const { return isa_; }
  ThreadPool* pool() const { return pool_; }
  const KernelTable& kernels() const { return *kernels_; }
  uint8_t* scratch() { return scratch_.data(); }
  size_t scratch_bytes() const { return scratch_.size(); }

 private:
  Isa isa_;
  ThreadPool* pool_;
  const KernelTable* kernels_;
  std::vector<uint8_t> scratch_;
};

// y[t][r] = sum_k W[r][k] * x[t][k] for t < n_tokens, r < w.rows.
// x: [n_tokens][w.cols] contiguous; y: [n_tokens][w.rows] contiguous.
// F32/F16/BF16 weights multiply f32 activations; Q8_0/Q4_0 weights multiply activations quantized
// to 8 bits per 32-element block (as llama.cpp does), using VNNI where present; so do the K-quant
// weights Q4_K, Q5_K and Q6_K (cols a multiple of 256, at most 32768).
// Multithreaded over rows and tokens, never over the reduction dimension.
// w may be packed (PackMatrix) for ctx's ISA.
void MatMul(OpsContext& ctx, const MatrixView& w, const float* x, int64_t n_tokens, float* y);

// A weight matrix repacked once, at model load, into the layout the ISA's int8 GEMM streams best
// (Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K on AVX-512 VNNI: panels of 16 rows, 4 bytes per row per vector,
// see src/ops/kernel_table.h). The packed copy takes the bytes of the original (for a row count
// that is a multiple of 16 and, for Q8_0 / Q4_0, an even block count; otherwise up to 15 zero rows
// and one zero block per panel more; Q6_K: 32 bytes more per 16 rows x 256 values, 1%), and the
// original is no longer read, so its mmapped pages can be dropped.
// view() is what MatMul takes; it may only be used with an OpsContext of the ISA it was packed for.
// Where the ISA has no packed kernel for the type, view() is the original matrix and nothing is
// owned. Movable, not copyable (the copy would cost the matrix's bytes).
class PackedMatrix {
 public:
  PackedMatrix() = default;
  const MatrixView& view() const { return view_; }
  // Bytes owned (0 when view() is the original).
  size_t bytes() const { return bytes_; }

 private:
  friend PackedMatrix PackMatrix(Isa isa, const MatrixView& w, ThreadPool* pool);
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], Free> storage_;
  size_t bytes_ = 0;
  MatrixView view_;
};

// Whether PackMatrix repacks a matrix of this type for isa.
bool PacksMatrix(Isa isa, DType type);
// w (layout kRows) repacked for isa's kernels; see PackedMatrix. With the batch-invariant kernels
// the packed matrix gives bit-identical results to the scalar path on the original. Panels are
// packed in parallel on pool when given.
PackedMatrix PackMatrix(Isa isa, const MatrixView& w, ThreadPool* pool = nullptr);

// Several matrices with the same input (Q/K/V, or gate/up) in one parallel region: the input is
// quantized once and one loop covers every matrix's rows, saving a thread-pool round trip and a
// quantization per extra matrix in decode. Each ys[m] gets exactly what MatMul would give.
// All matrices must have the same cols; their formats may differ.
inline constexpr size_t kMaxGroup = 4;
void MatMulGroup(OpsContext& ctx, std::span<const MatrixView> ws, const float* x, int64_t n_tokens,
                 std::span<float* const> ys);
// The same, each matrix over its own first n_tokens[m] rows of x (a step's Q for its tokens beside
// K and V for those and for the rows of the pages it rebuilds); x is quantized once, for the most
// rows. A matrix given 0 rows is skipped.
void MatMulGroup(OpsContext& ctx, std::span<const MatrixView> ws, const float* x,
                 std::span<const int64_t> n_tokens, std::span<float* const> ys);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]. out may alias x.
void RmsNorm(const OpsContext& ctx, const float* x, const float* weight, int64_t n, float eps,
             float* out);

// Rotates n_heads heads of head_dim each, in place, by the angles whose cos/sin are given for
// i < head_dim/2. Normal ordering rotates pairs (x[2i], x[2i+1]); neox rotates (x[i], x[i+d/2]).
void Rope(const OpsContext& ctx, float* x, int64_t n_heads, int64_t head_dim, const float* cos,
          const float* sin, bool neox);

// In place: x = exp(x - max) / sum over n elements.
void Softmax(const OpsContext& ctx, float* x, int64_t n);

// How far a row of logits is from a reference row (n values each), for the quality of lossy KV:
// KL(reference || other) of their softmax distributions in nats (computed in double), and
// whether both put their largest logit on the same token. Scalar; not for the per-token step.
struct LogitsDivergence {
  double kld = 0;
  bool same_top1 = false;
};
LogitsDivergence CompareLogits(const float* reference, const float* other, int64_t n);

// gate[i] = silu(gate[i]) * up[i].
void SwiGlu(const OpsContext& ctx, float* gate, const float* up, int64_t n);

// gate[i] = gelu(gate[i]) * up[i], gelu the tanh approximation exactly as ggml computes it on the
// CPU (its GGML_GELU_FP16 path): 0 at or below -10, x at or above 10, and otherwise the f16 table
// entry of gelu(f16(x)) (0.5 x (1 + tanhf(sqrt(2/pi) x (1 + 0.044715 x^2))), rounded to f16).
// One implementation for every ISA: a table lookup per element.
void GeGlu(const OpsContext& ctx, float* gate, const float* up, int64_t n);

// The tanh GELU of one value as GeGlu computes it (tests and reference code).
float GeluTanhF16(float x);

// x[i] = cap * tanhf(x[i] * (1 / cap)): Gemma's soft-capping of logits (final or attention), in
// llama.cpp's order of operations (scale by 1/cap, tanh, scale by cap). cap > 0.
void SoftCap(float* x, int64_t n, float cap);

// y[i] += x[i].
void Add(const OpsContext& ctx, float* y, const float* x, int64_t n);

// sum_i a[i] * b[i].
float Dot(const OpsContext& ctx, const float* a, const float* b, int64_t n);

// y[i] += alpha * x[i].
void Axpy(const OpsContext& ctx, float alpha, const float* x, float* y, int64_t n);

// Attention over a run of cached rows (row i at rows + i * stride):
//   DotRows:  out[i] = Dot(q, row i) * scale
//   AxpyRows: y += weights[i] * row i, for i in order.
// Both give exactly what the equivalent loops of Dot / Axpy give, so splitting a sequence's rows
// into runs differently (contiguous vs paged storage) never changes a result.
void DotRows(const OpsContext& ctx, const float* q, const float* rows, int64_t stride,
             int64_t count, int64_t n, float scale, float* out);
void AxpyRows(const OpsContext& ctx, const float* weights, const float* rows, int64_t stride,
              int64_t count, int64_t n, float* y);

// Attention over cached rows stored as f16 or bf16 (the `-ctk f16|bf16` KV cache types; row i at
// rows + i * stride, stride in elements): exactly what DotRows / AxpyRows on the same ISA give over
// the rows widened to f32, so a cache of half rows follows the same summation order as the f32
// cache. The rows are widened in registers, never copied. type is DType::kF16 or DType::kBF16.
void DotRowsHalf(const OpsContext& ctx, DType type, const float* q, const uint16_t* rows,
                 int64_t stride, int64_t count, int64_t n, float scale, float* out);
void AxpyRowsHalf(const OpsContext& ctx, DType type, const float* weights, const uint16_t* rows,
                  int64_t stride, int64_t count, int64_t n, float* y);
// Narrows n floats to f16 or bf16, round to nearest even (NaN stays NaN, made quiet; overflow goes
// to inf for f16; subnormals are kept, never flushed); the same bits on every ISA, namely
// quant::Fp32ToFp16 / quant::Fp32ToBf16.
void NarrowRow(const OpsContext& ctx, DType type, const float* x, int64_t n, uint16_t* out);
// Widens n f16 / bf16 values to f32 (exact; a signaling f16 NaN may come back quiet on the SIMD
// paths, as the hardware conversion makes it).
void WidenRow(const OpsContext& ctx, DType type, const uint16_t* x, int64_t n, float* out);

// The orthonormal Walsh-Hadamard rotation, in place, of each of `rows` rows of n floats (n a
// power of two): x <- H x / sqrt(n), H the Sylvester-ordered Hadamard matrix (H[i][j] =
// (-1)^popcount(i & j)). H / sqrt(n) is symmetric and orthonormal, hence its own inverse: a row
// rotated twice comes back up to rounding, and q.k of two rotated rows is q.k of the originals up
// to rounding. The rotated KV cache types (q8_0r, q4_0r) hold K and V rotated per head: a head's
// outlier channels are spread over all of its channels before one scale per 32 values is fitted.
// The same bits on every ISA.
void HadamardRotate(const OpsContext& ctx, float* x, int64_t rows, int64_t n);
// Whether HadamardRotate takes rows of n floats: n a power of two.
inline constexpr bool IsHadamardSize(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// The widest head the quantized-KV kernels take (DotRowsQuant, DotRowsK*, ...).
inline constexpr int64_t kMaxQuantHeadDim = 256;

// Attention over cached rows stored as q8_0 / q4_0 (the `-ctk q8_0|q4_0` KV cache types, written a
// row at a time as tokens arrive): row i starts at rows + i * row_bytes and holds blocks of 32
// values with one fp16 scale each, byte for byte ggml's (kvl/quant.h); columns [col, col + n) of
// each row are read (a head's channels; col need not be a block boundary). Exactly what DotRows /
// AxpyRows on the same ISA give over those columns dequantized to f32 (the values of
// quant::DequantizeRow), so the summation order is that of the f32 cache and a sequence's rows
// give the same result however they are split into runs. The rows are dequantized a few at a
// time into registers or a small stack buffer, never into a copy of the run.
// type is DType::kQ8_0 or DType::kQ4_0; n <= kMaxQuantHeadDim.
void DotRowsQuant(const OpsContext& ctx, DType type, const float* q, const uint8_t* rows,
                  int64_t row_bytes, int64_t col, int64_t count, int64_t n, float scale,
                  float* out);
void AxpyRowsQuant(const OpsContext& ctx, DType type, const float* weights, const uint8_t* rows,
                   int64_t row_bytes, int64_t col, int64_t count, int64_t n, float* y);
// Columns [col, col + n) of one q8_0 / q4_0 row as f32: the values quant::DequantizeRow gives, on
// every ISA (the kernel DotRowsQuant / AxpyRowsQuant read rows through).
void DequantizeCols(const OpsContext& ctx, DType type, const uint8_t* row, int64_t col, int64_t n,
                    float* out);

// One layer of one compressed KV page ("KIVI" layout, built by kvl/kv_codec.h, which owns the
// format; the kernels below only read it). rows = the page's block_tokens, kv_dim = n_kv_heads *
// head_dim; row_bytes = kv_dim (int8) or kv_dim / 2 (int4, two codes per byte: channel 2j in the
// low nibble, 2j + 1 in the high one).
//   Keys, quantized per channel over the page's tokens:
//     int8: K[t][c] = k_scale[c] * (int8)k_q[t][c]
//     int4: K[t][c] = k_scale[c] * nibble(k_q[t], c) + k_min[c]
//   Values, quantized per token in groups of v_group channels (g = c / v_group):
//     int8: V[t][c] = v_scale[t][g] * (int8)v_q[t][c]
//     int4: V[t][c] = v_scale[t][g] * nibble(v_q[t], c) + v_min[t][g]
struct QuantKvLayerView {
  int32_t bits = 8;  // 8 or 4
  int64_t rows = 0;  // tokens in the page
  int64_t kv_dim = 0;
  int64_t row_bytes = 0;           // bytes per token row of k_q and v_q
  const uint8_t* k_q = nullptr;    // [rows][row_bytes]
  const float* k_scale = nullptr;  // [kv_dim]
  const float* k_min = nullptr;    // [kv_dim] (int4 only)
  const uint8_t* v_q = nullptr;    // [rows][row_bytes]
  int64_t v_group = 32;            // channels per value group: 32, or kv_dim when kv_dim % 32 != 0
  int64_t v_groups = 0;            // groups per row: kv_dim / v_group
  const float* v_scale = nullptr;  // [rows][v_groups]
  const float* v_min = nullptr;    // [rows][v_groups] (int4 only)
};

// Attention straight from a compressed page (no decoded copy): the same sums as DotRows /
// AxpyRows over the decoded rows [first_row, first_row + count) restricted to the head's channels
// [head_offset, head_offset + head_dim), up to float rounding (the summation order differs, and
// the ISA paths differ from each other by rounding only). head_dim <= kMaxQuantHeadDim.
//   DotRowsK*:  out[i] = scale * sum_c q[c] * K[first_row + i][head_offset + c]
//   AxpyRowsV*: y[c] += sum_i weights[i] * V[first_row + i][head_offset + c]
// The Int8 / Int4 entry points require page.bits to match; DotRowsK / AxpyRowsV pick by page.bits.
void DotRowsKInt8(const OpsContext& ctx, const float* q, const QuantKvLayerView& page,
                  int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                  float scale, float* out);
void DotRowsKInt4(const OpsContext& ctx, const float* q, const QuantKvLayerView& page,
                  int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                  float scale, float* out);
void DotRowsK(const OpsContext& ctx, const float* q, const QuantKvLayerView& page,
              int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim, float scale,
              float* out);
void AxpyRowsVInt8(const OpsContext& ctx, const float* weights, const QuantKvLayerView& page,
                   int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                   float* y);
void AxpyRowsVInt4(const OpsContext& ctx, const float* weights, const QuantKvLayerView& page,
                   int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                   float* y);
void AxpyRowsV(const OpsContext& ctx, const float* weights, const QuantKvLayerView& page,
               int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim, float* y);

// Columns [head_offset, head_offset + head_dim) of row `row` of a compressed page layer, decoded
// to f32 by the formulas above (K to k_out, V to v_out; either may be null). Plain code, the same
// values on every ISA; the tiled attention reads compressed pages through it.
void DequantizeQuantKvRow(const QuantKvLayerView& page, int64_t row, int64_t head_offset,
                          int64_t head_dim, float* k_out, float* v_out);

// ---------------------------------------------------------------------------------------------
// Tiled online-softmax attention (flash attention on the CPU). A query row visits the keys it
// sees once, in tiles of consecutive positions, keeping a running max m, a running sum l and an
// unnormalized output acc[head_dim]; each tile of `count` keys updates them as
//   s_j     = scale * (q . K_j)            (one multiply-add chain over the channels, in order)
//   m'      = max(m, max_j s_j),  a = exp(m - m')  (a = 0 while m is -inf: nothing seen yet)
//   p_j     = exp(s_j - m')
//   l'      = l * a + sum_j p_j
//   acc'[c] = acc[c] * a + sum_j p_j * V_j[c]      (j in order, one multiply-add each)
// and the attention output is acc / l after the last tile. No score row of the context's length
// exists. Several query rows share a call (the heads of a GQA group, several positions of a
// prompt), so a tile's keys and values are loaded once for all of them.
//
// Batch invariance: a row's results depend only on its own q and state and on the tile's first
// `count` keys and values: never on the other rows of the call, their number, the tile's width,
// the thread or the ISA's register blocking. A caller that fixes tiles by position (not by how the
// cache hands out runs of rows) therefore gets bit-identical rows alone or batched, in prefill or
// decode, from paged or contiguous storage. Across ISAs results agree up to float rounding (the
// scalar path computes exp with std::exp and does not fuse multiply-adds).

inline constexpr int64_t kMaxAttentionHeadDim = 256;
inline constexpr int64_t kMaxAttentionTileTokens = 64;
// Floats of a packed key tile: width * head_dim for every tile AttentionTileTokens allows.
inline constexpr int64_t kAttentionTileFloats = 4096;

// Keys per tile for a head size: the most, a multiple of 16 and at most
// kMaxAttentionTileTokens, whose packed keys fit kAttentionTileFloats floats (64 for head_dim
// <= 64, 32 for 128, 16 for 256), so a tile's keys and values stay in L1 while every query row
// of a call uses them. head_dim in [1, kMaxAttentionHeadDim].
int64_t AttentionTileTokens(int64_t head_dim);

// Writes `count` key rows (row i at rows + i * stride elements, of type f32, f16 or bf16, head_dim
// channels each) into columns [col, col + count) of a packed key tile: kt[c * width + col + i] =
// K_i[c], widened exactly. width is a multiple of 16, at most kMaxAttentionTileTokens, and
// width * head_dim <= kAttentionTileFloats; col + count <= width. Columns outside [col, col +
// count) are left as they are (the tile is packed run by run of the cache's rows).
void PackAttentionKeys(const OpsContext& ctx, DType type, const void* rows, int64_t stride,
                       int64_t count, int64_t head_dim, float* kt, int64_t width, int64_t col);

// The query rows of one AttentionTile call and their running state.
struct AttentionRows {
  int64_t num_rows = 0;
  const float* const* q = nullptr;  // [num_rows] -> [head_dim]
  float* m = nullptr;               // [num_rows] running max, -inf before the first tile
  float* l = nullptr;               // [num_rows] running sum, 0 before the first tile
  float* const* acc = nullptr;      // [num_rows] -> [head_dim] output so far, 0 before the first
  // Null, or [num_rows] pointers, each null or where the row's scaled scores s_j (count floats)
  // are written: the attention-mass tracking reads them back.
  float* const* scores = nullptr;
  // > 0: each scaled score s_j becomes softcap * tanhf(s_j * (1 / softcap)) before the softmax
  // (Gemma-2's attention soft-capping; the scores written above are the capped ones). Such tiles
  // run the scalar kernel on every ISA.
  float softcap = 0.0f;
};

// One tile for every row of `rows`: keys packed by PackAttentionKeys (kt, width), values v[j] ->
// head_dim f32 for j < count, 1 <= count <= width. kt 64-byte aligned.
void AttentionTile(const OpsContext& ctx, const float* kt, int64_t width, const float* const* v,
                   int64_t count, int64_t head_dim, float scale, const AttentionRows& rows);

// Asks the memory system for `count` byte ranges [base + i * stride, + bytes) ahead of their
// use; a hint that changes no result. The attention gathers its next K/V tile's rows this way:
// they lie in paged blocks whose order the hardware prefetchers cannot guess.
void PrefetchRows(const void* base, int64_t stride, int64_t count, int64_t bytes);

// Row of a matrix in any supported type, widened to f32 (token embedding lookup).
void DequantizeRow(DType type, const void* row, int64_t n, float* out);

}  // namespace kvl::ops
