// The action lattice on running sequences: pages that leave the KV pool while their sequence
// goes on generating. A full page other than the newest can be
//   - compressed in place (int8 / int4 slabs inside the pool; attention reads them directly),
//   - demoted to a slower tier (RAM or disk) and streamed back layer by layer for every step that
//     reads it, each layer prefetched while the previous one computes, never re-entering the pool,
//   - evicted (dropped; attention gives its tokens no weight),
//   - recomputed from residual checkpoints: the page's checkpoints go to the RAM tier, and every
//     step that reads the page streams them back layer by layer and rebuilds K and V (one
//     RmsNorm, two projections and RoPE per layer, bit-identical to what was stored).
// The pool itself (KvManager) only sees a hole in the block table; the pager knows where each
// page went and hands attention its rows (KvDetachedPages). It also keeps the attention mass each
// position received, which the policy reads as a page's heat.
//
// Tier pages are one layer each (K rows then V rows at the cache's element type), so a step can
// fetch exactly the layer it is about to read. The same layer-page format serves the pages of
// preempted sequences (WriteLayerPages / ReadLayerPages).
//
// Thread-safety: owned by the step loop. RowsAt and AttentionMass are called from the forward's
// threads between BeginLayer calls, reading only.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <span>
#include <vector>

#include "kvl/compressed_slabs.h"
#include "kvl/kv_codec.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_tier.h"

namespace kvl {

struct KvPagerStats {
  int64_t compressed_pages = 0;      // held now
  int64_t streamed_pages = 0;        // held now, in a tier
  int64_t rebuilt_pages = 0;         // held now as checkpoints in the RAM tier
  int64_t layers_rebuilt = 0;        // page layers rebuilt from checkpoints for attention, total
  double rebuild_ms = 0;             // time spent rebuilding them, total
  int64_t evicted_pages = 0;         // held now (as holes)
  int64_t compressed_bytes = 0;      // slab slots in use
  int64_t slab_blocks = 0;
  int64_t staging_bytes = 0;         // the per-layer stream buffers
  int64_t layers_streamed = 0;       // layer pages read for attention, total
  double stream_wait_ms = 0;         // time BeginLayer waited for a prefetch, total
  int64_t stream_read_failures = 0;  // layer reads that failed their checksum or I/O
};

class KvPager final : public KvDetachedPages {
 public:
  // Rebuilds K and V of n tokens of one layer from their checkpoints ([n][dim] f32) into
  // [n][kv_dim] rows of the cache types (Forward::RebuildLayerKv).
  using LayerRebuilder = std::function<void(int64_t layer, const float* checkpoints,
                                            const int64_t* positions, int64_t n, uint8_t* k_out,
                                            uint8_t* v_out)>;

  KvPager(KvManager& manager, KvBlockStorage& storage, int32_t max_seqs, int64_t max_context);
  ~KvPager() override;

  // A sequence enters the pool (admission): its history starts empty.
  void StartSequence(SeqId seq);
  // Forgets every detached page of a sequence leaving the pool (finished, cancelled, preempted):
  // slab slots are freed and tier pages erased.
  void DropSequence(SeqId seq);

  // Takes block `block_index` of `seq` out of the pool under `action` (kCompressInt8/Int4,
  // kDemoteRam/Disk with `tier`, kRecomputeResidual with the RAM `tier` for the checkpoints,
  // kEvict). False, with nothing changed, when it cannot be done
  // (a full tier; no block for a slab). The block must be full, not the last, and not shared.
  bool DetachPage(SeqId seq, int64_t block_index, KvAction action, KvTier* tier);

  // A compressed page dropped for good: the last resort when the pool is full of compressed
  // pages. False when the page is not compressed.
  bool EvictCompressedPage(SeqId seq, int64_t block_index);
  bool IsCompressed(SeqId seq, int64_t block_index) const;

  // Around each forward run: the sequences in the batch (their streamed pages are fetched layer
  // by layer), then after the run, sequences whose streamed reads failed this step (their step's
  // output must be discarded and their KV recomputed).
  void BeginStep(std::span<const SeqId> seqs);
  std::vector<SeqId> EndStep();

  // KvDetachedPages.
  KvCache::Rows RowsAt(int32_t seq, int64_t block_index, int64_t layer, int64_t offset) override;
  void BeginLayer(int64_t layer) override;
  float* AttentionMass(int32_t seq) override;

