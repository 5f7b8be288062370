#include "kvl/kv_pager.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

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
      layer_bytes_(layout_.layer_k_bytes() + layout_.layer_v_bytes()),
      checkpoint_layer_bytes_(layout_.block_tokens * layout_.residual_dim *
                              static_cast<int64_t>(sizeof(float))),
      slabs_(manager, storage),
      bound_(static_cast<size_t>(max_seqs), nullptr),
      access_(layout_.block_tokens, max_context) {
  ReserveStaging(0, /*compresses=*/false);
}

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
  KVL_CHECK(max_staged_pages >= 0);
  staging_capacity_pages_ = max_staged_pages;
  const size_t pages = static_cast<size_t>(max_staged_pages);
  const bool checkpoints = layout_.residual_dim > 0;
  auto size = [](auto& v, size_t n) {
    v.resize(n);
    v.shrink_to_fit();
  };
  for (int i = 0; i < 2; ++i) {
    size(stage_[i], pages * static_cast<size_t>(layer_bytes_));
    size(checkpoint_stage_[i], checkpoints ? pages * static_cast<size_t>(checkpoint_layer_bytes_) : 0);
    pending_[i].reserve(4);
  }
  size(rebuilt_k_, checkpoints ? pages * static_cast<size_t>(layout_.layer_k_bytes()) : 0);
  size(rebuilt_v_, checkpoints ? pages * static_cast<size_t>(layout_.layer_v_bytes()) : 0);
  size(rebuilt_positions_, checkpoints ? pages * static_cast<size_t>(layout_.block_tokens) : 0);
  size(rebuilt_seq_ids_, checkpoints ? pages * static_cast<size_t>(layout_.block_tokens) : 0);
  block_seq_ids_.resize(static_cast<size_t>(layout_.block_tokens));
  streamed_.reserve(pages);
  rebuilt_.reserve(pages);
  in_place_.reserve(static_cast<size_t>(manager_.num_blocks()));
  failed_.reserve(bound_.size());
  size(encode_scratch_, compresses ? static_cast<size_t>(CompressedPageBytes(
                                         KvCodecType::kInt8, layout_.block_tokens,
                                         layout_.num_layers, layout_.kv_dim))
                                   : 0);
  const bool half = compresses && (layout_.k_type != DType::kF32 || layout_.v_type != DType::kF32);
  for (std::vector<float>& w : widen_scratch_) {
    size(w, half ? static_cast<size_t>(layout_.block_tokens * layout_.kv_dim) : 0);
  }
  write_list_.reserve(static_cast<size_t>(layout_.num_layers));
  read_list_.reserve(static_cast<size_t>(layout_.num_layers));
  erase_list_.reserve(static_cast<size_t>(layout_.num_layers));
  block_positions_.resize(static_cast<size_t>(layout_.block_tokens));
  stats_.staging_capacity_pages = max_staged_pages;
  stats_.staging_bytes = static_cast<int64_t>(
      stage_[0].capacity() + stage_[1].capacity() + checkpoint_stage_[0].capacity() +
      checkpoint_stage_[1].capacity() + rebuilt_k_.capacity() + rebuilt_v_.capacity() +
      encode_scratch_.capacity() +
      sizeof(float) * (widen_scratch_[0].capacity() + widen_scratch_[1].capacity()));
}

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

KvPager::~KvPager() {
  // Reads in flight write into stage_: wait for them before the buffers go.
  for (auto& buffer : pending_) {
    for (PendingRead& read : buffer) {
      if (read.result.valid()) read.result.wait();
    }
  }
}

KvTier* KvPager::TierFor(KvAction action) const {
  switch (action) {
    case KvAction::kDemoteRam:
    case KvAction::kRecomputeResidual:  // the checkpoints
      return tiers_.ram;
    case KvAction::kDemoteDisk:
      return tiers_.disk;
    default:
      return nullptr;
  }
}

