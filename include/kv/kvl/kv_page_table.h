// The page table: where every KV page of a sequence is (its fate) and what it keeps there for as
// long as it stays (slab slots, a tier and the key it is filed under, the action and price that
// put it there). One of the pager's parts (KvPager owns it and makes every change of fate): it
// moves nothing itself, it remembers.
//
// The record of a sequence's pages (KvSequencePages) is owned by the request, so it outlives a
// preemption; the table binds it to a pool slot while the sequence is admitted. Nothing in a page
// record lasts only one step: what a step stages for attention (its place in the stream buffers,
// a read that failed) is the layer streamer's (src/kv/lattice/kv_layer_streamer.h).
//
// Thread-safety: owned by the step loop; the forward's threads read it between BeginLayer calls.
#pragma once

#include <cstdint>
#include <vector>

#include "kvl/compressed_slabs.h"
#include "kvl/kv_codec.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"

namespace kvl {

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

// One page's lasting state: every field holds from the change of fate that set it to the next.
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
  // Promoted from K/V alone: the block's residual checkpoints were not restored, so the page
  // cannot be kept as checkpoints later. Survives every fate change.
  bool checkpoint_missing = false;
  // kInTier / kCheckpointed, outside the sequence's KV until it is promoted into a fresh block:
  // kept at a preemption, or found in the KV store at admission. Attention never reads it.
  bool awaiting_restore = false;
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

// Pages of running sequences held outside their pool blocks, by fate. A page awaiting restore is
// not counted: it is not part of its sequence's KV until it comes back.
struct KvHeldPages {
  int64_t compressed = 0;
  int64_t streamed = 0;  // in a tier
  int64_t in_place = 0;  // of those, read where they lie (no staging)
  int64_t rebuilt = 0;   // as checkpoints in the RAM tier
  int64_t evicted = 0;   // as holes
};

class KvPageTable {
 public:
  KvPageTable(const KvManager& manager, int32_t max_seqs);

  int32_t max_seqs() const { return static_cast<int32_t>(bound_.size()); }
  // A sequence's record bound to slot `seq` (admission), moved to another record (a session a new
  // request continues), and unbound (it left the pool).
  void Bind(SeqId seq, KvSequencePages* pages);
  void Rebind(SeqId seq, KvSequencePages* pages);
  void Unbind(SeqId seq);
  KvSequencePages& Bound(SeqId seq);
  const KvSequencePages& Bound(SeqId seq) const;
  // Page `block_index` of `seq`, the record grown to hold it (a page past the record is resident).
  KvPage& At(SeqId seq, int64_t block_index);
  // A page the record holds already.
  KvPage& Existing(SeqId seq, int64_t block_index) {
    return Bound(seq).pages[static_cast<size_t>(block_index)];
  }
  const KvPage& Existing(SeqId seq, int64_t block_index) const {
    return Bound(seq).pages[static_cast<size_t>(block_index)];
  }

  KvPageFate FateOf(SeqId seq, int64_t block_index) const;
  // The page was promoted from K/V alone (no checkpoints), or its block was, by whichever
  // sequence first held it (a block shared through the prefix cache).
  bool CheckpointMissing(SeqId seq, int64_t block_index) const;

  // The counts follow each change of fate: Hold once a page's fate outside the pool is set,
  // Unhold before it is let go.
  void Hold(const KvPage& page) { Count(page, +1); }
  void Unhold(const KvPage& page) { Count(page, -1); }
  const KvHeldPages& held() const { return held_; }

  // Back in its pool block: every field but checkpoint_missing, which outlives every fate. The
  // slots keep their capacity for the page's next compression.
  static void MakeResident(KvPage& page);

 private:
  void Count(const KvPage& page, int64_t delta);

  const KvManager& manager_;
  std::vector<KvSequencePages*> bound_;  // [max_seqs]: the record of each admitted slot
  KvHeldPages held_;
};

}  // namespace kvl
