// Sliding-window layers in the KV hierarchy (issue 25, item 2).
//
// A local (sliding-window) layer's token at position p sees only (p - window, p], so once a
// sequence has computed position n its local layers never read a position before
// n - window + 1 again. The pool's blocks therefore hold the global layers' K/V only, and each
// sequence slot keeps its local layers' K/V in a ring of `ring_tokens` rows per local layer
// (window - 1 rows its next tokens look back at, plus the most tokens one forward run writes):
// every row a local layer leaves behind is released as the ring turns, which is lossless,
// since nothing reads it again. A long Gemma-3 context holds about a sixth of full attention's
// K/V (its global layers) plus one window per sequence.
//
// What attention reads from a local layer comes from the ring: a position older than the ring's
// rows is kDropped (the mask left it out anyway; GatherTile skips it, so the arithmetic is the
// keep-all run's, bit for bit). A local layer's K/V in a pool block, a tier page or the KV store
// is never read (KvBlockStorage hands out a scratch layer for it; see KvBlockLayout::windowed).
//
// Prefix reuse survives the release. A sequence that starts from a cached prefix (the pool's
// prefix cache, a store promotion, a restore after preemption) holds its global layers' K/V but
// no local rows: before its first new token, the last window's local K/V is rebuilt, either
//  - from residual checkpoints (where the pool keeps one at every layer): per local layer one
//    RmsNorm, two projections and RoPE of window - 1 tokens (KvRebuilder::Rebuild, the forward
//    pass's Forward::RebuildLayerKv per layer); or
//  - from tokens: the tokens from RebuildStart(n) on run through the forward pass flagged as
//    window rebuilds (TokenBatch::window_rebuild): their global layers read the cached K/V and
//    write nothing, their local layers write the ring. A local layer's input at position q
//    depends on the layer below's window (q - window, q], so exactness needs window - 1 more
//    tokens per local layer below; the tokens before them give inexact rows that nothing exact
//    reads (the receptive field argument in RebuildStart).
// whichever the cost model prices lower (ChooseWindowRebuild). Both are bit-identical to the
// keep-all run: the same operations on the same inputs.
//
// Thread-safety: RowsAt may be called concurrently (reads only); everything else from the step
// loop.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "kvl/status.h"

namespace kvl {

// Which layers slide and how far, with what one forward run may write.
struct KvWindowShape {
  int64_t window = 0;                // a local layer's token at p sees (p - window, p]
  std::vector<bool> layer_is_local;  // [layer]
  int64_t max_run_tokens = 0;        // most tokens of one sequence in one forward run

  int64_t num_local_layers() const;
  // Rows per sequence and local layer: the window's look-back and one run's new rows.
  int64_t ring_tokens() const { return window - 1 + max_run_tokens; }
  // Whether releasing applies: a window and at least one local layer.
  bool releases() const { return window > 0 && num_local_layers() > 0; }
};

// The ring's bytes for `max_seqs` slots: what the budget sets aside for the local layers.
int64_t WindowRingBytes(const KvWindowShape& shape, const KvBlockLayout& layout,
                        int32_t max_seqs);

// How a sequence's missing window is rebuilt.
enum class KvWindowRebuild { kNone, kFromResiduals, kFromTokens };

// Per-page prices of the two rebuilds (the cost model's), for ChooseWindowRebuild.
struct KvWindowRebuildPrices {
  double residual_page_ms = 0;  // one page's K/V of every layer from its checkpoints
  double tokens_page_ms = 0;    // one page recomputed from its tokens through every layer
  int64_t block_tokens = 16;
  int64_t num_layers = 1;
};

// Rebuild counters, for the metrics.
struct KvWindowStats {
  int64_t ring_bytes = 0;              // held for every slot, within the budget
  int64_t rebuilds_from_residuals = 0;
  int64_t rebuilds_from_tokens = 0;
  int64_t tokens_rebuilt = 0;          // tokens run as window rebuilds
  int64_t rows_rebuilt = 0;            // local-layer rows rebuilt from checkpoints
};

class KvWindowRelease {
 public:
  // INVALID_ARGUMENT where the shape cannot release (no window, no local layer, no run tokens).
  static StatusOr<std::unique_ptr<KvWindowRelease>> Create(const KvWindowShape& shape,
                                                           const KvBlockLayout& layout,
                                                           int32_t max_seqs);