KvSequencePages& KvPager::Bound(SeqId seq) {
  KvSequencePages* s = bound_[static_cast<size_t>(seq)];
  KVL_CHECK_MSG(s != nullptr, "a slot with no sequence bound");
  return *s;
}

const KvSequencePages& KvPager::Bound(SeqId seq) const {
  const KvSequencePages* s = bound_[static_cast<size_t>(seq)];
  KVL_CHECK_MSG(s != nullptr, "a slot with no sequence bound");
  return *s;
}

const KvSequencePages& KvPager::pages(SeqId seq) const { return Bound(seq); }

KvPage& KvPager::PageAt(KvSequencePages& s, int64_t block_index) {
  if (s.pages.size() <= static_cast<size_t>(block_index)) {
    s.pages.resize(static_cast<size_t>(block_index) + 1);
  }
  return s.pages[static_cast<size_t>(block_index)];
}

void KvPager::StartSequence(SeqId seq, KvSequencePages* pages) {
  KVL_CHECK(bound_[static_cast<size_t>(seq)] == nullptr && pages != nullptr);
  bound_[static_cast<size_t>(seq)] = pages;
  // Sized at admission for the first kInitialPositions positions (steps within them never grow
  // it); a longer sequence doubles it at the step that needs more (BeginStep), never the whole
  // context up front.
  const int64_t positions = std::min(max_context_, kInitialPositions);
  access_.Start(*pages, positions);
  pages->pages.reserve(static_cast<size_t>(manager_.BlocksFor(positions)));
}

void KvPager::Rebind(SeqId seq, KvSequencePages* pages) {
  KVL_CHECK(bound_[static_cast<size_t>(seq)] != nullptr && pages != nullptr);
  bound_[static_cast<size_t>(seq)] = pages;
}

void KvPager::ReleasePage(KvPage& page) {
  if (page.awaiting_restore) {  // never counted as held: it is not part of the sequence's KV
    LetGoTierPage(page);
    MakeResident(page);
    return;
  }
  switch (page.fate) {
    case KvPageFate::kCompressed:
      slabs_.Free(page.codec, page.slots);
      --stats_.compressed_pages;
      break;
    case KvPageFate::kInTier:
      LetGoTierPage(page);
      --stats_.streamed_pages;
      if (page.in_place) --stats_.in_place_pages;
      break;
    case KvPageFate::kCheckpointed:
      EraseTierPage(page.tier, page.page_id, /*residual=*/true);
      --stats_.rebuilt_pages;
      break;
    case KvPageFate::kEvicted:
      --stats_.evicted_pages;
      break;
    case KvPageFate::kDropped:
    case KvPageFate::kResident:
      break;
  }
  MakeResident(page);
}

void KvPager::DropSequence(SeqId seq) {
  KvSequencePages& s = Bound(seq);
  for (KvPage& page : s.pages) ReleasePage(page);
  s.pages.clear();
  KvAccessTracker::Forget(s);
  bound_[static_cast<size_t>(seq)] = nullptr;
}

void KvPager::Truncate(SeqId seq, int64_t num_blocks) {
  KvSequencePages& s = Bound(seq);
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
    KvPage& page = Bound(a.seq).pages[static_cast<size_t>(a.block_index)];
    page.action = a.action;
    page.predicted_ms = a.predicted_ms;
    page.model_ms = a.model_ms;
    ++applied;
  }
  return applied;
}

