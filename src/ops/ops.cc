// Validation and run-time dispatch for every op: the one place that knows which ISA tables exist.
#include "kvl/ops.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "kvl/quant.h"
#include "kvl/status.h"
#include "isa_features.h"
#include "amx.h"
#include "kernel_table.h"
#include "kquant_kernels.h"
#include "stream_pairs.h"

namespace kvl::ops {
namespace {

const KernelTable& TableFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return Avx512Kernels();
    case Isa::kAvx2:
      return Avx2Kernels();
    default:
      return ScalarKernels();
  }
}

// Weights that multiply int8 activations (KernelTable::quantize_acts), K-quants included.
bool IsQuantized(DType type) {
  return type == DType::kQ8_0 || type == DType::kQ4_0 || IsKQuant(type);
}

// Token tile and row chunk of one MatMul task. Prefill uses tiles whose weights (64 rows) and
// activations (64 tokens) both fit in L2 beside each other. Decode streams weights from DRAM, where
// long sequential runs matter more than fine balance: each thread gets two long runs of rows
// (measured on SmolLM-135M Q8_0 decode: 95 tok/s with 32-row chunks, 110 with two runs per thread).
// Packed weights are tiled by panels of 16 rows (kPanelRows), two at a time in prefill.
constexpr int64_t kTokenTile = 64;
int64_t RowChunk(int64_t n_tokens, int64_t rows, int num_threads, bool packed) {
  if (n_tokens >= 16) return 64;
  const int64_t parts = 2 * static_cast<int64_t>(num_threads);
  const int64_t tile = packed ? kPanelRows : 4;
  const int64_t chunk = ((rows + parts - 1) / parts + tile - 1) / tile * tile;
  return std::max<int64_t>(16, chunk);
}

// The per-block sums of a quantized activation row (kernel_table.h); plain code, the same
// integers on every ISA. With kquant, also what the packed K-quant kernels read: dx * float(sum)
// over each 32-value block (the value KQuantActSums gives) and -32 * (sum) over each 16 values.
void StoreActSums(int64_t cols, bool kquant, uint8_t* row) {
  const auto* q = reinterpret_cast<const int8_t*>(row);
  const auto* dx = reinterpret_cast<const float*>(row + ActScalesOffset(cols));
  auto* sums = reinterpret_cast<int32_t*>(row + ActSumsOffset(cols));
  auto* sums32 = reinterpret_cast<float*>(row + ActKQuantSums32Offset(cols));
  auto* q6_offsets = reinterpret_cast<int32_t*>(row + ActQ6OffsetsOffset(cols));
  for (int64_t b = 0; b < cols / 32; ++b) {
    int32_t half[2] = {0, 0};
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 16; ++j) half[h] += q[b * 32 + 16 * h + j];
    }
    sums[b] = half[0] + half[1];
    if (kquant) {
      sums32[b] = dx[b] * static_cast<float>(sums[b]);
      q6_offsets[2 * b] = -32 * half[0];
      q6_offsets[2 * b + 1] = -32 * half[1];
    }
  }
}

}  // namespace

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "scalar";
  }
}

std::string KernelsName(Isa isa) {
  std::string name(IsaName(isa));
  if (isa == Isa::kAvx512 && AmxEnabled()) name += "+amx";
  return name;
}

std::string_view CpuFeatureName(CpuFeature feature) {
  // In CpuFeature order.
  static constexpr std::string_view kNames[] = {
      "AVX512F",    "AVX512BW",   "AVX512VL",   "AVX512DQ", "AVX512CD", "AVX512VNNI",
      "AVX512BF16", "AVX512VBMI", "AVX512IFMA", "AVX2",     "FMA",      "F16C",
      "AMX-TILE",   "AMX-INT8"};
  static_assert(std::size(kNames) == static_cast<size_t>(CpuFeature::kCount));
  const auto i = static_cast<size_t>(feature);
  return i < std::size(kNames) ? kNames[i] : "?";
}

