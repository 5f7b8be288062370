// The layer streamer: what a step reads of the pages that left the pool losslessly. One of the
// pager's parts (KvPager owns it):
//   - staging: at BeginStep, the pages of the step's sequences held in a tier or as checkpoints
//     get a place in the stream buffers (KvStreamStep, this step's alone);
//   - prefetch: each layer's reads (K/V, or checkpoints at checkpoint layers) are queued as the
//     layer before begins, ahead of the wait for that layer's own, so they follow its reads
//     without a gap and run while it computes; one batch per tier, into double buffers;
//   - rebuilds: the checkpointed pages' rows of each layer handed to the forward pass, which
//     computes them inside the step (KvLayerRebuild); and, between steps, a whole block rebuilt
//     from its checkpoints through the rebuilder (a restore or a promotion back).
// Pages read in place (an uncompressed RAM tier) are not staged: each layer's rows are looked up
// where the tier holds them. A read that fails (checksum, I/O, a page the tier let go) makes the
// page read as dropped for the rest of the step and names its sequence in EndStep.
//
// It never changes a page's fate: the page table (kvl/kv_page_table.h) is read only.
//
// Thread-safety: owned by the step loop. Rows is called from the forward's threads between
// BeginLayer calls, reading only.
#pragma once

#include <cstdint>
#include <future>
#include <span>
#include <vector>

#include "kv_tier_mover.h"
#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_page_table.h"

namespace kvl {

// What one step stages: the pages of its sequences that attention reads outside the pool, and
// the sequences whose reads failed. Filled at BeginStep, emptied at the next; nothing in it
// outlasts the step (the page records keep only what lasts).
struct KvStreamStep {
  struct Page {
    SeqId seq = 0;
    int64_t block_index = 0;
    const uint8_t* in_place_rows = nullptr;  // read in place: this layer's K/V rows in the tier
    bool read_failed = false;                // its read failed this step: it reads as dropped
  };
  std::vector<Page> streamed;  // K/V staged from a tier; a page's index is its stage index
  std::vector<Page> in_place;  // K/V read where the tier holds them
  std::vector<Page> rebuilt;   // checkpoints staged; K/V rebuilt by the forward pass
  // [slot][block_index]: the page's index in its list (which list its fate says), -1 none.
  std::vector<std::vector<int32_t>> index;
  std::vector<SeqId> failed;

  // The step's entry of a page (CHECKs that it has one).
  const Page& Find(const KvPage& page, SeqId seq, int64_t block_index) const;
  // Forgets the pages (the failed sequences stay until the next step begins).
  void ClearPages();
};

// The streamer's counters, totals since the start unless said.
struct KvStreamStats {
  int64_t staging_bytes = 0;         // every stream and rebuild buffer (reserved up front)
  int64_t staging_capacity_pages = 0;  // pages that can be streamed or rebuilt at once
  int64_t layers_streamed = 0;       // layer pages read for attention
  double stream_wait_ms = 0;         // time BeginLayer waited for a prefetch
  int64_t stream_read_failures = 0;  // layer reads that failed their checksum or I/O
  int64_t layers_rebuilt = 0;        // page layers rebuilt from checkpoints for attention
  int64_t layers_advanced = 0;       // of those, run whole for a layer with no checkpoint
  double rebuild_ms = 0;             // time spent rebuilding blocks between steps
};

class KvLayerStreamer {
 public:
  KvLayerStreamer(const KvManager& manager, KvBlockStorage& storage, const KvPageTable& table,
                  KvTierMover& mover);
  // Reads in flight write into the stream buffers: they are waited for before the buffers go.
  ~KvLayerStreamer();

  // Allocates the stream and rebuild buffers for up to `max_staged_pages` pages at once (0:
  // none). Nothing grows later.
  void Reserve(int64_t max_staged_pages);
  int64_t staging_capacity_pages() const { return stats_.staging_capacity_pages; }
  // The forward pass, which rebuilds pages, and its view of the pool (see KvPager::set_rebuilder).
  void set_rebuilder(KvRebuilder* rebuilder, KvCache* cache) {
    rebuilder_ = rebuilder;
    cache_ = cache;
  }
  bool can_rebuild() const {
    return layout_.residual_dim > 0 && rebuilder_ != nullptr &&
           (layout_.checkpoint_every == 1 || cache_ != nullptr);
  }