bool KvPager::DetachPage(SeqId seq, int64_t block_index, KvAction action) {
  const std::vector<BlockId>& table = manager_.block_table(seq);
  KVL_CHECK(block_index >= 0 && block_index + 1 < static_cast<int64_t>(table.size()));
  const BlockId block = table[static_cast<size_t>(block_index)];
  KVL_CHECK_MSG(block != kNoBlock && manager_.refcount(block) == 1,
                "only a resident page this sequence alone holds can be detached");
  KvPage& page = PageAt(Bound(seq), block_index);
  const int64_t num_layers = layout_.num_layers;
  switch (action) {
    case KvAction::kCompressInt8:
    case KvAction::kCompressInt4: {
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
      ++stats_.compressed_pages;
      return true;
    }
    case KvAction::kDemoteRam:
    case KvAction::kDemoteDisk:
    case KvAction::kRecomputeResidual: {
      const bool residual = action == KvAction::kRecomputeResidual;
      KvTier* tier = TierFor(action);
      KVL_CHECK_MSG(tier != nullptr, "a demotion to a tier this engine does not have");
      KVL_CHECK(!residual || (layout_.residual_dim > 0 && rebuilder_ != nullptr &&
                              (layout_.checkpoint_every == 1 || cache_ != nullptr)));
      if (!KeepInTier(seq, block_index, block, tier, residual, &page)) return false;
      manager_.Detach(seq, block_index, /*lossless=*/true);
      page.fate = residual ? KvPageFate::kCheckpointed : KvPageFate::kInTier;
      ++(residual ? stats_.rebuilt_pages : stats_.streamed_pages);
      if (page.in_place) ++stats_.in_place_pages;
      return true;
    }
    case KvAction::kEvict:
      manager_.Detach(seq, block_index, /*lossless=*/false);
      page.fate = KvPageFate::kEvicted;
      ++stats_.evicted_pages;
      return true;
    default:
      KVL_CHECK_MSG(false, "not an action on a running sequence's page");
      return false;
  }
}

bool KvPager::EvictCompressedPage(SeqId seq, int64_t block_index) {
  if (FateOf(seq, block_index) != KvPageFate::kCompressed) return false;
  KvPage& page = Bound(seq).pages[static_cast<size_t>(block_index)];
  ReleasePage(page);
  page.fate = KvPageFate::kEvicted;
  ++stats_.evicted_pages;
  return true;
}

KvPageFate KvPager::FateOf(SeqId seq, int64_t block_index) const {
  const KvSequencePages& s = Bound(seq);
  return static_cast<size_t>(block_index) < s.pages.size()
             ? s.pages[static_cast<size_t>(block_index)].fate
             : KvPageFate::kResident;
}

bool KvPager::CheckpointMissing(SeqId seq, int64_t block_index) const {
  const KvSequencePages& s = Bound(seq);
  if (static_cast<size_t>(block_index) < s.pages.size() &&
      s.pages[static_cast<size_t>(block_index)].checkpoint_missing) {
    return true;
  }
  // A block shared through the prefix cache carries what its first owner knew of it.
  const std::vector<BlockId>& table = manager_.block_table(seq);
  const BlockId block = static_cast<size_t>(block_index) < table.size()
                            ? table[static_cast<size_t>(block_index)]
                            : kNoBlock;
  return block != kNoBlock && manager_.CheckpointsMissing(block);
}