  const KvWindowShape& shape() const { return shape_; }
  bool IsLocal(int64_t layer) const { return shape_.layer_is_local[static_cast<size_t>(layer)]; }
  int64_t ring_tokens() const { return ring_tokens_; }
  int64_t bytes() const { return static_cast<int64_t>(ring_.size()); }
  const KvWindowStats& stats() const { return stats_; }

  // The forward pass's rows of a local layer (PagedKvCache routes local layers here): the ring's
  // rows from `pos` while it holds them, kDropped before its oldest.
  KvCache::Rows RowsAt(SeqId seq, int64_t layer, int64_t pos);

  // A new occupant of a slot (an admission): it holds no rows yet.
  void StartSequence(SeqId seq);
  // Before a forward run writes positions [from, to) of `seq`: those rows become its, and the
  // rows they replace in the ring (positions ring_tokens before) are released. The run must leave
  // the window its tokens read in place (to - from <= max_run_tokens, checked).
  void ClaimRun(SeqId seq, int64_t from, int64_t to);

  // Whether `seq`, about to compute position n, holds the local rows its window reads.
  bool HoldsWindow(SeqId seq, int64_t n) const;
  // The first position a rebuild from tokens must run from so that the local rows of
  // [n - window + 1, n) come out exact: window - 1 more per local layer, counted from the top.
  int64_t RebuildStart(int64_t n) const;
  // The cheaper exact rebuild of the window before n, from the cost model's prices:
  // kFromResiduals only where `residuals_available`.
  KvWindowRebuild ChooseWindowRebuild(int64_t n, bool residuals_available,
                                      const KvWindowRebuildPrices& prices) const;
  // Whether the pool holds checkpoints of every local layer for [n - window + 1, n) of `seq`.
  bool ResidualsCover(const KvManager& manager, KvBlockStorage& storage, SeqId seq,
                      int64_t n) const;
  // Rebuilds the local rows of [n - window + 1, n) from the pool's checkpoints (ResidualsCover
  // must hold) and claims them.
  void RebuildFromResiduals(const KvManager& manager, KvBlockStorage& storage,
                            KvRebuilder& rebuilder, SeqId seq, int64_t n);
  // Counts a rebuild from tokens of [from, n) (the step runs them).
  void CountTokenRebuild(int64_t tokens);

 private:
  KvWindowRelease(const KvWindowShape& shape, const KvBlockLayout& layout, int32_t max_seqs);
  // Ring row `pos` of a local layer (local index) of a slot.
  uint8_t* KeyRow(SeqId seq, int64_t local, int64_t pos);
  uint8_t* ValueRow(SeqId seq, int64_t local, int64_t pos);

  struct Held {
    int64_t from = 0;  // the positions [from, to) whose rows the ring holds
    int64_t to = 0;
  };

  KvWindowShape shape_;
  KvBlockLayout layout_;
  int64_t ring_tokens_ = 0;
  std::vector<int64_t> local_index_;  // [layer] -> index among local layers, -1 for global
  int64_t layer_bytes_ = 0;           // one slot's K then V rows of one local layer
  std::vector<uint8_t> ring_;         // [slot][local layer][K rows | V rows][ring_tokens]
  std::vector<Held> held_;            // [slot]
  KvWindowStats stats_;
  std::vector<float> checkpoints_;    // RebuildFromResiduals' gathered inputs
  std::vector<int64_t> positions_;
};

}  // namespace kvl
