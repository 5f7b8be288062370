// Where every KV page of a sequence is, and the only code that moves it: the applying half of the
// action lattice (KvPressurePlanner decides, KvPager applies).
//
// One page-fate table per sequence (KvSequencePages) covers its whole life. While the sequence
// runs, a full page other than the newest can leave the pool and still be read by attention:
//   - compressed in place (int8 / int4 slabs inside the pool; attention reads them directly),
//   - kept in a tier (RAM, disk or Redis) and streamed back layer by layer for every step that reads
//     it, each layer prefetched while the previous one computes (or read where an uncompressed
//     RAM tier holds it),
//   - kept as residual checkpoints in the RAM tier, from which every step that reads the page
//     rebuilds its K and V inside the step's own forward run (extra rows of each layer's K and V
//     projections: KvLayerRebuild, bit-identical); with checkpoints every s > 1 layers
//     (KvBlockLayout::checkpoint_every) the layers between two checkpoints get their inputs by
//     running the layer before for the page's tokens as extra rows of the step's batch, over the
//     K/V of that layer the step has in place (so those
//     layers depend on the earlier pages: bit-identical while they are lossless; under a lossy
//     action on an earlier page they carry its error, as anything computed after it does),
//   - evicted (attention gives its tokens no weight).
// The lossless ones (a tier, checkpoints) come back into the pool while the sequence runs once
// the pool has blocks to spare again (PromoteBack, planned by KvPressurePlanner::PlanPromotion
// between steps): from then on attention reads them from the pool, as before they left.
// Compressed and evicted pages never do (their exact bytes are gone).
// When the sequence is preempted its pool blocks go; each full page is kept in a tier, kept as
// checkpoints, or dropped to be recomputed from its tokens, and at resume the kept ones are
// promoted (or rebuilt) into fresh blocks. The table is owned by the request, so it outlives the
// preemption; the pager binds it to a pool slot while the sequence is admitted.
//
// The KvManager only sees a hole in the block table (Detach); the pager hands attention the rows
// of pages that left the pool (KvDetachedPages).
//
// The pager decides no fate (KvPressurePlanner does, asked by KvMemory: Relieve, Preempt,
// Promote) and carries out every planned change of one. The one fate set
// outside it: KvMemory marks a prompt's pages it found in the KV store as in a tier at admission,
// to be restored. The work is split by job among the parts it owns and wires:
//   - the page table (kvl/kv_page_table.h): each page's fate and lasting state, bound per slot;
//   - the tier mover (src/kv/lattice/kv_tier_mover.h): whole pages between their blocks and the tiers,
//     and write-through to the KV store;
//   - the layer streamer (src/kv/lattice/kv_layer_streamer.h): a step's staging and prefetch of pages
//     outside the pool, layer by layer, and the rebuilds from checkpoints;
//   - the access tracker (kvl/kv_access_tracker.h): the attention mass each position got, which
//     the planner reads as a page's heat.
// Compression (the slabs and the codec's scratch) it does itself.
//
// Thread-safety: owned by the step loop. RowsAt and AttentionMass are called from the forward's
// threads between BeginLayer calls, reading only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvl/compressed_slabs.h"
#include "kvl/kv_access_tracker.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_page_table.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"