void KvPager::Preempt(SeqId seq, KvPagePlan& plan) {
  KVL_CHECK_MSG(plan.state_version == manager_.state_version(),
                "a preemption plan made against an older state of the pool");
  KvSequencePages& s = Bound(seq);
  // Pages held outside the pool while the sequence ran go first (a paged sequence's plan drops
  // every page: it is recomputed whole).
  for (KvPage& page : s.pages) ReleasePage(page);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  for (KvPageAction& a : plan.actions) {
    KVL_CHECK(a.seq == seq);
    KvPage& page = PageAt(s, a.block_index);
    KvTier* tier = TierFor(a.action);
    const bool residual = a.action == KvAction::kRecomputeResidual;
    // A full tier keeps none of the page: it is dropped instead.
    a.applied = tier != nullptr && KeepInTier(seq, a.block_index,
                                              table[static_cast<size_t>(a.block_index)], tier,
                                              residual, &page);
    a.failed = tier != nullptr && !a.applied;
    if (!a.applied) MakeResident(page);
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
  bound_[static_cast<size_t>(seq)] = nullptr;
}

int64_t KvPager::RestorePages(SeqId seq, int64_t first_block, int64_t num_blocks,
                              std::vector<double>* page_ms) {
  KvSequencePages& s = Bound(seq);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  if (page_ms != nullptr) page_ms->clear();
  int64_t restored = 0;
  for (int64_t b = first_block; b < first_block + num_blocks; ++b) {
    const auto start = std::chrono::steady_clock::now();
    // Never wrong bytes: a corrupt or failed read ends the restore; the rest is computed.
    KvPage& page = s.pages[static_cast<size_t>(b)];
    if (BringIntoBlock(seq, b, table[static_cast<size_t>(b)], page) != BringBack::kDone) break;
    ++restored;
    if (page_ms != nullptr) {
      page_ms->push_back(MillisecondsSince(start));
    }
  }
  return restored;
}

KvPager::BringBack KvPager::BringIntoBlock(SeqId seq, int64_t block_index, BlockId block,
                                           KvPage& page) {
  const bool residual = page.fate == KvPageFate::kCheckpointed;
  KVL_CHECK(residual || page.fate == KvPageFate::kInTier);
  if (!ReadLayerPages(block, page, residual).ok()) return BringBack::kReadFailed;
  if (residual) {
    if (!RebuildBlockFromCheckpoints(seq, block, block_index)) return BringBack::kNeedsEarlierPages;
  } else if (layout_.residual_dim > 0) {
    page.checkpoint_missing = true;  // only K/V came back
    manager_.MarkCheckpointsMissing(block);
  }
  return BringBack::kDone;
}

// K and V of every layer of one block rebuilt from the checkpoints it holds: bit-identical to
// what the forward pass stored (the kernels are batch-invariant). A layer without a checkpoint
// takes its input from running the layer before for the block's tokens, which attends to every
// earlier position of the sequence at that layer: those pages must be in the pool (restored in
// order, or the prefix the admission found), and this block's own rows of the layer are written
// just before.
bool KvPager::RebuildBlockFromCheckpoints(SeqId seq, BlockId block, int64_t block_index) {
  KVL_CHECK(rebuilder_ != nullptr);
  const int64_t bt = layout_.block_tokens;
  if (layout_.checkpoint_every > 1) {
    KVL_CHECK_MSG(cache_ != nullptr, "checkpoints every s > 1 layers need set_rebuilder's cache");
    const std::vector<BlockId>& table = manager_.block_table(seq);
    for (int64_t b = 0; b < block_index; ++b) {
      if (table[static_cast<size_t>(b)] == kNoBlock) return false;
    }
  }
  for (int64_t t = 0; t < bt; ++t) {
    block_positions_[static_cast<size_t>(t)] = block_index * bt + t;
    block_seq_ids_[static_cast<size_t>(t)] = seq;
  }
  // Each layer's K and V go straight into the block's rows, from its checkpoints there.
  class BlockSource final : public KvRebuildSource {
   public:
    BlockSource(KvPager& pager, BlockId block) : pager_(pager), block_(block) {}
    KvLayerRebuild Layer(int64_t layer) override {
      const KvBlockLayout& layout = pager_.layout_;
      KvLayerRebuild r;
      // A windowed layer's rows live in its sequence's window ring (kvl/kv_window_release.h):
      // nothing of it is rebuilt into the block.
      if (!layout.in_block(layer)) return r;
      r.rows = layout.block_tokens;
      r.positions = pager_.block_positions_.data();
      r.seq_ids = pager_.block_seq_ids_.data();
      if (layout.is_checkpoint_layer(layer)) r.input = pager_.storage_.residuals(block_, layer);
      r.advance = layer + 1 < layout.num_layers && !layout.is_checkpoint_layer(layer + 1);
      r.k_type = layout.k_type;
      r.k_out = pager_.storage_.key_bytes(block_, layer);
      r.v_type = layout.v_type;
      r.v_out = pager_.storage_.value_bytes(block_, layer);
      return r;
    }

   private:
    KvPager& pager_;
    BlockId block_;
  };
  BlockSource source(*this, block);
  const auto start = std::chrono::steady_clock::now();
  rebuilder_->Rebuild(source, cache_);
  // Only rebuilds on their own are timed here: those inside a step are part of its run.
  stats_.rebuild_ms += MillisecondsSince(start);
  return true;
}

void KvPager::ReadInPlace(SeqId seq, int64_t first_block, int64_t num_blocks) {
  KvSequencePages& s = Bound(seq);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  for (int64_t b = first_block; b < first_block + num_blocks; ++b) {
    KvPage& page = s.pages[static_cast<size_t>(b)];
    KVL_CHECK(page.awaiting_restore && page.fate == KvPageFate::kInTier && page.store_pin &&
              table[static_cast<size_t>(b)] == kNoBlock);
    page.awaiting_restore = false;
    // A RAM tier's page is read where it lies; a disk tier's is streamed into the staging at
    // each step, as a demoted page is (the admission counted it against the staging's room).
    page.in_place = page.tier->reads_in_place();
    ++stats_.streamed_pages;
    if (page.in_place) ++stats_.in_place_pages;
  }
}

void KvPager::SettleRestoredPages(SeqId seq) {
  KvSequencePages& s = Bound(seq);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  for (size_t b = 0; b < s.pages.size() && b < table.size(); ++b) {
    KvPage& page = s.pages[b];
    // A page dropped at a preemption that has its block again is recomputed into it by this step
    // (or found by prefix): resident from now on, and a candidate for relief like any other.
    if (page.fate == KvPageFate::kDropped && table[b] != kNoBlock) MakeResident(page);
    if (!page.awaiting_restore) continue;
    KVL_CHECK(table[b] != kNoBlock);
    LetGoTierPage(page);
    MakeResident(page);
  }
}

int64_t KvPager::SaveToStore(SeqId seq, KvTier* tier) {
  if (store_ == nullptr || store_->TierIndex(tier) < 0) return 0;
  const std::vector<BlockId>& table = manager_.block_table(seq);
  const KvSequencePages& s = Bound(seq);
  const size_t bt = static_cast<size_t>(layout_.block_tokens);
  const int64_t full_blocks = manager_.num_tokens(seq) / layout_.block_tokens;
  // What the tier holds whole already, asked in one batch (one round trip for Redis).
  std::vector<KvContentId> contents;
  for (int64_t b = 0; b < full_blocks; ++b) {
    const KvContentId content = manager_.ContentOf(seq, b);
    if (!content.valid()) break;  // nothing after a page without identity has one
    contents.push_back(content);
  }
  const std::vector<bool> held = store_->HoldsWhole(tier, contents);
  int64_t saved = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(contents.size()); ++b) {
    if (held[static_cast<size_t>(b)]) continue;
    const KvContentId content = manager_.ContentOf(seq, b);
    const BlockId block = table[static_cast<size_t>(b)];
    const KvPage* page = static_cast<size_t>(b) < s.pages.size() ? &s.pages[static_cast<size_t>(b)] : nullptr;
    std::function<std::span<const uint8_t>(int64_t)> layer;
    if (block != kNoBlock) {
      layer = [&](int64_t l) -> std::span<const uint8_t> { return LayerPageSpan(block, l, false); };
    } else if (page != nullptr && page->fate == KvPageFate::kInTier && page->tier == tier) {
      continue;  // already there
    } else if (page != nullptr && page->fate == KvPageFate::kInTier && page->in_place) {
      layer = [&](int64_t l) -> std::span<const uint8_t> {
        const uint8_t* rows = page->tier->PeekPage(LayerKeyOf(*page, l), layer_bytes_);
        return rows != nullptr ? std::span<const uint8_t>(rows, static_cast<size_t>(layer_bytes_))
                               : std::span<const uint8_t>();
      };
      // A layer the other tier no longer has cannot be copied: the page is skipped.
      bool complete = true;
      for (int64_t l = 0; l < layout_.num_layers && complete; ++l) complete = !layer(l).empty();
      if (!complete) continue;
    } else {
      continue;  // streamed from a tier that cannot be read in place, or lossy: not copied
    }
    const Status status = store_->Save(
        tier, content,
        std::span(manager_.tokens(seq)).subspan(static_cast<size_t>(b) * bt, bt), layer);
    if (!status.ok()) {
      last_tier_error_ = status;
      break;  // a full or failing tier: the rest would fail the same way
    }
    ++saved;
  }
  return saved;
}