  // Around each forward run (KvPager::BeginStep / EndStep): stages the sequences' pages and
  // issues layer 0's reads; then waits for any read left and returns the sequences whose reads
  // failed (the span lives until the next BeginStep).
  void BeginStep(std::span<const SeqId> seqs);
  std::span<const SeqId> EndStep();
  // The sequence of each page the current (after EndStep: the last) forward run rebuilds from
  // checkpoints inside it, one entry per page: what the engine measures the step's rebuilds by.
  std::span<const SeqId> rebuilt_in_step() const { return rebuilt_in_step_; }
  // KvCache::BeginLayer: issues the next layer's reads, waits for this layer's, and hands the
  // forward pass the rows it rebuilds at this layer.
  KvLayerRebuild BeginLayer(int64_t layer);
  // Rows of a staged page (held in a tier or as checkpoints) at `layer` from row `offset` on.
  KvCache::Rows Rows(const KvPage& page, SeqId seq, int64_t block_index, int64_t layer,
                     int64_t offset);

  // Between steps: K and V of every layer of `block` (page `block_index` of `seq`) rebuilt from
  // the checkpoints it holds. False (nothing rebuilt) where the layers between checkpoints
  // cannot be run: an earlier page of the sequence is out of the pool.
  bool RebuildBlock(SeqId seq, BlockId block, int64_t block_index);

  const KvStreamStats& stats() const { return stats_; }

 private:
  struct PendingRead {
    std::future<std::vector<Status>> result;
    bool checkpoints = false;            // step_.rebuilt pages' checkpoints, else streamed K/V
    std::vector<int64_t> stage_indices;  // one per page read, in order
  };

  void Stage(std::vector<KvStreamStep::Page>& list, SeqId seq, int64_t block_index);
  void IssueLayerRead(int64_t layer);
  // This step's rebuild work at one layer (staged checkpoints in `buffer`), for the forward pass.
  KvLayerRebuild RebuildOfLayer(int64_t layer, int buffer);
  // A page whose read failed: it reads as dropped, the store forgets it, its sequence is named.
  void Fail(KvStreamStep::Page& staged);
  uint8_t* StageData(int64_t layer, int64_t stage_index);
  void WaitForReads();

  const KvManager& manager_;
  KvBlockStorage& storage_;
  const KvPageTable& table_;
  KvTierMover& mover_;
  KvBlockLayout layout_;
  KvRebuilder* rebuilder_ = nullptr;
  KvCache* cache_ = nullptr;  // what a restore's layers between checkpoints attend over

  KvStreamStep step_;
  // Double-buffered: the streamed pages' K/V layer [pages][layer_bytes], the rebuilt pages'
  // checkpoint layer [pages][checkpoint_layer_bytes]; the K / V rows rebuilt from them for the
  // current layer, and their positions and sequences [pages][block_tokens].
  std::vector<uint8_t> stage_[2];
  std::vector<uint8_t> checkpoint_stage_[2];
  std::vector<int64_t> rebuilt_positions_;
  std::vector<int32_t> rebuilt_seq_ids_;
  std::vector<SeqId> rebuilt_in_step_;  // [pages] of the step, kept past EndStep
  std::vector<uint8_t> rebuilt_k_;
  std::vector<uint8_t> rebuilt_v_;
  std::vector<PendingRead> pending_[2];  // by buffer: one read per tier
  int64_t pending_layer_[2] = {-1, -1};
  // [block_tokens]: positions and sequence of a block rebuilt between steps.
  std::vector<int64_t> block_positions_;
  std::vector<int32_t> block_seq_ids_;

  KvStreamStats stats_;
};

}  // namespace kvl