namespace kvl {

// The key a page's bring-back time is corrected and checked under (BringBackFeedback): the
// action that put it where it is (a KV store page found in RAM or on disk counts as demoted
// there: the same read at the same price), except a page of a remote tier (Redis), demoted there
// or found there, which has kRemoteTierFeedbackKey (kvl/kv_policy.h).
// The last key: rebuilds inside decode steps (kvl/kv_policy.h).
static_assert(kInStepRebuildFeedbackKey == kRemoteTierFeedbackKey + 1);
inline constexpr size_t kNumFeedbackKeys = kInStepRebuildFeedbackKey + 1;
size_t FeedbackKey(KvAction action, const KvTier* tier);

// One decision of the planner for one page.
struct KvPageAction {
  SeqId seq = 0;
  int64_t block_index = 0;
  KvAction action = KvAction::kKeep;
  double predicted_ms = 0;  // bring-back time the cost model expects
  double model_ms = 0;      // the profile's alone, before the measured correction
  bool applied = false;     // set by KvPager when it was carried out
  bool failed = false;      // set by KvPager when it was tried and could not be (a full tier)
  double measured_ms = 0;   // set by KvPager::PromoteBack: the time an applied one took
  int64_t request = -1;     // the request the page belongs to (set by KvMemory's plans)
};

// Why a page plan was made, which says how KvMemory::Apply carries it out.
enum class KvPagePlanKind : uint8_t {
  kRelief,              // running sequences' pages leave the pool (KvPager::Apply)
  kCompressedEviction,  // relief's last resort: compressed pages evicted (KvPager::Apply)
  kPreemption,          // every full page of one sequence saved or dropped (KvPager::Preempt)
  kPromotion,           // pages of running sequences come back (KvPager::PromoteBack)
};

// Page actions planned against one state of the KvManager; applying them is the only way a page
// changes fate, and a plan made against an older state is refused (as KvManager::Commit does).
struct KvPagePlan {
  KvPagePlanKind kind = KvPagePlanKind::kRelief;
  SeqId preempted = -1;               // kPreemption: the sequence that leaves the pool
  std::vector<KvPageAction> actions;  // applied in order
  // Applying stops once this many blocks went back to the pool (0: apply every action). The
  // planner cannot know exactly what a page frees (a compressed page may open a slab first).
  int64_t blocks_to_free = 0;
  uint64_t state_version = 0;         // KvManager::state_version() when planned
};

// Bytes the pager holds outside the pool, which the KV budget must cover beside it: per page
// staged for a step (a streamed page's K/V layer, double-buffered; a rebuilt page's checkpoint
// layer, double-buffered, and the K/V rebuilt from it), and fixed (a compressed page being
// encoded, half rows widened for the codec). Tier transfers of whole pages need no staging: they
// move each layer straight between the block and the tier.
struct KvStagingCost {
  int64_t per_page = 0;
  int64_t fixed = 0;
  // With checkpoints every s > 1 layers: the residual a page being restored carries from one
  // layer to the next (one checkpoint layer), whenever pages may be kept as checkpoints.
  int64_t restore = 0;
};

struct KvPagerStats {
  int64_t compressed_pages = 0;      // held now
  int64_t streamed_pages = 0;        // held now, in a tier
  int64_t in_place_pages = 0;        // of those, read where they lie (no staging)
  int64_t rebuilt_pages = 0;         // held now as checkpoints in the RAM tier
  int64_t layers_rebuilt = 0;        // page layers rebuilt from checkpoints for attention, total
  // Of the work above, page layers run whole (attention, FFN) to get the input of a layer that
  // has no checkpoint (checkpoints every s > 1 layers), total.
  int64_t layers_advanced = 0;
  double rebuild_ms = 0;             // time spent rebuilding them, total
  int64_t evicted_pages = 0;         // held now (as holes)
  // Pages of running sequences brought back into the pool from a tier or from checkpoints once
  // blocks were free again (PromoteBack), total.
  int64_t promoted_back_pages = 0;
  int64_t compressed_bytes = 0;      // slab slots in use
  int64_t slab_blocks = 0;
  int64_t staging_bytes = 0;         // every buffer outside the pool (reserved up front)
  int64_t staging_capacity_pages = 0;  // pages that can be streamed or rebuilt at once
  int64_t layers_streamed = 0;       // layer pages read for attention, total
  double stream_wait_ms = 0;         // time BeginLayer waited for a prefetch, total
  int64_t stream_read_failures = 0;  // layer reads that failed their checksum or I/O
};

// The parts that do the work (src/kv, private to the kv layer).
class KvLayerStreamer;
class KvTierMover;

class KvPager final : public KvDetachedPages {
 public:
  KvPager(KvManager& manager, KvBlockStorage& storage, int32_t max_seqs, int64_t max_context);
  ~KvPager() override;

  static KvStagingCost StagingCost(const KvBlockLayout& layout);
  // Allocates every buffer outside the pool now, for up to `max_staged_pages` pages streamed or
  // rebuilt at once (0: none; only preemption and compression then). The budget has to hold
  // them: KvMemory::Create takes them out of it before it sizes the pool, and nothing grows later.
  // `compresses`: room to encode a page (int8/int4) and widen half rows for the codec, needed
  // only where pages may be compressed.
  void ReserveStaging(int64_t max_staged_pages, bool compresses);
  int64_t staging_capacity_pages() const;
  // Pages of running sequences held in a tier or as checkpoints that are staged at every step
  // (pages read in place are not).
  int64_t staged_pages_held() const {
    const KvHeldPages& held = table_.held();
    return held.streamed - held.in_place + held.rebuilt;
  }

  // Where demoted pages and checkpoints go; the rebuilder is needed before any page is kept as
  // checkpoints. Set once, before the first step.
  void set_tiers(KvTiers tiers);
  // The KV store: a demoted page with a content id is filed there (shared, kept after the
  // sequence ends) instead of under a private key. nullptr: none.
  void set_store(KvStore* store);
  // The rebuilder rebuilds pages restored or promoted back between steps (inside a step the
  // forward pass rebuilds what BeginLayer hands it). `cache`: the forward pass's view of this
  // pool (PagedKvCache over it and this pager), which the layers between checkpoints attend
  // over; needed where checkpoint_every > 1.
  void set_rebuilder(KvRebuilder* rebuilder, KvCache* cache = nullptr);
  // Attention mass is only gathered when some policy reads it (it costs a pass over the
  // attention weights of each sequence's newest token per layer).
  void set_track_attention(bool on) { access_.set_enabled(on); }
  // The tier an action keeps a page in (demote: its tier; recompute-residual: RAM, for the
  // checkpoints); nullptr for actions that keep nothing in a tier.
  KvTier* TierFor(KvAction action) const;