void KvPager::SaveUnreachablePages(SeqId seq, int64_t first_block, int64_t last_block) {
  if (store_ == nullptr || store_->empty()) return;
  KvTier* tier = store_->tiers().front().tier;
  const std::vector<BlockId>& table = manager_.block_table(seq);
  const size_t bt = static_cast<size_t>(layout_.block_tokens);
  for (int64_t b = first_block; b < last_block; ++b) {
    const KvContentId content = manager_.ContentOf(seq, b);
    const BlockId block = table[static_cast<size_t>(b)];
    if (!content.valid() || block == kNoBlock) continue;
    const Status status = store_->Save(
        tier, content,
        std::span(manager_.tokens(seq)).subspan(static_cast<size_t>(b) * bt, bt),
        [&](int64_t l) -> std::span<const uint8_t> { return LayerPageSpan(block, l, false); });
    if (!status.ok()) {
      last_tier_error_ = status;
      return;
    }
  }
}

void KvPager::SpillFreeBlock(BlockId block) {
  SaveBlockToStore(block, manager_.FreeBlockContent(block));
}

void KvPager::SaveBlockToStore(BlockId block, KvContentId content) {
  if (store_ == nullptr || store_->empty() || !content.valid()) return;
  KvTier* tier = store_->tiers().front().tier;
  const Status status = store_->Save(
      tier, content, manager_.BlockTokens(block),
      [&](int64_t l) -> std::span<const uint8_t> { return LayerPageSpan(block, l, false); });
  if (!status.ok()) last_tier_error_ = status;
}

