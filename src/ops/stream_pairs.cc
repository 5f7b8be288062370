#include "stream_pairs.h"

#include <algorithm>
#include <vector>

#include "kvl/quant.h"

namespace kvl::ops {
namespace {

// A matrix is a stream when its few tokens make it read its weights once and do little with them
// (decode rows), and arithmetic when its tokens reuse every weight many times from cache.
constexpr int64_t kStreamMaxTokens = 2;
constexpr int64_t kArithmeticMinTokens = 16;
// Below this much streamed weight the stream is in cache already and there is nothing to hide.
constexpr int64_t kMinStreamBytes = 256 << 10;
// The most stream a task's arithmetic pulls in. Every prefetch holds one of the core's few L1 miss
// buffers until DRAM answers, and the tile's own loads from L2 need them too: pulling more starves
// the arithmetic. TinyLlama Q8_0, a 64-token page's K and V beside Q (`rebuild_step_bench`, the
// page's added ms, medians of 6 alternated runs): unpaired 9.9, 32 KiB pieces 9.3, 64 KiB 9.1,
// 128 KiB 7.7; pieces of 256 KiB (gate and up beside the next layer's K and V) slowed the K and V
// tiles 2x.
constexpr int64_t kMaxPieceBytes = 128 << 10;

int64_t PanelsOf(const MatMulArgs& a) { return PackedPanels(a.w.rows); }

bool IsStream(const MatMulArgs& a, int64_t tokens) {
  return a.w.layout == MatrixLayout::kPacked && tokens > 0 && tokens <= kStreamMaxTokens;
}

// Arithmetic whose kernel issues StreamAhead: the AVX-512 Q8_0 / Q4_0 tiles (gemm_avx512.cc).
bool IsArithmetic(const MatMulArgs& a, int64_t tokens) {
  return a.w.layout == MatrixLayout::kPacked && tokens >= kArithmeticMinTokens &&
         (a.w.type == DType::kQ8_0 || a.w.type == DType::kQ4_0);
}

// Two panels (the AVX-512 tile's height) x one balanced token tile of one arithmetic matrix.
struct ArithmeticTask {
  size_t m;
  int64_t r0, r1, t0, t1;
};

// A run of panels of one stream matrix.
struct StreamPiece {
  size_t m;
  int64_t p0, p1;
};

}  // namespace

bool PairsStreamWithArithmetic(Isa isa, std::span<const MatMulArgs> args,
                               std::span<const int64_t> token_counts) {
  if (isa != Isa::kAvx512) return false;
  int64_t stream_bytes = 0;
  bool arithmetic = false;
  for (size_t m = 0; m < args.size(); ++m) {
    if (IsStream(args[m], token_counts[m])) {
      stream_bytes += PanelsOf(args[m]) * PackedPanelBytes(args[m].w.type, args[m].w.cols);
    } else if (IsArithmetic(args[m], token_counts[m])) {
      arithmetic = true;
    } else if (token_counts[m] > 0) {
      return false;  // a matrix of 3-15 tokens, or one not packed: the plain schedule
    }
  }
  return arithmetic && stream_bytes >= kMinStreamBytes;
}

void RunStreamPairs(ThreadPool& pool, const KernelTable& kernels, std::span<const MatMulArgs> args,
                    std::span<const int64_t> token_counts, int64_t token_tile) {
  std::vector<ArithmeticTask> arithmetic;
  int64_t stream_panels = 0;
  for (size_t m = 0; m < args.size(); ++m) {
    if (IsStream(args[m], token_counts[m])) stream_panels += PanelsOf(args[m]);
  }
  for (size_t m = 0; m < args.size(); ++m) {
    const int64_t tokens = token_counts[m];
    if (tokens == 0 || IsStream(args[m], tokens)) continue;
    const int64_t rows = args[m].w.rows;
    const int64_t token_tiles = (tokens + token_tile - 1) / token_tile;
    for (int64_t r0 = 0; r0 < rows; r0 += 2 * kPanelRows) {
      for (int64_t i = 0; i < token_tiles; ++i) {
        const TokenTile tt = BalancedTokenTile(tokens, token_tile, i);
        arithmetic.push_back(
            {m, r0, std::min(rows, r0 + 2 * kPanelRows), tt.start, tt.start + tt.count});
      }
    }
  }
  // The stream cut into pieces, at least one per arithmetic task (each matrix's share in
  // proportion to its panels) and none larger than kMaxPieceBytes: what a task's arithmetic can
  // pull into L2 beside its own weights. Pieces beyond the tasks run alone.
  std::vector<StreamPiece> pieces;
  const int64_t n_tasks = static_cast<int64_t>(arithmetic.size());
  for (size_t m = 0; m < args.size(); ++m) {
    if (!IsStream(args[m], token_counts[m])) continue;
    const int64_t panels = PanelsOf(args[m]);
    const int64_t panel_bytes = PackedPanelBytes(args[m].w.type, args[m].w.cols);
    const int64_t by_tasks = panels * n_tasks / stream_panels;
    const int64_t by_size = (panels * panel_bytes + kMaxPieceBytes - 1) / kMaxPieceBytes;
    const int64_t n = std::clamp<int64_t>(std::max(by_tasks, by_size), 1, panels);
    for (int64_t i = 0; i < n; ++i) pieces.push_back({m, panels * i / n, panels * (i + 1) / n});
  }

  const int64_t n = std::max<int64_t>(n_tasks, static_cast<int64_t>(pieces.size()));
  pool.ParallelFor(n, [&](int64_t i, int) {
    const StreamPiece* piece = i < static_cast<int64_t>(pieces.size()) ? &pieces[i] : nullptr;
    if (i < n_tasks) {
      const ArithmeticTask& task = arithmetic[static_cast<size_t>(i)];
      MatMulArgs a = args[task.m];
      StreamAhead ahead;
      if (piece != nullptr) {  // every task is arithmetic here (PairsStreamWithArithmetic)
        const MatMulArgs& s = args[piece->m];
        const int64_t panel_bytes = PackedPanelBytes(s.w.type, s.w.cols);
        ahead.next = static_cast<const char*>(s.w.data) + piece->p0 * panel_bytes;
        ahead.end = static_cast<const char*>(s.w.data) + piece->p1 * panel_bytes;
        // The blocks this task's tiles compute: tiles of 2 panels x kPackedTileTokens tokens.
        const int64_t tiles = ((task.r1 - task.r0 + 2 * kPanelRows - 1) / (2 * kPanelRows)) *
                              ((task.t1 - task.t0 + kPackedTileTokens - 1) / kPackedTileTokens);
        const int64_t blocks = std::max<int64_t>(1, tiles * (a.w.cols / 32));
        const int64_t lines = (ahead.end - ahead.next) / 64;
        ahead.lines_per_block = (lines + blocks - 1) / blocks;
        a.stream_ahead = &ahead;
      }
      kernels.matmul_packed_tile(a, task.r0, task.r1, task.t0, task.t1);
    }
    if (piece != nullptr) {
      const MatMulArgs& s = args[piece->m];
      kernels.matmul_packed_tile(s, piece->p0 * kPanelRows,
                                 std::min(s.w.rows, piece->p1 * kPanelRows), 0,
                                 token_counts[piece->m]);
    }
  });
}

}  // namespace kvl::ops