  // A sequence enters the pool (admission) with its page table (empty for a new request, the
  // preempted fates for a resumed one); its attention history starts empty.
  void StartSequence(SeqId seq, KvSequencePages* pages);
  // The sequence in `seq`'s slot goes on as another request (a lossy session a new turn
  // continues): its page table, moved to `pages`, stays bound to the slot.
  void Rebind(SeqId seq, KvSequencePages* pages) { table_.Rebind(seq, pages); }
  // A sequence leaves for good (finished, cancelled): every page it holds outside the pool is
  // freed (slab slots, tier pages) and the slot unbound.
  void DropSequence(SeqId seq);
  // The sequence was cut back to its first `num_blocks` blocks (KvManager::Truncate): the pages
  // after them are freed, and the attention its later positions got is forgotten.
  void Truncate(SeqId seq, int64_t num_blocks);

  // Running sequences: applies the plan's actions in order (compress, demote/stream,
  // recompute-residual, evict on resident pages; evict on compressed ones) until
  // plan.blocks_to_free blocks are free, and marks each one applied or not (a full tier, no block
  // for a slab). Returns how many were applied.
  int64_t Apply(KvPagePlan& plan);

  // Preemption: the plan has one action per full page of `seq` (demote, recompute-residual,
  // recompute-tokens); the pages are saved before the pool lets the blocks go, a page that cannot
  // be saved is dropped (applied = false), pages held outside the pool while it ran are freed, and
  // the slot is unbound. The caller frees the sequence in the KvManager next.
  void Preempt(SeqId seq, KvPagePlan& plan);
  // Resume, after the admission's blocks are committed: promotes (or rebuilds from checkpoints)
  // pages [first_block, first_block + num_blocks) into their fresh blocks, in order, stopping at
  // the first read that fails (never wrong bytes: the rest is recomputed), and, with checkpoints
  // every s > 1 layers, at the first checkpointed page with an earlier page out of the pool (its
  // layers between checkpoints attend to it). Returns the pages restored. `page_ms` (may be
  // null) gets each restored page's own time, in order: the read and any rebuild, timed page by
  // page, so that pages of different tiers in one restore are checked each at its own price.
  int64_t RestorePages(SeqId seq, int64_t first_block, int64_t num_blocks,
                       std::vector<double>* page_ms = nullptr);
  // Running sequences, between steps, where the pool has blocks to spare (the planner's
  // PlanPromotion): each action's page, held in a tier (streamed or read in place) or as
  // checkpoints, comes back into a fresh block (KvManager::Reattach, after SpillFreeBlock): its
  // K/V read from the tier or rebuilt from its checkpoints, checksums verified, as a resume's
  // restore does; then it is let go from its tier and resident again. A read that fails leaves
  // the page where it was and gives the block back to the pool (never wrong bytes); a checkpointed
  // page whose rebuild needs an earlier page still out of the pool (checkpoints every s > 1
  // layers) stays too. Stops when no block is free. Marks each action applied, or failed where
  // its read failed, and times each applied one (KvPageAction::measured_ms); returns the pages
  // brought back.
  int64_t PromoteBack(KvPagePlan& plan);
  // Admission, after the commit: pages [first_block, first_block + num_blocks) awaiting restore in
  // a tier that attention reads in place, or (a prompt the pool cannot hold) on a disk tier, stay
  // where they are, as the sequence's pages held in that tier, read in place or streamed (the
  // block table has holes there: KvSeqStep::in_place_blocks).
  void ReadInPlace(SeqId seq, int64_t first_block, int64_t num_blocks);
  // After a restore: pages awaiting restore whose blocks are now in the pool (restored, or
  // computed because the restore stopped or the prefix cache held them) are let go from their
  // tier and resident again, and so are pages dropped at a preemption that have their block again
  // (recomputed by this step). Pages past the sequence's blocks keep waiting for a later chunk.
  void SettleRestoredPages(SeqId seq);
  // Saves every full page of `seq` with a content id into the store's `tier` (write-through to
  // a durable tier when a request ends): pages in the pool, and pages read in place from another
  // tier. Returns the pages written.
  int64_t SaveToStore(SeqId seq, KvTier* tier);
  // Pages [first_block, last_block) of `seq` just filled, in the pool but out of the prefix
  // index's reach (an earlier page of the chain is in a tier): copied to the store's fastest tier
  // now, so that the next lookup of this prefix finds the whole chain in the store.
  void SaveUnreachablePages(SeqId seq, int64_t first_block, int64_t last_block);
  // A free block about to be reused for new contents: its page goes to the store's fastest tier
  // first when it has a content id (the pool's evictions feed the store, coldest first).
  void SpillFreeBlock(BlockId block);
  // A pool block holding page `content` (KvManager::FindContent) copied to the store's fastest
  // tier, so that a lookup walking the chain through the tiers finds it there.
  void SaveBlockToStore(BlockId block, KvContentId content);
  // A preempted sequence that finishes while waiting (cancelled): its kept pages are erased.
  void ForgetPreemptedPages(KvSequencePages& pages);

