// Where every KV page of a sequence is, and the only code that moves it: the applying half of the
// action lattice (KvPressurePlanner decides, KvPager applies).
//
// One page-fate table per sequence (KvSequencePages) covers its whole life. While the sequence
// runs, a full page other than the newest can leave the pool and still be read by attention:
//   - compressed in place (int8 / int4 slabs inside the pool; attention reads them directly),
//   - kept in a tier (RAM or disk) and streamed back layer by layer for every step that reads
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
// of pages that left the pool (KvDetachedPages), and its access tracker (kvl/kv_access_tracker.h)
// keeps the attention mass each position got, which the planner reads as a page's heat.
//
// Tier pages are one layer each (K rows then V rows at the cache's element type, or one layer of
// checkpoints), so a step can fetch exactly the layer it is about to read.
//
// Thread-safety: owned by the step loop. RowsAt and AttentionMass are called from the forward's
// threads between BeginLayer calls, reading only.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <span>
#include <vector>

#include "kvl/compressed_slabs.h"
#include "kvl/kv_access_tracker.h"
#include "kvl/kv_codec.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"

namespace kvl {

// The key a page's bring-back time is corrected and checked under (BringBackFeedback): the
// action that put it where it is (a KV store page found in RAM or on disk counts as demoted
// there: the same read at the same price), except a page of a remote tier (Redis), which no
// action of the policy demotes to and which has a key of its own.
inline constexpr size_t kRemoteTierFeedbackKey = kNumKvActions;
inline constexpr size_t kNumFeedbackKeys = kNumKvActions + 1;
size_t FeedbackKey(KvAction action, const KvTier* tier);

// Where one page is.
enum class KvPageFate : uint8_t {
  kResident,      // in its pool block
  kCompressed,    // int8 / int4 slab slots inside the pool (running sequences)
  kInTier,        // K/V layer pages in a tier: streamed while running (or promoted back into the
                  // pool once it has room: PromoteBack), promoted at resume
  kCheckpointed,  // residual checkpoints in the RAM tier: rebuilt while running (or promoted
                  // back), and at resume
  kEvicted,       // gone; attention skips its tokens (running sequences)
  kDropped,       // gone with a preemption; recomputed from its tokens at resume (lossless)
};

struct KvPage {
  KvPageFate fate = KvPageFate::kResident;
  KvAction action = KvAction::kKeep;  // the action that put the page where it is
  double predicted_ms = 0;            // the cost model's bring-back time for that action
  double model_ms = 0;                // the same before the measured correction (BringBackFeedback)
  KvCodecType codec = KvCodecType::kInt8;
  std::vector<SlabSlot> slots;        // kCompressed: one per layer
  KvTier* tier = nullptr;             // kInTier, kCheckpointed
  uint64_t page_id = 0;               // names its layer pages in the tier
  // kInTier: the page is the KV store's, filed under its content id (KvStore::LayerKey), and
  // stays cached there when the sequence lets it go; {}: the pager's own, keyed by page_id and
  // erased when let go.
  KvContentId content;
  bool store_pin = false;             // this page holds a pin on its store page (KvStore::Save)
  bool in_place = false;              // kInTier in a tier attention reads in place (no staging)
  const uint8_t* in_place_rows = nullptr;  // this layer's K/V rows in that tier, this step
  // Promoted from K/V alone: the block's residual checkpoints were not restored, so the page
  // cannot be kept as checkpoints later. Survives every fate change.
  bool checkpoint_missing = false;
  // kInTier / kCheckpointed, outside the sequence's KV until it is promoted into a fresh block:
  // kept at a preemption, or found in the KV store at admission. Attention never reads it.
  bool awaiting_restore = false;
  int64_t stage_index = -1;           // its place in this step's stream buffers
  bool read_failed = false;           // this step's streamed read failed its checksum or I/O
};

// One page's access history, from the attention mass its tokens receive: a step "reads" a page
// when the page gains at least half of a uniform share of that step's attention (block_tokens /
// tokens of the whole mass); a page rarely read is cold even though every step attends over it.
struct KvPageAccess {
  int64_t last_read_step = 0;  // the step it was last read at (or filled at)
  int64_t reads = 0;           // steps that read it
  double mass_seen = 0;        // its tokens' accumulated mass when last looked at
};

// One sequence's pages by block index, and the attention it gave each position.
struct KvSequencePages {
  std::vector<KvPage> pages;
  std::vector<float> mass;              // [max_context]: attention mass per position
  int64_t steps = 0;                    // steps run since admission
  std::vector<int64_t> filled_at_step;  // by block index: the step a full page was first seen
  // By block index: when attention last read the page with weight (KvPager::StepsSinceRead).
  std::vector<KvPageAccess> access;
};

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

// The tiers pages can go to (either may be absent).
struct KvTiers {
  KvTier* ram = nullptr;
  KvTier* disk = nullptr;
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

class KvPager final : public KvDetachedPages {
 public:
  KvPager(KvManager& manager, KvBlockStorage& storage, int32_t max_seqs, int64_t max_context);
  ~KvPager() override;