  // Mass the page's tokens received per step since it was filled (mean over steps), in [0, 1].
  double PageMass(SeqId seq, int64_t block_index) const;
  bool IsDetached(SeqId seq, int64_t block_index) const;
  // Steps the sequence has run (attention rows accumulated).
  int64_t steps(SeqId seq) const;

  // A whole page saved in a tier as one tier page per layer: K/V rows or, when `residual`, the
  // residual checkpoints. Used for streamed and rebuilt pages and for preempted sequences' pages;
  // *page_id names the layer pages for ReadLayerPages and EraseTierPage.
  bool WriteLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t* page_id);
  Status ReadLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t page_id);
  void EraseTierPage(KvTier* tier, uint64_t page_id);

  // Attention mass is only gathered when some policy reads it (it costs a pass over the
  // attention weights of each sequence's newest token per layer).
  void set_track_attention(bool on) { track_attention_ = on; }
  // Needed before any kRecomputeResidual page: what rebuilds a layer's K and V.
  void set_rebuilder(LayerRebuilder rebuild) { rebuild_ = std::move(rebuild); }

  KvPagerStats stats() const;
  const CompressedSlabs& slabs() const { return slabs_; }
  int64_t layer_page_bytes() const { return layer_bytes_; }

 private:
  enum class Fate : uint8_t { kResident, kCompressed, kStreamed, kRebuilt, kEvicted };
  struct Page {
    Fate fate = Fate::kResident;
    KvCodecType codec = KvCodecType::kInt8;
    std::vector<SlabSlot> slots;  // kCompressed: one per layer
    KvTier* tier = nullptr;       // kStreamed (K/V layer pages), kRebuilt (checkpoints)
    uint64_t page_id = 0;
    int64_t stage_index = -1;     // its place in this step's stream buffers
    bool read_failed = false;     // this step
  };
  struct SeqPages {
    std::vector<Page> pages;   // by block index
    std::vector<float> mass;   // by position
    int64_t steps = 0;
    std::vector<int64_t> filled_at_step;  // by block index: steps when the page was first seen
  };
  // A page read into this step's stream buffers (streamed K/V, or checkpoints to rebuild from).
  struct StagedPage {
    SeqId seq;
    int64_t block_index;
  };

  static PageKey KeyOf(uint64_t page_id, int64_t layer) {
    return (page_id << 8) | static_cast<uint64_t>(layer);
  }
  void ReleasePage(Page& page);
  Page& PageOf(const StagedPage& st);
  void IssueLayerRead(int64_t layer);
  uint8_t* StageData(int64_t layer, int64_t stage_index);
  const float* WidenedLayer(const uint8_t* rows, DType type, int which);

  KvManager& manager_;
  KvBlockStorage& storage_;
  KvBlockLayout layout_;
  int64_t max_context_;
  int64_t layer_bytes_;      // one layer page: K rows then V rows
  int64_t checkpoint_layer_bytes_;  // one layer of a page's residual checkpoints
  CompressedSlabs slabs_;
  std::vector<SeqPages> seqs_;  // [max_seqs]
  uint64_t next_page_id_ = 1;
  bool track_attention_ = false;
  std::vector<uint8_t> encode_scratch_;
  std::vector<uint8_t> page_scratch_;  // a whole page's layer pages, staged for one tier transfer
  std::vector<float> widen_scratch_[2];

  // This step's streamed pages and their double-buffered layer staging; rebuilt pages, their
  // double-buffered checkpoints and the K / V rows rebuilt from them for the current layer.
  std::vector<StagedPage> streamed_;
  std::vector<uint8_t> stage_[2];
  std::vector<StagedPage> rebuilt_;
  std::vector<uint8_t> checkpoint_stage_[2];
  std::vector<int64_t> rebuilt_positions_;
  std::vector<uint8_t> rebuilt_k_;
  std::vector<uint8_t> rebuilt_v_;
  LayerRebuilder rebuild_;
  struct PendingRead {
    std::future<std::vector<Status>> result;
    bool checkpoints = false;            // rebuilt_ pages' checkpoints, else streamed_ K/V
    std::vector<int64_t> stage_indices;  // one per page read, in order
  };
  std::vector<PendingRead> pending_[2];  // by buffer: one read per tier
  int64_t pending_layer_[2] = {-1, -1};
  std::vector<SeqId> failed_;

  KvPagerStats stats_;
};

}  // namespace kvl