  // Around each forward run: the sequences in the batch (their streamed pages are fetched layer
  // by layer), then after the run, sequences whose streamed reads failed this step (their step's
  // output must be discarded and their KV recomputed). The returned span lives until the next
  // BeginStep.
  void BeginStep(std::span<const SeqId> seqs);
  std::span<const SeqId> EndStep();
  // The sequence of each page the last forward run rebuilt from checkpoints inside it (one entry
  // per page), until the next BeginStep.
  std::span<const SeqId> RebuiltInStep() const;

  // KvDetachedPages.
  KvCache::Rows RowsAt(int32_t seq, int64_t block_index, int64_t layer, int64_t offset) override;
  KvLayerRebuild BeginLayer(int64_t layer) override;
  float* AttentionMass(int32_t seq) override;

  // The page table bound to a slot.
  const KvSequencePages& pages(SeqId seq) const { return table_.Bound(seq); }
  KvPageFate FateOf(SeqId seq, int64_t block_index) const { return table_.FateOf(seq, block_index); }
  bool CheckpointMissing(SeqId seq, int64_t block_index) const {
    return table_.CheckpointMissing(seq, block_index);
  }
  // Mass the page's tokens received per step since it was filled (mean over steps), in [0, 1].
  double PageMass(SeqId seq, int64_t block_index) const {
    return access_.PageMass(table_.Bound(seq), block_index);
  }
  // Steps the sequence has run (attention rows accumulated).
  int64_t steps(SeqId seq) const { return table_.Bound(seq).steps; }
  // Steps since attention last read the page with weight (KvPageAccess), and how many steps did.
  int64_t StepsSinceRead(SeqId seq, int64_t block_index) const {
    return KvAccessTracker::StepsSinceRead(table_.Bound(seq), block_index);
  }
  int64_t PageReads(SeqId seq, int64_t block_index) const {
    return KvAccessTracker::PageReads(table_.Bound(seq), block_index);
  }

  KvPagerStats stats() const;
  // Why the last page that could not be saved to a tier was refused (OK when none was): a full
  // tier, or the OS's error (no space, permission).
  const Status& last_tier_error() const;
  const CompressedSlabs& slabs() const { return slabs_; }
  int64_t layer_page_bytes() const {
    return storage_.layout().layer_k_bytes() + storage_.layout().layer_v_bytes();
  }

 private:
  // Page `block_index` of `seq`, resident and this sequence's alone, leaves the pool by `action`.
  bool DetachPage(SeqId seq, int64_t block_index, KvAction action);
  bool CompressPage(SeqId seq, int64_t block_index, BlockId block, KvAction action, KvPage& page);
  bool EvictCompressedPage(SeqId seq, int64_t block_index);
  // Frees what the page holds outside the pool; the page becomes resident (flags kept).
  void ReleasePage(KvPage& page);
  // Page `block_index` of `seq`, held in a tier or as checkpoints, into `block` (in its table):
  // its K/V read, or its checkpoints read and K/V rebuilt from them. Where only K/V came back the
  // block's checkpoints are stale, and marked so.
  enum class BringBack { kDone, kReadFailed, kNeedsEarlierPages };
  BringBack BringIntoBlock(SeqId seq, int64_t block_index, BlockId block, KvPage& page);
  const float* WidenedLayer(const uint8_t* rows, DType type, int which);

  KvManager& manager_;
  KvBlockStorage& storage_;
  KvBlockLayout layout_;
  int64_t max_context_;
  CompressedSlabs slabs_;
  KvPageTable table_;
  KvAccessTracker access_;  // attention mass and access history
  std::unique_ptr<KvTierMover> mover_;
  std::unique_ptr<KvLayerStreamer> streamer_;
  // The codec's scratch: one page encoded before its block goes, half rows widened to f32.
  std::vector<uint8_t> encode_scratch_;
  std::vector<float> widen_scratch_[2];
  int64_t promoted_back_pages_ = 0;
  int64_t promote_read_failures_ = 0;
};

}  // namespace kvl