  static KvStagingCost StagingCost(const KvBlockLayout& layout);
  // Allocates every buffer outside the pool now, for up to `max_staged_pages` pages streamed or
  // rebuilt at once (0: none; only preemption and compression then). The budget has to hold
  // them: the engine takes them out of it before it sizes the pool, and nothing grows later.
  // `compresses`: room to encode a page (int8/int4) and widen half rows for the codec, needed
  // only where pages may be compressed.
  void ReserveStaging(int64_t max_staged_pages, bool compresses);
  int64_t staging_capacity_pages() const { return staging_capacity_pages_; }
  // Pages of running sequences held in a tier or as checkpoints that are staged at every step
  // (pages read in place are not).
  int64_t staged_pages_held() const {
    return stats_.streamed_pages - stats_.in_place_pages + stats_.rebuilt_pages;
  }

  // Where demoted pages and checkpoints go; the rebuilder is needed before any page is kept as
  // checkpoints. Set once, before the first step.
  void set_tiers(KvTiers tiers) { tiers_ = tiers; }
  // The KV store: a demoted page with a content id is filed there (shared, kept after the
  // sequence ends) instead of under a private key. nullptr: none.
  void set_store(KvStore* store) { store_ = store; }
  // The rebuilder rebuilds pages restored or promoted back between steps (inside a step the
  // forward pass rebuilds what BeginLayer hands it). `cache`: the forward pass's view of this
  // pool (PagedKvCache over it and this pager), which the layers between checkpoints attend
  // over; needed where checkpoint_every > 1.
  void set_rebuilder(KvRebuilder* rebuilder, KvCache* cache = nullptr) {
    rebuilder_ = rebuilder;
    cache_ = cache;
  }
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
  void Rebind(SeqId seq, KvSequencePages* pages);
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

  // KvDetachedPages.
  KvCache::Rows RowsAt(int32_t seq, int64_t block_index, int64_t layer, int64_t offset) override;
  KvLayerRebuild BeginLayer(int64_t layer) override;
  float* AttentionMass(int32_t seq) override;

  // The page table bound to a slot.
  const KvSequencePages& pages(SeqId seq) const;
  KvPageFate FateOf(SeqId seq, int64_t block_index) const;
  bool CheckpointMissing(SeqId seq, int64_t block_index) const;
  // Mass the page's tokens received per step since it was filled (mean over steps), in [0, 1].
  double PageMass(SeqId seq, int64_t block_index) const;
  // Steps the sequence has run (attention rows accumulated).
  int64_t steps(SeqId seq) const;
  // Steps since attention last read the page with weight (KvPageAccess), and how many steps did.
  int64_t StepsSinceRead(SeqId seq, int64_t block_index) const;
  int64_t PageReads(SeqId seq, int64_t block_index) const;

  KvPagerStats stats() const;
  // Why the last page that could not be saved to a tier was refused (OK when none was): a full
  // tier, or the OS's error (no space, permission).
  const Status& last_tier_error() const { return last_tier_error_; }
  const CompressedSlabs& slabs() const { return slabs_; }
  int64_t layer_page_bytes() const { return layer_bytes_; }

 private:
  // A page read into this step's stream buffers (streamed K/V, or checkpoints to rebuild from).
  struct StagedPage {
    SeqId seq;
    int64_t block_index;
  };

