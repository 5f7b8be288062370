// KvPager: the changes of a page's fate (leaving the pool, preemption, release) and the wiring of
// its parts. Bringing pages back (restores, promotion back) is in kv_pager_promote.cc; the bytes
// moved to and from tiers in kv_tier_mover.cc; a step's staging in kv_layer_streamer.cc.
#include "kvl/kv_pager.h"

#include <algorithm>
#include <cstring>

#include "kv_layer_streamer.h"
#include "kv_tier_mover.h"
#include "kvl/ops.h"

namespace kvl {
namespace {

// Positions a sequence's attention mass is sized for at admission.
constexpr int64_t kInitialPositions = 4096;

}  // namespace

KvPager::KvPager(KvManager& manager, KvBlockStorage& storage, int32_t max_seqs,
                 int64_t max_context)
    : manager_(manager),
      storage_(storage),
      layout_(storage.layout()),
      max_context_(max_context),
      slabs_(manager, storage),
      table_(manager, max_seqs),
      access_(layout_.block_tokens, max_context),
      mover_(std::make_unique<KvTierMover>(manager, storage)),
      streamer_(std::make_unique<KvLayerStreamer>(manager, storage, table_, *mover_)) {
  ReserveStaging(0, /*compresses=*/false);
}

// The streamer (declared last) goes first: it waits for its reads in flight.
KvPager::~KvPager() = default;

KvStagingCost KvPager::StagingCost(const KvBlockLayout& layout) {
  const int64_t layer_bytes = layout.layer_k_bytes() + layout.layer_v_bytes();
  const int64_t checkpoint_layer_bytes =
      layout.block_tokens * layout.residual_dim * static_cast<int64_t>(sizeof(float));
  KvStagingCost cost;
  cost.per_page = 2 * layer_bytes;
  if (layout.residual_dim > 0) cost.per_page += 2 * checkpoint_layer_bytes + layer_bytes;
  if (layout.residual_dim > 0 && layout.checkpoint_every > 1) {
    // The residual carried between checkpoint layers, per page rebuilt at a step and for a
    // page being restored: the forward pass carries it in its activations now (the extra rows
    // of its run), still paid from the budget, since the pages' rebuild is what needs it.
    cost.per_page += checkpoint_layer_bytes;
    cost.restore = checkpoint_layer_bytes;
  }
  const int64_t rows = layout.block_tokens * layout.kv_dim;
  cost.fixed = CompressedPageBytes(KvCodecType::kInt8, layout.block_tokens, layout.num_layers,
                                   layout.kv_dim) +
               (layout.k_type == DType::kF32 && layout.v_type == DType::kF32
                    ? 0
                    : 2 * rows * static_cast<int64_t>(sizeof(float)));
  return cost;
}

void KvPager::ReserveStaging(int64_t max_staged_pages, bool compresses) {
  streamer_->Reserve(max_staged_pages);
  auto size = [](auto& v, size_t n) {
    v.resize(n);
    v.shrink_to_fit();
  };
  size(encode_scratch_, compresses ? static_cast<size_t>(CompressedPageBytes(
                                         KvCodecType::kInt8, layout_.block_tokens,
                                         layout_.num_layers, layout_.kv_dim))
                                   : 0);
  const bool half = compresses && (layout_.k_type != DType::kF32 || layout_.v_type != DType::kF32);
  for (std::vector<float>& w : widen_scratch_) {
    size(w, half ? static_cast<size_t>(layout_.block_tokens * layout_.kv_dim) : 0);
  }
}

int64_t KvPager::staging_capacity_pages() const { return streamer_->staging_capacity_pages(); }

void KvPager::set_tiers(KvTiers tiers) { mover_->set_tiers(tiers); }

void KvPager::set_store(KvStore* store) { mover_->set_store(store); }

void KvPager::set_rebuilder(KvRebuilder* rebuilder, KvCache* cache) {
  streamer_->set_rebuilder(rebuilder, cache);
}

KvTier* KvPager::TierFor(KvAction action) const { return mover_->TierFor(action); }

const Status& KvPager::last_tier_error() const { return mover_->last_tier_error(); }

// One layer's K or V rows as f32 (the codec's input): the rows themselves for an f32 cache, else
// widened into scratch `which` (0: K, 1: V).
const float* KvPager::WidenedLayer(const uint8_t* rows, DType type, int which) {
  if (type == DType::kF32) return reinterpret_cast<const float*>(rows);
  const int64_t n = layout_.block_tokens * layout_.kv_dim;
  std::vector<float>& out = widen_scratch_[which];
  out.resize(static_cast<size_t>(n));
  ops::DequantizeRow(type, rows, n, out.data());
  return out.data();
}

void KvPager::StartSequence(SeqId seq, KvSequencePages* pages) {
  table_.Bind(seq, pages);
  // Sized at admission for the first kInitialPositions positions (steps within them never grow
  // it); a longer sequence doubles it at the step that needs more (BeginStep), never the whole
  // context up front.
  const int64_t positions = std::min(max_context_, kInitialPositions);
  access_.Start(*pages, positions);
  pages->pages.reserve(static_cast<size_t>(manager_.BlocksFor(positions)));
}

void KvPager::ReleasePage(KvPage& page) {
  if (page.awaiting_restore) {  // never counted as held: it is not part of the sequence's KV
    mover_->LetGo(page);
    KvPageTable::MakeResident(page);
    return;
  }
  table_.Unhold(page);
  switch (page.fate) {
    case KvPageFate::kCompressed:
      slabs_.Free(page.codec, page.slots);
      break;
    case KvPageFate::kInTier:
      mover_->LetGo(page);
      break;
    case KvPageFate::kCheckpointed:
      mover_->ErasePrivatePage(page.tier, page.page_id, /*residual=*/true);
      break;
    case KvPageFate::kEvicted:
    case KvPageFate::kDropped:
    case KvPageFate::kResident:
      break;
  }
  KvPageTable::MakeResident(page);
}

void KvPager::DropSequence(SeqId seq) {
  KvSequencePages& s = table_.Bound(seq);
  for (KvPage& page : s.pages) ReleasePage(page);
  s.pages.clear();
  KvAccessTracker::Forget(s);
  table_.Unbind(seq);
}

void KvPager::Truncate(SeqId seq, int64_t num_blocks) {
  KvSequencePages& s = table_.Bound(seq);
  const auto keep = static_cast<size_t>(num_blocks);
  for (size_t b = keep; b < s.pages.size(); ++b) ReleasePage(s.pages[b]);
  if (s.pages.size() > keep) s.pages.resize(keep);
  access_.Truncate(s, num_blocks);
}

int64_t KvPager::Apply(KvPagePlan& plan) {
  KVL_CHECK_MSG(plan.state_version == manager_.state_version(),
                "a page plan made against an older state of the pool");
  int64_t applied = 0;
  const int64_t free_before = manager_.stats().blocks_free;
  for (KvPageAction& a : plan.actions) {
    if (plan.blocks_to_free > 0 && manager_.stats().blocks_free - free_before >= plan.blocks_to_free) {
      break;
    }
    a.applied = FateOf(a.seq, a.block_index) == KvPageFate::kCompressed
                    ? a.action == KvAction::kEvict && EvictCompressedPage(a.seq, a.block_index)
                    : DetachPage(a.seq, a.block_index, a.action);
    a.failed = !a.applied;
    if (!a.applied) continue;
    KvPage& page = table_.Existing(a.seq, a.block_index);
    page.action = a.action;
    page.predicted_ms = a.predicted_ms;
    page.model_ms = a.model_ms;
    ++applied;
  }
  return applied;
}

bool KvPager::CompressPage(SeqId seq, int64_t block_index, BlockId block, KvAction action,
                           KvPage& page) {
  const int64_t num_layers = layout_.num_layers;
  const KvCodecType codec =
      action == KvAction::kCompressInt8 ? KvCodecType::kInt8 : KvCodecType::kInt4;
  if (slabs_.slots_per_slab(codec) < num_layers) return false;
  // Encode before the block goes back to the pool (a new slab may be that very block).
  const int64_t slot = slabs_.slot_bytes(codec);
  KVL_CHECK_MSG(encode_scratch_.size() >= static_cast<size_t>(slot * num_layers),
                "compressing a page with no codec staging reserved (ReserveStaging)");
  for (int64_t l = 0; l < num_layers; ++l) {
    const float* k = WidenedLayer(storage_.key_bytes(block, l), layout_.k_type, 0);
    const float* v = WidenedLayer(storage_.value_bytes(block, l), layout_.v_type, 1);
    EncodeLayer(codec, k, v, layout_.block_tokens, layout_.kv_dim,
                encode_scratch_.data() + l * slot);
  }
  manager_.Detach(seq, block_index, /*lossless=*/false);
  // The block was this sequence's alone, so it is free now and one slab is always there.
  const bool allocated = slabs_.Allocate(codec, num_layers, &page.slots);
  KVL_CHECK_MSG(allocated, "no slab right after a block was freed");
  for (int64_t l = 0; l < num_layers; ++l) {
    std::memcpy(slabs_.SlotData(codec, page.slots[static_cast<size_t>(l)]),
                encode_scratch_.data() + l * slot, static_cast<size_t>(slot));
  }
  page.fate = KvPageFate::kCompressed;
  page.codec = codec;
  return true;
}

bool KvPager::DetachPage(SeqId seq, int64_t block_index, KvAction action) {
  const std::vector<BlockId>& table = manager_.block_table(seq);
  KVL_CHECK(block_index >= 0 && block_index + 1 < static_cast<int64_t>(table.size()));
  const BlockId block = table[static_cast<size_t>(block_index)];
  KVL_CHECK_MSG(block != kNoBlock && manager_.refcount(block) == 1,
                "only a resident page this sequence alone holds can be detached");
  KvPage& page = table_.At(seq, block_index);
  switch (action) {
    case KvAction::kCompressInt8:
    case KvAction::kCompressInt4:
      if (!CompressPage(seq, block_index, block, action, page)) return false;
      break;
    case KvAction::kDemoteRam:
    case KvAction::kDemoteDisk:
    case KvAction::kDemoteRedis:
    case KvAction::kRecomputeResidual: {
      const bool residual = action == KvAction::kRecomputeResidual;
      KvTier* tier = mover_->TierFor(action);
      KVL_CHECK_MSG(tier != nullptr, "a demotion to a tier this engine does not have");
      KVL_CHECK(!residual || streamer_->can_rebuild());
      if (!mover_->KeepInTier(seq, block_index, block, tier, residual, &page)) return false;
      manager_.Detach(seq, block_index, /*lossless=*/true);
      page.fate = residual ? KvPageFate::kCheckpointed : KvPageFate::kInTier;
      break;
    }
    case KvAction::kEvict:
      manager_.Detach(seq, block_index, /*lossless=*/false);
      page.fate = KvPageFate::kEvicted;
      break;
    default:
      KVL_CHECK_MSG(false, "not an action on a running sequence's page");
      return false;
  }
  table_.Hold(page);
  return true;
}

bool KvPager::EvictCompressedPage(SeqId seq, int64_t block_index) {
  if (FateOf(seq, block_index) != KvPageFate::kCompressed) return false;
  KvPage& page = table_.Existing(seq, block_index);
  ReleasePage(page);
  page.fate = KvPageFate::kEvicted;
  table_.Hold(page);
  return true;
}

void KvPager::Preempt(SeqId seq, KvPagePlan& plan) {
  KVL_CHECK_MSG(plan.state_version == manager_.state_version(),
                "a preemption plan made against an older state of the pool");
  KvSequencePages& s = table_.Bound(seq);
  // Pages held outside the pool while the sequence ran go first (a paged sequence's plan drops
  // every page: it is recomputed whole).
  for (KvPage& page : s.pages) ReleasePage(page);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  for (KvPageAction& a : plan.actions) {
    KVL_CHECK(a.seq == seq);
    KvPage& page = table_.At(seq, a.block_index);
    KvTier* tier = mover_->TierFor(a.action);
    const bool residual = a.action == KvAction::kRecomputeResidual;
    // A full tier keeps none of the page: it is dropped instead.
    a.applied = tier != nullptr &&
                mover_->KeepInTier(seq, a.block_index, table[static_cast<size_t>(a.block_index)],
                                   tier, residual, &page);
    a.failed = tier != nullptr && !a.applied;
    if (!a.applied) KvPageTable::MakeResident(page);
    page.fate = !a.applied ? KvPageFate::kDropped
                : residual ? KvPageFate::kCheckpointed
                           : KvPageFate::kInTier;
    page.action = a.applied ? a.action : KvAction::kRecomputeTokens;
    page.predicted_ms = a.predicted_ms;
    page.model_ms = a.model_ms;
    page.in_place = false;  // a preempted page is promoted at the resume, never streamed
    page.awaiting_restore = a.applied;
  }
  KvAccessTracker::Forget(s);
  table_.Unbind(seq);
}

int64_t KvPager::SaveToStore(SeqId seq, KvTier* tier) {
  return mover_->SaveToStore(seq, table_.Bound(seq), tier);
}

void KvPager::SaveUnreachablePages(SeqId seq, int64_t first_block, int64_t last_block) {
  mover_->SaveUnreachablePages(seq, first_block, last_block);
}

void KvPager::SpillFreeBlock(BlockId block) {
  mover_->SaveBlockToStore(block, manager_.FreeBlockContent(block));
}

void KvPager::SaveBlockToStore(BlockId block, KvContentId content) {
  mover_->SaveBlockToStore(block, content);
}

void KvPager::ForgetPreemptedPages(KvSequencePages& pages) {
  for (KvPage& page : pages.pages) {
    if (page.fate == KvPageFate::kInTier || page.fate == KvPageFate::kCheckpointed) {
      mover_->LetGo(page);
    }
    KvPageTable::MakeResident(page);
  }
}

void KvPager::BeginStep(std::span<const SeqId> seqs) {
  for (SeqId seq : seqs) access_.BeginStep(table_.Bound(seq), manager_.num_tokens(seq));
  streamer_->BeginStep(seqs);
}

std::span<const SeqId> KvPager::EndStep() { return streamer_->EndStep(); }

std::span<const SeqId> KvPager::RebuiltInStep() const { return streamer_->rebuilt_in_step(); }

KvLayerRebuild KvPager::BeginLayer(int64_t layer) { return streamer_->BeginLayer(layer); }

KvCache::Rows KvPager::RowsAt(int32_t seq, int64_t block_index, int64_t layer, int64_t offset) {
  const KvPage& page = table_.Existing(seq, block_index);
  KvCache::Rows rows;
  rows.count = layout_.block_tokens - offset;
  switch (page.fate) {
    case KvPageFate::kCompressed:
      rows.kind = KvCache::Rows::Kind::kCompressed;
      rows.page = LayerView(page.codec, slabs_.SlotData(page.codec, page.slots[static_cast<size_t>(layer)]),
                            layout_.block_tokens, layout_.kv_dim);
      rows.first_row = offset;
      return rows;
    case KvPageFate::kInTier:
    case KvPageFate::kCheckpointed:
      return streamer_->Rows(page, seq, block_index, layer, offset);
    case KvPageFate::kEvicted:
    case KvPageFate::kDropped:
      rows.kind = KvCache::Rows::Kind::kDropped;
      return rows;
    case KvPageFate::kResident:
      break;
  }
  KVL_CHECK_MSG(false, "a hole in the block table that the pager does not know");
  return rows;
}

float* KvPager::AttentionMass(int32_t seq) { return access_.AttentionMass(table_.Bound(seq)); }

size_t FeedbackKey(KvAction action, const KvTier* tier) {
  if (tier != nullptr && tier->kind() == TierKind::kRedis) return kRemoteTierFeedbackKey;
  return static_cast<size_t>(action);
}

KvPagerStats KvPager::stats() const {
  KvPagerStats st;
  const KvHeldPages& held = table_.held();
  st.compressed_pages = held.compressed;
  st.streamed_pages = held.streamed;
  st.in_place_pages = held.in_place;
  st.rebuilt_pages = held.rebuilt;
  st.evicted_pages = held.evicted;
  const KvStreamStats& stream = streamer_->stats();
  st.layers_rebuilt = stream.layers_rebuilt;
  st.layers_advanced = stream.layers_advanced;
  st.rebuild_ms = stream.rebuild_ms;
  st.layers_streamed = stream.layers_streamed;
  st.stream_wait_ms = stream.stream_wait_ms;
  st.stream_read_failures = stream.stream_read_failures + promote_read_failures_;
  st.staging_capacity_pages = stream.staging_capacity_pages;
  st.staging_bytes = stream.staging_bytes +
                     static_cast<int64_t>(encode_scratch_.capacity() +
                                          sizeof(float) * (widen_scratch_[0].capacity() +
                                                           widen_scratch_[1].capacity()));
  st.promoted_back_pages = promoted_back_pages_;
  st.slab_blocks = slabs_.num_slabs();
  st.compressed_bytes = slabs_.bytes_used();
  return st;
}

}  // namespace kvl