CpuFeatureSet DetectCpuFeatures() {
  // __builtin_cpu_supports takes only a string literal, hence one line per feature.
  CpuFeatureSet s;
  auto add = [&s](bool has, CpuFeature f) {
    if (has) s.Add(f);
  };
  add(__builtin_cpu_supports("avx512f"), CpuFeature::kAvx512f);
  add(__builtin_cpu_supports("avx512bw"), CpuFeature::kAvx512bw);
  add(__builtin_cpu_supports("avx512vl"), CpuFeature::kAvx512vl);
  add(__builtin_cpu_supports("avx512dq"), CpuFeature::kAvx512dq);
  add(__builtin_cpu_supports("avx512cd"), CpuFeature::kAvx512cd);
  add(__builtin_cpu_supports("avx512vnni"), CpuFeature::kAvx512vnni);
  add(__builtin_cpu_supports("avx512bf16"), CpuFeature::kAvx512bf16);
  add(__builtin_cpu_supports("avx512vbmi"), CpuFeature::kAvx512vbmi);
  add(__builtin_cpu_supports("avx512ifma"), CpuFeature::kAvx512ifma);
  add(__builtin_cpu_supports("avx2"), CpuFeature::kAvx2);
  add(__builtin_cpu_supports("fma"), CpuFeature::kFma);
  add(__builtin_cpu_supports("f16c"), CpuFeature::kF16c);
  add(__builtin_cpu_supports("amx-tile"), CpuFeature::kAmxTile);
  add(__builtin_cpu_supports("amx-int8"), CpuFeature::kAmxInt8);
  return s;
}

bool OneTokenPrefetchesIntoL2() {
  static const bool far = __builtin_cpu_is("intel");
  return far;
}

std::vector<Isa> RunnableIsas(CpuFeatureSet present) {
  std::vector<Isa> isas;
  for (Isa isa : kAllIsas) {
    if (present.Contains(RequiredCpuFeatures(isa))) isas.push_back(isa);
  }
  return isas;
}

std::vector<Isa> RunnableIsas() { return RunnableIsas(DetectCpuFeatures()); }

Status CheckIsaRunnable(Isa isa, CpuFeatureSet present) {
  const CpuFeatureSet missing = RequiredCpuFeatures(isa).Without(present);
  if (missing.empty()) return Status::Ok();
  return UnimplementedError("ISA " + std::string(IsaName(isa)) +
                            " needs CPU features this CPU lacks: " + CpuFeatureNames(missing));
}

Status CheckIsaRunnable(Isa isa) { return CheckIsaRunnable(isa, DetectCpuFeatures()); }

Isa BestIsa() {
  Isa best = RunnableIsas().back();
  // KVL_ISA may only lower the choice (benchmarks, debugging), never pick a path the CPU lacks.
  if (const char* forced = std::getenv("KVL_ISA")) {
    const std::string name(forced);
    Isa want = best;
    if (name == "scalar") want = Isa::kScalar;
    if (name == "avx2") want = Isa::kAvx2;
    if (name == "avx512") want = Isa::kAvx512;
    if (static_cast<int>(want) < static_cast<int>(best)) best = want;
  }
  return best;
}

std::string CpuFeatureNames(CpuFeatureSet features) {
  std::string out;
  for (int i = 0; i < static_cast<int>(CpuFeature::kCount); ++i) {
    const auto f = static_cast<CpuFeature>(i);
    if (!features.Has(f)) continue;
    if (!out.empty()) out += ' ';
    out += CpuFeatureName(f);
  }
  return out;
}

std::string CpuFeatureString() { return CpuFeatureNames(DetectCpuFeatures()); }

OpsContext::OpsContext(Isa isa, ThreadPool* pool) : isa_(isa), pool_(pool), kernels_(&TableFor(isa)) {
  // Callers pick isa from RunnableIsas() (the engine answers a bad --isa with a Status before
  // this), so a table this CPU cannot run is a programmer error: refuse it here rather than die
  // later on an illegal instruction.
  const Status runnable = CheckIsaRunnable(isa);
  KVL_CHECK_MSG(runnable.ok(), runnable.message().c_str());
  KVL_CHECK(pool != nullptr);
}
OpsContext::~OpsContext() = default;

void OpsContext::Reserve(int64_t max_tokens, int64_t max_cols) {
  KVL_CHECK(max_tokens >= 0 && max_cols >= 0);
  // +64 so the quantized rows can start on a cache line whatever vector::data() returns.
  const size_t bytes = static_cast<size_t>(max_tokens * ActRowStride(max_cols) + 64);
  if (bytes > scratch_.size()) scratch_.resize(bytes);
}

bool PacksMatrix(Isa isa, DType type) {
  return IsQuantized(type) && TableFor(isa).matmul_packed_tile != nullptr;
}