  static double MillisecondsSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  }
  static PageKey KeyOf(uint64_t page_id, int64_t layer) {
    return (page_id << 8) | static_cast<uint64_t>(layer);
  }
  // The tier key of one layer of a page held in a tier (the store's, or the pager's own).
  static PageKey LayerKeyOf(const KvPage& page, int64_t layer) {
    return page.content.valid() ? KvStore::LayerKey(page.content, layer)
                                : KeyOf(page.page_id, layer);
  }
  // Keeps a running or preempted page in `tier`: in the store when it has a content id and the
  // store covers the tier, else under a fresh private page id. Fills the page's tier fields.
  bool KeepInTier(SeqId seq, int64_t block_index, BlockId block, KvTier* tier, bool residual,
                  KvPage* page);
  KvSequencePages& Bound(SeqId seq);
  const KvSequencePages& Bound(SeqId seq) const;
  KvPage& PageAt(KvSequencePages& s, int64_t block_index);
  bool DetachPage(SeqId seq, int64_t block_index, KvAction action);
  bool EvictCompressedPage(SeqId seq, int64_t block_index);
  // Frees what the page holds outside the pool; the page becomes resident (flags kept).
  void ReleasePage(KvPage& page);
  static void MakeResident(KvPage& page);
  // A whole page saved in a tier as one tier page per layer: K/V rows or, when `residual`, the
  // residual checkpoints; *page_id names the layer pages for ReadLayerPages and EraseTierPage.
  bool WriteLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t* page_id);
  std::span<uint8_t> LayerPageSpan(BlockId block, int64_t layer, bool residual);
  Status ReadLayerPages(BlockId block, const KvPage& page, bool residual);
  // `residual`: the page's checkpoint layers (only those are in the tier), else every layer.
  void EraseTierPage(KvTier* tier, uint64_t page_id, bool residual);
  // Lets go of a page held in a tier: the pager's own pages are erased, the store's stay cached.
  void LetGoTierPage(const KvPage& page);
  // False (nothing rebuilt) where the layers between checkpoints cannot be run: an earlier page
  // of the sequence is out of the pool.
  bool RebuildBlockFromCheckpoints(SeqId seq, BlockId block, int64_t block_index);
  // Page `block_index` of `seq`, held in a tier or as checkpoints, into `block` (in its table):
  // its K/V read, or its checkpoints read and K/V rebuilt from them. Where only K/V came back the
  // block's checkpoints are stale, and marked so.
  enum class BringBack { kDone, kReadFailed, kNeedsEarlierPages };
  BringBack BringIntoBlock(SeqId seq, int64_t block_index, BlockId block, KvPage& page);
  // This step's rebuild work at one layer (staged checkpoints in `buffer`), for the forward pass.
  KvLayerRebuild RebuildOfLayer(int64_t layer, int buffer);
  // Layers of a page in its tier pages: every layer, or the checkpoint layers (`residual`).
  bool InTierPage(int64_t layer, bool residual) const {
    return !residual || layout_.is_checkpoint_layer(layer);
  }
  KvPage& PageOf(const StagedPage& st);
  void IssueLayerRead(int64_t layer);
  uint8_t* StageData(int64_t layer, int64_t stage_index);
  const float* WidenedLayer(const uint8_t* rows, DType type, int which);

  KvManager& manager_;
  KvBlockStorage& storage_;
  KvBlockLayout layout_;
  int64_t max_context_;
  int64_t layer_bytes_;             // one layer page: K rows then V rows
  int64_t checkpoint_layer_bytes_;  // one layer of a page's residual checkpoints
  CompressedSlabs slabs_;
  KvTiers tiers_;
  KvRebuilder* rebuilder_ = nullptr;
  KvCache* cache_ = nullptr;  // what a restore's layers between checkpoints attend over
  KvStore* store_ = nullptr;
  std::vector<KvSequencePages*> bound_;  // [max_seqs]: the page table of each admitted slot
  uint64_t next_page_id_ = 1;
  int64_t staging_capacity_pages_ = 0;
  KvAccessTracker access_;  // attention mass and access history (kvl/kv_access_tracker.h)
  std::vector<uint8_t> encode_scratch_;
  std::vector<float> widen_scratch_[2];
  std::vector<PageWrite> write_list_;  // one tier transfer's layer pages, reused
  std::vector<PageRead> read_list_;
  std::vector<PageKey> erase_list_;
  std::vector<int64_t> block_positions_;  // [block_tokens]: positions of a page being rebuilt
  std::vector<int32_t> block_seq_ids_;    // [block_tokens]: its sequence, per token

  // This step's streamed pages and their double-buffered layer staging; rebuilt pages, their
  // double-buffered checkpoints and the K / V rows rebuilt from them for the current layer.
  std::vector<StagedPage> streamed_;
  std::vector<StagedPage> in_place_;  // streamed pages read where the tier holds them
  std::vector<uint8_t> stage_[2];
  std::vector<StagedPage> rebuilt_;
  std::vector<uint8_t> checkpoint_stage_[2];
  std::vector<int64_t> rebuilt_positions_;
  std::vector<int32_t> rebuilt_seq_ids_;  // [pages][block_tokens]
  std::vector<uint8_t> rebuilt_k_;
  std::vector<uint8_t> rebuilt_v_;
  struct PendingRead {
    std::future<std::vector<Status>> result;
    bool checkpoints = false;            // rebuilt_ pages' checkpoints, else streamed_ K/V
    std::vector<int64_t> stage_indices;  // one per page read, in order
  };
  std::vector<PendingRead> pending_[2];  // by buffer: one read per tier
  int64_t pending_layer_[2] = {-1, -1};
  std::vector<SeqId> failed_;

  KvPagerStats stats_;
  Status last_tier_error_;
};

}  // namespace kvl