void KvPager::ForgetPreemptedPages(KvSequencePages& pages) {
  for (KvPage& page : pages.pages) {
    if (page.fate == KvPageFate::kInTier || page.fate == KvPageFate::kCheckpointed) {
      LetGoTierPage(page);
    }
    MakeResident(page);
  }
}

size_t FeedbackKey(KvAction action, const KvTier* tier) {
  if (tier != nullptr && tier->kind() == TierKind::kRedis) return kRemoteTierFeedbackKey;
  return static_cast<size_t>(action);
}

// Back in its pool block: every field but checkpoint_missing, which outlives every fate. The
// slots keep their capacity for the page's next compression.
void KvPager::MakeResident(KvPage& page) {
  page.fate = KvPageFate::kResident;
  page.action = KvAction::kKeep;
  page.predicted_ms = 0;
  page.model_ms = 0;
  page.slots.clear();
  page.tier = nullptr;
  page.page_id = 0;
  page.content = {};
  page.store_pin = false;
  page.in_place = false;
  page.in_place_rows = nullptr;
  page.awaiting_restore = false;
  page.stage_index = -1;
  page.read_failed = false;
}

// One layer of a page as the tier stores it: K rows then V rows (adjacent in the block), or the
// layer's residual checkpoints.
std::span<uint8_t> KvPager::LayerPageSpan(BlockId block, int64_t layer, bool residual) {
  if (residual) {
    return {reinterpret_cast<uint8_t*>(storage_.residuals(block, layer)),
            static_cast<size_t>(checkpoint_layer_bytes_)};
  }
  return {storage_.key_bytes(block, layer), static_cast<size_t>(layer_bytes_)};
}