// Memory for packed weights, which decode streams from DRAM at every step: 2 MiB-aligned and
// advised to be backed by transparent huge pages where the matrix spans whole ones (Linux with
// THP in madvise mode, the Debian default). On 4 KiB pages the hardware prefetchers stop at every
// page boundary and each page costs a TLB walk; on Zen 4 (2 threads, TinyLlama ffn_gate/up from
// DRAM, `matmul_bench --cold`) huge pages took M=1 from 44.6-46.0 to 50.7-53.2 GB/s and M=8 from
// 551 to 598 GOPS. Where the advice is refused (THP off) the pages are the usual ones.
namespace {
uint8_t* AllocateWeightStream(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes < kHugePage) return static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) return nullptr;
  ::madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: failure changes nothing
  return static_cast<uint8_t*>(p);
}
}  // namespace

PackedMatrix PackMatrix(Isa isa, const MatrixView& w, ThreadPool* pool) {
  KVL_CHECK(w.layout == MatrixLayout::kRows && w.data != nullptr && w.rows > 0);
  PackedMatrix packed;
  packed.view_ = w;
  if (!PacksMatrix(isa, w.type)) return packed;
  KVL_CHECK(w.cols % (IsKQuant(w.type) ? kQK_K : 32) == 0 &&
            w.row_bytes == RowBytes(w.type, w.cols));
  const int64_t panel_bytes = PackedPanelBytes(w.type, w.cols);
  packed.bytes_ = static_cast<size_t>(PackedPanels(w.rows) * panel_bytes);
  packed.storage_.reset(AllocateWeightStream(packed.bytes_));
  KVL_CHECK_MSG(packed.storage_ != nullptr, "PackMatrix: out of memory");
  uint8_t* out = packed.storage_.get();
  auto pack_panel = [&](int64_t p, int) {
    uint8_t* panel = out + p * panel_bytes;
    std::memset(panel, 0, static_cast<size_t>(panel_bytes));  // padding: zero quants and scales
    for (int64_t r = p * kPanelRows; r < std::min(w.rows, (p + 1) * kPanelRows); ++r) {
      PackPanelRow(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, w.cols,
                   r % kPanelRows, panel);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(PackedPanels(w.rows), pack_panel);
  } else {
    for (int64_t p = 0; p < PackedPanels(w.rows); ++p) pack_panel(p, 0);
  }
  packed.view_.data = out;
  packed.view_.layout = MatrixLayout::kPacked;
  return packed;
}

void MatMul(OpsContext& ctx, const MatrixView& w, const float* x, int64_t n_tokens, float* y) {
  MatMulGroup(ctx, std::span<const MatrixView>(&w, 1), x, n_tokens, std::span<float* const>(&y, 1));
}

void MatMulGroup(OpsContext& ctx, std::span<const MatrixView> ws, const float* x, int64_t n_tokens,
                 std::span<float* const> ys) {
  KVL_CHECK(ws.size() <= kMaxGroup);
  int64_t counts[kMaxGroup];
  std::fill(counts, counts + ws.size(), n_tokens);
  MatMulGroup(ctx, ws, x, std::span<const int64_t>(counts, ws.size()), ys);
}

void MatMulGroup(OpsContext& ctx, std::span<const MatrixView> ws, const float* x,
                 std::span<const int64_t> token_counts, std::span<float* const> ys) {
  KVL_CHECK(!ws.empty() && ws.size() == ys.size() && ws.size() <= kMaxGroup &&
            token_counts.size() == ws.size());
  KVL_CHECK(x != nullptr);
  const int64_t n_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  KVL_CHECK(*std::min_element(token_counts.begin(), token_counts.end()) >= 0);
  const int64_t cols = ws[0].cols;
  // Quantized weights share one quantization of x; float weights read x itself.
  const bool any_quantized =
      std::any_of(ws.begin(), ws.end(), [](const MatrixView& w) { return IsQuantized(w.type); });
  const bool any_packed_kquant = std::any_of(ws.begin(), ws.end(), [](const MatrixView& w) {
    return IsKQuant(w.type) && w.layout == MatrixLayout::kPacked;
  });
  for (size_t m = 0; m < ws.size(); ++m) {
    const MatrixView& w = ws[m];
    KVL_CHECK(w.data != nullptr && ys[m] != nullptr);
    KVL_CHECK(w.rows > 0 && w.cols == cols);
    KVL_CHECK_MSG(w.type == DType::kF32 || w.type == DType::kF16 || w.type == DType::kBF16 ||
                      IsQuantized(w.type),
                  "MatMul: unsupported weight type");
    KVL_CHECK_MSG(w.row_bytes == RowBytes(w.type, w.cols),
                  "MatMul: row_bytes != RowBytes(type, cols)");
    KVL_CHECK_MSG(!IsKQuant(w.type) || w.cols <= kMaxKQuantCols,
                  "MatMul: K-quant rows wider than kMaxKQuantCols");
    KVL_CHECK_MSG(w.layout == MatrixLayout::kRows || PacksMatrix(ctx.isa(), w.type),
                  "MatMul: weights packed for another ISA");
  }
  if (n_tokens == 0) return;
  const KernelTable& k = ctx.kernels();
  ThreadPool& pool = *ctx.pool();

  // The activations are shared by every matrix of the group: quantized once.
  MatMulArgs args[kMaxGroup];
  const uint8_t* acts = nullptr;
  const int64_t stride = ActRowStride(cols);
  if (any_quantized) {
    KVL_CHECK_MSG(static_cast<size_t>(n_tokens * stride + 64) <= ctx.scratch_bytes(),
                  "MatMul: OpsContext scratch too small; call Reserve(max_tokens, max_cols)");
    const uintptr_t base = reinterpret_cast<uintptr_t>(ctx.scratch());
    uint8_t* out = ctx.scratch() + (AlignUp64(static_cast<int64_t>(base)) - base);
    acts = out;
    constexpr int64_t kQuantTokens = 16;  // tokens per quantization task
    pool.ParallelFor((n_tokens + kQuantTokens - 1) / kQuantTokens, [&](int64_t task, int) {
      const int64_t t1 = std::min(n_tokens, (task + 1) * kQuantTokens);
      for (int64_t t = task * kQuantTokens; t < t1; ++t) {
        k.quantize_acts(x + t * cols, cols, out + t * stride);
        StoreActSums(cols, any_packed_kquant, out + t * stride);
      }
    });
  }

  // Tasks are (matrix, row chunk, token tile) triples, token tile major within a matrix so a
  // thread's consecutive tasks reuse the same activations. The reduction dimension is never split.
  int64_t row_chunk[kMaxGroup], n_row_chunks[kMaxGroup], first_task[kMaxGroup + 1];
  first_task[0] = 0;
  for (size_t m = 0; m < ws.size(); ++m) {
    const int64_t n_token_tiles = (token_counts[m] + kTokenTile - 1) / kTokenTile;
    args[m].w = ws[m];
    args[m].y = ys[m];
    const bool quantized = IsQuantized(ws[m].type);
    args[m].x = quantized ? nullptr : x;
    args[m].acts = acts;
    args[m].act_stride = quantized ? stride : 0;
    row_chunk[m] = RowChunk(std::max<int64_t>(token_counts[m], 1), ws[m].rows, pool.num_threads(),
                            ws[m].layout == MatrixLayout::kPacked);
    n_row_chunks[m] = (ws[m].rows + row_chunk[m] - 1) / row_chunk[m];
    first_task[m + 1] = first_task[m] + n_row_chunks[m] * n_token_tiles;
  }
  if (PairsStreamWithArithmetic(ctx.isa(), std::span<const MatMulArgs>(args, ws.size()),
                                token_counts)) {
    return RunStreamPairs(pool, k, std::span<const MatMulArgs>(args, ws.size()), token_counts,
                          kTokenTile);
  }
  const MatMulTileFn kquant_tile = KQuantMatMulTile(ctx.isa());
  pool.ParallelFor(first_task[ws.size()], [&](int64_t task, int) {
    size_t m = 0;
    while (task >= first_task[m + 1]) ++m;
    const int64_t local = task - first_task[m];
    const int64_t rc = local % n_row_chunks[m];
    const int64_t tt = local / n_row_chunks[m];
    const MatMulTileFn tile = ws[m].layout == MatrixLayout::kPacked ? k.matmul_packed_tile
                              : IsKQuant(ws[m].type)                  ? kquant_tile
                                                                      : k.matmul_tile;
    tile(args[m], rc * row_chunk[m], std::min(ws[m].rows, (rc + 1) * row_chunk[m]),
         tt * kTokenTile, std::min(token_counts[m], (tt + 1) * kTokenTile));
  });
}

void RmsNorm(const OpsContext& ctx, const float* x, const float* weight, int64_t n, float eps,
             float* out) {
  KVL_CHECK(n > 0);
  ctx.kernels().rms_norm(x, weight, n, eps, out);
}

void Rope(const OpsContext& ctx, float* x, int64_t n_heads, int64_t head_dim, const float* cos,
          const float* sin, bool neox) {
  KVL_CHECK(head_dim % 2 == 0);
  ctx.kernels().rope(x, n_heads, head_dim, cos, sin, neox);
}

void Softmax(const OpsContext& ctx, float* x, int64_t n) {
  if (n <= 0) return;
  ctx.kernels().softmax(x, n);
}

// Prefill's SwiGLU (tokens x FFN values, 2.5 M for a pp512 chunk of Qwen2.5-0.5B) over the pool,
// in chunks whose length is a multiple of every ISA's vector width: each element sees the
// operations it sees in one call (the tail, masked or scalar, stays the last n % width values).
void SwiGlu(const OpsContext& ctx, float* gate, const float* up, int64_t n) {
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (ctx.pool() == nullptr || chunks < 2) {
    ctx.kernels().swiglu(gate, up, n);
    return;
  }
  ctx.pool()->ParallelFor(chunks, [&](int64_t c, int) {
    const int64_t i0 = c * kChunk;
    ctx.kernels().swiglu(gate + i0, up + i0, std::min(kChunk, n - i0));
  });
}

void Add(const OpsContext& ctx, float* y, const float* x, int64_t n) { ctx.kernels().add(y, x, n); }

float Dot(const OpsContext& ctx, const float* a, const float* b, int64_t n) {
  return ctx.kernels().dot(a, b, n);
}

void Axpy(const OpsContext& ctx, float alpha, const float* x, float* y, int64_t n) {
  ctx.kernels().axpy(alpha, x, y, n);
}

void DotRows(const OpsContext& ctx, const float* q, const float* rows, int64_t stride,
             int64_t count, int64_t n, float scale, float* out) {
  const KernelTable& k = ctx.kernels();
  if (k.dot_rows != nullptr) return k.dot_rows(q, rows, stride, count, n, scale, out);
  for (int64_t i = 0; i < count; ++i) out[i] = k.dot(q, rows + i * stride, n) * scale;
}

void AxpyRows(const OpsContext& ctx, const float* weights, const float* rows, int64_t stride,
              int64_t count, int64_t n, float* y) {
  const KernelTable& k = ctx.kernels();
  if (k.axpy_rows != nullptr) return k.axpy_rows(weights, rows, stride, count, n, y);
  for (int64_t i = 0; i < count; ++i) k.axpy(weights[i], rows + i * stride, y, n);
}

namespace {

// The checks every f16 / bf16 row kernel relies on. Rows of a run must not overlap (stride >= n),
// which is how every KV layout stores them.
void CheckHalfRowsArgs(DType type, int64_t stride, int64_t count, int64_t n, const char* what) {
  KVL_CHECK_MSG(type == DType::kF16 || type == DType::kBF16, what);
  KVL_CHECK(count >= 0 && n >= 0);
  KVL_CHECK(count <= 1 || stride >= n);
}

}  // namespace

void DotRowsHalf(const OpsContext& ctx, DType type, const float* q, const uint16_t* rows,
                 int64_t stride, int64_t count, int64_t n, float scale, float* out) {
  CheckHalfRowsArgs(type, stride, count, n, "DotRowsHalf: type must be f16 or bf16");
  if (count == 0) return;
  KVL_CHECK(out != nullptr && (n == 0 || (q != nullptr && rows != nullptr)));
  ctx.kernels().dot_rows_half(type, q, rows, stride, count, n, scale, out);
}

void AxpyRowsHalf(const OpsContext& ctx, DType type, const float* weights, const uint16_t* rows,
                  int64_t stride, int64_t count, int64_t n, float* y) {
  CheckHalfRowsArgs(type, stride, count, n, "AxpyRowsHalf: type must be f16 or bf16");
  if (count == 0 || n == 0) return;
  KVL_CHECK(weights != nullptr && rows != nullptr && y != nullptr);
  ctx.kernels().axpy_rows_half(type, weights, rows, stride, count, n, y);
}

void NarrowRow(const OpsContext& ctx, DType type, const float* x, int64_t n, uint16_t* out) {
  KVL_CHECK_MSG(type == DType::kF16 || type == DType::kBF16, "NarrowRow: type must be f16 or bf16");
  KVL_CHECK(n >= 0);
  if (n == 0) return;
  KVL_CHECK(x != nullptr && out != nullptr);
  ctx.kernels().narrow_row(type, x, n, out);
}

void WidenRow(const OpsContext& ctx, DType type, const uint16_t* x, int64_t n, float* out) {
  KVL_CHECK_MSG(type == DType::kF16 || type == DType::kBF16, "WidenRow: type must be f16 or bf16");
  KVL_CHECK(n >= 0);
  if (n == 0) return;
  KVL_CHECK(x != nullptr && out != nullptr);
  ctx.kernels().widen_row(type, x, n, out);
}

void HadamardRotate(const OpsContext& ctx, float* x, int64_t rows, int64_t n) {
  KVL_CHECK_MSG(IsHadamardSize(n), "HadamardRotate: n must be a power of two");
  KVL_CHECK(rows >= 0);
  if (rows == 0) return;
  KVL_CHECK(x != nullptr);
  // Computed here, once, so every ISA's kernel multiplies by the same float.
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  ctx.kernels().hadamard_rows(x, rows, n, scale);
}

namespace {

// The checks every q8_0 / q4_0 row kernel relies on: the columns read lie inside each row, and a
// run's rows do not overlap.
void CheckQuantRowsArgs(DType type, int64_t row_bytes, int64_t col, int64_t count, int64_t n,
                        const char* what) {
  KVL_CHECK_MSG(type == DType::kQ8_0 || type == DType::kQ4_0, what);
  KVL_CHECK(count >= 0 && n >= 0 && col >= 0);
  KVL_CHECK_MSG(n <= kMaxQuantHeadDim, "quantized KV rows: n must be at most kMaxQuantHeadDim");
  const int64_t blocks = (col + n + 31) / 32;
  KVL_CHECK(count <= 1 || row_bytes >= blocks * Traits(type).block_bytes);
}

// Rows dequantized per call of the f32 row kernels: 16 rows of a 256-wide head are 16 KiB of
// stack, which stays in L1 between the dequantization and the dot.
constexpr int64_t kQuantRowsChunk = 16;

}  // namespace

void DequantizeCols(const OpsContext& ctx, DType type, const uint8_t* row, int64_t col, int64_t n,
                    float* out) {
  type = StorageFormat(type);  // a rotated type's rows are its format's bytes
  CheckQuantRowsArgs(type, 0, col, 1, n, "DequantizeCols: type must be q8_0 or q4_0");
  if (n == 0) return;
  KVL_CHECK(row != nullptr && out != nullptr);
  ctx.kernels().dequantize_cols(type, row, col, n, out);
}

// Dequantizing a chunk and then running the f32 row kernel over it is what makes the result that
// of DotRows over the dequantized rows by construction, on every ISA.
void DotRowsQuant(const OpsContext& ctx, DType type, const float* q, const uint8_t* rows,
                  int64_t row_bytes, int64_t col, int64_t count, int64_t n, float scale,
                  float* out) {
  type = StorageFormat(type);  // a rotated type's rows are its format's bytes
  CheckQuantRowsArgs(type, row_bytes, col, count, n, "DotRowsQuant: type must be q8_0 or q4_0");
  if (count == 0) return;
  KVL_CHECK(out != nullptr && (n == 0 || (q != nullptr && rows != nullptr)));
  alignas(64) float buf[kQuantRowsChunk * kMaxQuantHeadDim];
  for (int64_t i = 0; i < count; i += kQuantRowsChunk) {
    const int64_t m = std::min(kQuantRowsChunk, count - i);
    for (int64_t r = 0; r < m; ++r) {
      ctx.kernels().dequantize_cols(type, rows + (i + r) * row_bytes, col, n, buf + r * n);
    }
    DotRows(ctx, q, buf, n, m, n, scale, out + i);
  }
}

void AxpyRowsQuant(const OpsContext& ctx, DType type, const float* weights, const uint8_t* rows,
                   int64_t row_bytes, int64_t col, int64_t count, int64_t n, float* y) {
  type = StorageFormat(type);  // a rotated type's rows are its format's bytes
  CheckQuantRowsArgs(type, row_bytes, col, count, n, "AxpyRowsQuant: type must be q8_0 or q4_0");
  if (count == 0 || n == 0) return;
  KVL_CHECK(weights != nullptr && rows != nullptr && y != nullptr);
  alignas(64) float buf[kQuantRowsChunk * kMaxQuantHeadDim];
  for (int64_t i = 0; i < count; i += kQuantRowsChunk) {
    const int64_t m = std::min(kQuantRowsChunk, count - i);
    for (int64_t r = 0; r < m; ++r) {
      ctx.kernels().dequantize_cols(type, rows + (i + r) * row_bytes, col, n, buf + r * n);
    }
    AxpyRows(ctx, weights + i, buf, n, m, n, y);
  }
}

namespace {

// The checks every compressed-KV kernel relies on; `bits` is what the entry point expects.
void CheckQuantKvArgs(const QuantKvLayerView& page, int bits, int64_t first_row, int64_t count,
                      int64_t head_offset, int64_t head_dim) {
  KVL_CHECK_MSG(page.bits == bits, "compressed KV kernel: page.bits does not match the kernel");
  KVL_CHECK(page.rows > 0 && page.kv_dim > 0);
  KVL_CHECK(page.row_bytes == (bits == 8 ? page.kv_dim : page.kv_dim / 2));
  KVL_CHECK(first_row >= 0 && count >= 0 && first_row + count <= page.rows);
  KVL_CHECK_MSG(head_dim > 0 && head_dim <= kMaxQuantHeadDim,
                "compressed KV kernel: head_dim must be in 1..kMaxQuantHeadDim");
  KVL_CHECK(head_offset >= 0 && head_offset + head_dim <= page.kv_dim);
  KVL_CHECK_MSG(bits == 8 || (head_offset % 2 == 0 && head_dim % 2 == 0),
                "int4 KV kernel: head_offset and head_dim must be even (two codes per byte)");
  // A 16-channel vector then spans at most two value groups.
  KVL_CHECK_MSG(page.v_group > 0 && page.v_groups * page.v_group == page.kv_dim &&
                    (page.v_group % 32 == 0 || page.v_group == page.kv_dim),
                "compressed KV kernel: v_group must be a multiple of 32 or the whole row");
}

// An ISA table may leave a compressed-KV entry null: the scalar one runs instead.
template <typename Fn>
Fn OrScalar(Fn fn, Fn scalar) {
  return fn != nullptr ? fn : scalar;
}

}  // namespace

void DotRowsKInt8(const OpsContext& ctx, const float* q, const QuantKvLayerView& page,
                  int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                  float scale, float* out) {
  CheckQuantKvArgs(page, 8, first_row, count, head_offset, head_dim);
  if (count == 0) return;
  KVL_CHECK(q != nullptr && out != nullptr && page.k_q != nullptr && page.k_scale != nullptr);
  OrScalar(ctx.kernels().dot_rows_k_int8, ScalarKernels().dot_rows_k_int8)(
      q, page, first_row, count, head_offset, head_dim, scale, out);
}

void DotRowsKInt4(const OpsContext& ctx, const float* q, const QuantKvLayerView& page,
                  int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                  float scale, float* out) {
  CheckQuantKvArgs(page, 4, first_row, count, head_offset, head_dim);
  if (count == 0) return;
  KVL_CHECK(q != nullptr && out != nullptr && page.k_q != nullptr && page.k_scale != nullptr &&
            page.k_min != nullptr);
  OrScalar(ctx.kernels().dot_rows_k_int4, ScalarKernels().dot_rows_k_int4)(
      q, page, first_row, count, head_offset, head_dim, scale, out);
}

void DotRowsK(const OpsContext& ctx, const float* q, const QuantKvLayerView& page,
              int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim, float scale,
              float* out) {
  if (page.bits == 4)
    return DotRowsKInt4(ctx, q, page, first_row, count, head_offset, head_dim, scale, out);
  DotRowsKInt8(ctx, q, page, first_row, count, head_offset, head_dim, scale, out);
}

void AxpyRowsVInt8(const OpsContext& ctx, const float* weights, const QuantKvLayerView& page,
                   int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                   float* y) {
  CheckQuantKvArgs(page, 8, first_row, count, head_offset, head_dim);
  if (count == 0) return;
  KVL_CHECK(weights != nullptr && y != nullptr && page.v_q != nullptr && page.v_scale != nullptr);
  OrScalar(ctx.kernels().axpy_rows_v_int8, ScalarKernels().axpy_rows_v_int8)(
      weights, page, first_row, count, head_offset, head_dim, y);
}

void AxpyRowsVInt4(const OpsContext& ctx, const float* weights, const QuantKvLayerView& page,
                   int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim,
                   float* y) {
  CheckQuantKvArgs(page, 4, first_row, count, head_offset, head_dim);
  if (count == 0) return;
  KVL_CHECK(weights != nullptr && y != nullptr && page.v_q != nullptr && page.v_scale != nullptr &&
            page.v_min != nullptr);
  OrScalar(ctx.kernels().axpy_rows_v_int4, ScalarKernels().axpy_rows_v_int4)(
      weights, page, first_row, count, head_offset, head_dim, y);
}

void AxpyRowsV(const OpsContext& ctx, const float* weights, const QuantKvLayerView& page,
               int64_t first_row, int64_t count, int64_t head_offset, int64_t head_dim, float* y) {
  if (page.bits == 4)
    return AxpyRowsVInt4(ctx, weights, page, first_row, count, head_offset, head_dim, y);
  AxpyRowsVInt8(ctx, weights, page, first_row, count, head_offset, head_dim, y);
}

void DequantizeQuantKvRow(const QuantKvLayerView& page, int64_t row, int64_t head_offset,
                          int64_t head_dim, float* k_out, float* v_out) {
  CheckQuantKvArgs(page, page.bits, row, 1, head_offset, head_dim);
  KVL_CHECK(page.bits == 8 || page.bits == 4);
  ScalarDequantizeQuantKvRow(page, row, head_offset, head_dim, k_out, v_out);
}

int64_t AttentionTileTokens(int64_t head_dim) {
  KVL_CHECK_MSG(head_dim > 0 && head_dim <= kMaxAttentionHeadDim,
                "tiled attention: head_dim must be in 1..kMaxAttentionHeadDim");
  const int64_t fit = kAttentionTileFloats / head_dim / 16 * 16;
  return std::clamp<int64_t>(fit, 16, kMaxAttentionTileTokens);
}

namespace {

void CheckAttentionTileShape(int64_t head_dim, int64_t width) {
  KVL_CHECK_MSG(head_dim > 0 && head_dim <= kMaxAttentionHeadDim,
                "tiled attention: head_dim must be in 1..kMaxAttentionHeadDim");
  KVL_CHECK_MSG(width > 0 && width % 16 == 0 && width <= kMaxAttentionTileTokens &&
                    width * head_dim <= kAttentionTileFloats,
                "tiled attention: width must be a multiple of 16 that fits a tile");
}

}  // namespace

void PackAttentionKeys(const OpsContext& ctx, DType type, const void* rows, int64_t stride,
                       int64_t count, int64_t head_dim, float* kt, int64_t width, int64_t col) {
  KVL_CHECK_MSG(type == DType::kF32 || type == DType::kF16 || type == DType::kBF16,
                "PackAttentionKeys: type must be f32, f16 or bf16");
  CheckAttentionTileShape(head_dim, width);
  KVL_CHECK(count >= 0 && col >= 0 && col + count <= width);
  KVL_CHECK(count <= 1 || stride >= head_dim);
  if (count == 0) return;
  KVL_CHECK(rows != nullptr && kt != nullptr);
  ctx.kernels().pack_attention_keys(type, rows, stride, count, head_dim, kt, width, col);
}

void AttentionTile(const OpsContext& ctx, const float* kt, int64_t width, const float* const* v,
                   int64_t count, int64_t head_dim, float scale, const AttentionRows& rows) {
  CheckAttentionTileShape(head_dim, width);
  KVL_CHECK(count >= 1 && count <= width && rows.num_rows >= 0);
  KVL_CHECK_MSG(reinterpret_cast<uintptr_t>(kt) % 64 == 0, "AttentionTile: kt must be 64-byte aligned");
  if (rows.num_rows == 0) return;
  KVL_CHECK(v != nullptr && rows.q != nullptr && rows.m != nullptr && rows.l != nullptr &&
            rows.acc != nullptr);
  if (rows.softcap > 0.0f) {
    // Soft-capped scores (Gemma-2) have no SIMD kernel: the scalar one applies the cap.
    ScalarAttentionTile(kt, width, v, count, head_dim, scale, rows);
    return;
  }
  ctx.kernels().attention_tile(kt, width, v, count, head_dim, scale, rows);
}

void PrefetchRows(const void* base, int64_t stride, int64_t count, int64_t bytes) {
  const auto* p = static_cast<const char*>(base);
  for (int64_t i = 0; i < count; ++i, p += stride) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
    __builtin_prefetch(p + bytes - 1, 0, 3);  // the last line when the range is not aligned
  }
}

void DequantizeRow(DType type, const void* row, int64_t n, float* out) {
  quant::DequantizeRow(type, row, n, out);
}

LogitsDivergence CompareLogits(const float* reference, const float* other, int64_t n) {
  KVL_CHECK(n > 0);
  int64_t top_ref = 0, top_other = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (reference[i] > reference[top_ref]) top_ref = i;
    if (other[i] > other[top_other]) top_other = i;
  }
  // log-softmax of each row: x - max - log(sum(exp(x - max))).
  auto log_norm = [n](const float* x, double max) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
    return max + std::log(sum);
  };
  const double norm_ref = log_norm(reference, reference[top_ref]);
  const double norm_other = log_norm(other, other[top_other]);
  double kld = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double log_p = static_cast<double>(reference[i]) - norm_ref;
    const double log_q = static_cast<double>(other[i]) - norm_other;
    kld += std::exp(log_p) * (log_p - log_q);
  }
  return {std::max(0.0, kld), top_ref == top_other};
}

}  // namespace kvl::ops