bool KvPager::WriteLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t* page_id) {
  std::vector<PageWrite>& writes = write_list_;
  writes.clear();
  const uint64_t id = next_page_id_++;
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    if (InTierPage(l, residual)) writes.push_back({KeyOf(id, l), LayerPageSpan(block, l, residual)});
  }
  // A full or failing tier stores none of them; the cause is kept for the error the user sees.
  const Status put = tier->Put(writes);
  if (!put.ok()) {
    last_tier_error_ =
        Status(put.code(), fmt::format("the {} tier: {}", tier->name(), put.message()));
    return false;
  }
  *page_id = id;
  return true;
}

bool KvPager::KeepInTier(SeqId seq, int64_t block_index, BlockId block, KvTier* tier,
                         bool residual, KvPage* page) {
  const KvContentId content = manager_.ContentOf(seq, block_index);
  if (!residual && content.valid() && store_ != nullptr && store_->TierIndex(tier) >= 0) {
    const size_t bt = static_cast<size_t>(layout_.block_tokens);
    const Status saved = store_->Save(
        tier, content,
        std::span(manager_.tokens(seq)).subspan(static_cast<size_t>(block_index) * bt, bt),
        [&](int64_t l) -> std::span<const uint8_t> { return LayerPageSpan(block, l, false); },
        /*pinned=*/true);
    if (!saved.ok()) {
      last_tier_error_ = saved;
      return false;
    }
    page->tier = tier;
    page->content = content;
    page->store_pin = true;
    page->page_id = 0;
  } else {
    uint64_t page_id = 0;
    if (!WriteLayerPages(block, tier, residual, &page_id)) return false;
    page->tier = tier;
    page->content = {};
    page->store_pin = false;
    page->page_id = page_id;
  }
  page->in_place = !residual && tier->reads_in_place();
  return true;
}

Status KvPager::ReadLayerPages(BlockId block, const KvPage& page, bool residual) {
  std::vector<PageRead>& reads = read_list_;
  reads.clear();
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    if (InTierPage(l, residual)) reads.push_back({LayerKeyOf(page, l), LayerPageSpan(block, l, residual)});
  }
  for (const Status& status : page.tier->Get(reads)) {
    if (status.ok()) continue;
    // A damaged or partial store page (a layer gone) is forgotten, so that it is written afresh
    // rather than found again.
    if (page.content.valid()) store_->Forget(page.tier, page.content);
    return status;
  }
  return Status::Ok();
}

void KvPager::LetGoTierPage(const KvPage& page) {
  if (!page.content.valid()) {
    EraseTierPage(page.tier, page.page_id, page.fate == KvPageFate::kCheckpointed);
  } else if (page.store_pin) {
    store_->Unpin(page.tier, page.content);
  }
}

void KvPager::EraseTierPage(KvTier* tier, uint64_t page_id, bool residual) {
  erase_list_.clear();
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    if (InTierPage(l, residual)) erase_list_.push_back(KeyOf(page_id, l));
  }
  tier->Erase(erase_list_);
}

float* KvPager::AttentionMass(int32_t seq) { return access_.AttentionMass(Bound(seq)); }

double KvPager::PageMass(SeqId seq, int64_t block_index) const {
  return access_.PageMass(Bound(seq), block_index);
}

int64_t KvPager::steps(SeqId seq) const { return Bound(seq).steps; }

int64_t KvPager::StepsSinceRead(SeqId seq, int64_t block_index) const {
  return KvAccessTracker::StepsSinceRead(Bound(seq), block_index);
}

int64_t KvPager::PageReads(SeqId seq, int64_t block_index) const {
  return KvAccessTracker::PageReads(Bound(seq), block_index);
}

KvPagerStats KvPager::stats() const {
  KvPagerStats st = stats_;
  st.slab_blocks = slabs_.num_slabs();
  st.compressed_bytes = slabs_.bytes_used();
  return st;
}

}  // namespace kvl
