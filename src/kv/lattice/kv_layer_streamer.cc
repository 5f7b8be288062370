#include "kv_layer_streamer.h"

#include <algorithm>
#include <chrono>

namespace kvl {

const KvStreamStep::Page& KvStreamStep::Find(const KvPage& page, SeqId seq,
                                             int64_t block_index) const {
  const std::vector<Page>& list = page.fate == KvPageFate::kCheckpointed ? rebuilt
                                  : page.in_place                       ? in_place
                                                                        : streamed;
  const std::vector<int32_t>& of_seq = index[static_cast<size_t>(seq)];
  const int32_t i =
      static_cast<size_t>(block_index) < of_seq.size() ? of_seq[static_cast<size_t>(block_index)] : -1;
  KVL_CHECK_MSG(i >= 0, "a page outside the pool that this step did not stage");
  return list[static_cast<size_t>(i)];
}

void KvStreamStep::ClearPages() {
  for (std::vector<Page>* list : {&streamed, &in_place, &rebuilt}) {
    for (const Page& p : *list) {
      index[static_cast<size_t>(p.seq)][static_cast<size_t>(p.block_index)] = -1;
    }
    list->clear();
  }
}

KvLayerStreamer::KvLayerStreamer(const KvManager& manager, KvBlockStorage& storage,
                                 const KvPageTable& table, KvTierMover& mover)
    : manager_(manager),
      storage_(storage),
      table_(table),
      mover_(mover),
      layout_(storage.layout()) {
  step_.index.resize(static_cast<size_t>(table.max_seqs()));
  Reserve(0);
}

KvLayerStreamer::~KvLayerStreamer() {
  for (auto& buffer : pending_) {
    for (PendingRead& read : buffer) {
      if (read.result.valid()) read.result.wait();
    }
  }
}

void KvLayerStreamer::Reserve(int64_t max_staged_pages) {
  KVL_CHECK(max_staged_pages >= 0);
  const size_t pages = static_cast<size_t>(max_staged_pages);
  const bool checkpoints = layout_.residual_dim > 0;
  auto size = [](auto& v, size_t n) {
    v.resize(n);
    v.shrink_to_fit();
  };
  for (int i = 0; i < 2; ++i) {
    size(stage_[i], pages * static_cast<size_t>(mover_.layer_bytes()));
    size(checkpoint_stage_[i],
         checkpoints ? pages * static_cast<size_t>(mover_.checkpoint_layer_bytes()) : 0);
    pending_[i].reserve(4);
  }
  size(rebuilt_k_, checkpoints ? pages * static_cast<size_t>(layout_.layer_k_bytes()) : 0);
  size(rebuilt_v_, checkpoints ? pages * static_cast<size_t>(layout_.layer_v_bytes()) : 0);
  size(rebuilt_positions_, checkpoints ? pages * static_cast<size_t>(layout_.block_tokens) : 0);
  size(rebuilt_seq_ids_, checkpoints ? pages * static_cast<size_t>(layout_.block_tokens) : 0);
  block_positions_.resize(static_cast<size_t>(layout_.block_tokens));
  block_seq_ids_.resize(static_cast<size_t>(layout_.block_tokens));
  step_.streamed.reserve(pages);
  step_.rebuilt.reserve(pages);
  rebuilt_in_step_.reserve(pages);
  step_.in_place.reserve(static_cast<size_t>(manager_.num_blocks()));
  step_.failed.reserve(static_cast<size_t>(table_.max_seqs()));
  stats_.staging_capacity_pages = max_staged_pages;
  stats_.staging_bytes = static_cast<int64_t>(
      stage_[0].capacity() + stage_[1].capacity() + checkpoint_stage_[0].capacity() +
      checkpoint_stage_[1].capacity() + rebuilt_k_.capacity() + rebuilt_v_.capacity());
}

void KvLayerStreamer::Stage(std::vector<KvStreamStep::Page>& list, SeqId seq,
                            int64_t block_index) {
  std::vector<int32_t>& of_seq = step_.index[static_cast<size_t>(seq)];
  // Grows with the sequence's page record (which grows only when a page leaves the pool).
  if (of_seq.size() <= static_cast<size_t>(block_index)) {
    of_seq.resize(table_.Bound(seq).pages.size(), -1);
  }
  of_seq[static_cast<size_t>(block_index)] = static_cast<int32_t>(list.size());
  list.push_back({seq, block_index});
}

void KvLayerStreamer::BeginStep(std::span<const SeqId> seqs) {
  step_.ClearPages();
  step_.failed.clear();
  rebuilt_in_step_.clear();
  for (SeqId seq : seqs) {
    const KvSequencePages& s = table_.Bound(seq);
    const size_t blocks = manager_.block_table(seq).size();
    for (size_t b = 0; b < s.pages.size() && b < blocks; ++b) {
      const KvPage& page = s.pages[b];
      if (page.awaiting_restore) continue;
      std::vector<KvStreamStep::Page>* list =
          page.fate == KvPageFate::kInTier ? (page.in_place ? &step_.in_place : &step_.streamed)
          : page.fate == KvPageFate::kCheckpointed ? &step_.rebuilt
                                                   : nullptr;
      if (list != nullptr) Stage(*list, seq, static_cast<int64_t>(b));
    }
  }
  if (step_.streamed.empty() && step_.rebuilt.empty() && step_.in_place.empty()) return;
  KVL_CHECK_MSG(static_cast<int64_t>(step_.streamed.size() + step_.rebuilt.size()) <=
                    stats_.staging_capacity_pages,
                "more pages staged than the reserved staging holds");
  for (size_t i = 0; i < step_.rebuilt.size(); ++i) {
    rebuilt_in_step_.push_back(step_.rebuilt[i].seq);
    for (int64_t t = 0; t < layout_.block_tokens; ++t) {
      const size_t row = i * static_cast<size_t>(layout_.block_tokens) + static_cast<size_t>(t);
      rebuilt_positions_[row] = step_.rebuilt[i].block_index * layout_.block_tokens + t;
      rebuilt_seq_ids_[row] = step_.rebuilt[i].seq;
    }
  }
  pending_layer_[0] = pending_layer_[1] = -1;
  IssueLayerRead(0);
}

uint8_t* KvLayerStreamer::StageData(int64_t layer, int64_t stage_index) {
  return stage_[layer % 2].data() + stage_index * mover_.layer_bytes();
}

// Starts the reads of one layer of every streamed page (K/V) and every rebuilt page
// (checkpoints) into their buffers, one batch per tier and kind.
void KvLayerStreamer::IssueLayerRead(int64_t layer) {
  const int buffer = static_cast<int>(layer % 2);
  KVL_CHECK(pending_[buffer].empty());
  pending_layer_[buffer] = layer;
  for (bool checkpoints : {false, true}) {
    // Checkpoints are read at checkpoint layers only; the layers after one run from it.
    if (checkpoints && !layout_.is_checkpoint_layer(layer)) continue;
    const std::vector<KvStreamStep::Page>& list = checkpoints ? step_.rebuilt : step_.streamed;
    const int64_t bytes = checkpoints ? mover_.checkpoint_layer_bytes() : mover_.layer_bytes();
    std::vector<KvTier*> tiers;
    for (const KvStreamStep::Page& st : list) {
      KvTier* tier = table_.Existing(st.seq, st.block_index).tier;
      if (std::find(tiers.begin(), tiers.end(), tier) == tiers.end()) tiers.push_back(tier);
    }
    for (KvTier* tier : tiers) {
      PendingRead read;
      read.checkpoints = checkpoints;
      std::vector<PageRead> reads;
      for (size_t i = 0; i < list.size(); ++i) {
        const KvPage& page = table_.Existing(list[i].seq, list[i].block_index);
        if (page.tier != tier) continue;
        uint8_t* out = checkpoints ? checkpoint_stage_[buffer].data() + static_cast<int64_t>(i) * bytes
                                   : StageData(layer, static_cast<int64_t>(i));
        reads.push_back({KvTierMover::LayerKeyOf(page, layer),
                         std::span<uint8_t>(out, static_cast<size_t>(bytes))});
        read.stage_indices.push_back(static_cast<int64_t>(i));
      }
      read.result = tier->GetAsync(std::move(reads));
      pending_[buffer].push_back(std::move(read));
    }
  }
}

void KvLayerStreamer::Fail(KvStreamStep::Page& staged) {
  staged.read_failed = true;
  // Never found again by a lookup: the sequence is recomputed, not sent back to this page.
  mover_.ForgetDamaged(table_.Existing(staged.seq, staged.block_index));
  if (std::find(step_.failed.begin(), step_.failed.end(), staged.seq) == step_.failed.end()) {
    step_.failed.push_back(staged.seq);
  }
  ++stats_.stream_read_failures;
}

KvLayerRebuild KvLayerStreamer::BeginLayer(int64_t layer) {
  // Pages read in place: this layer's rows where the tier holds them. A page the tier no longer
  // has (evicted to make room for another) reads as dropped, and its sequence is recomputed.
  for (KvStreamStep::Page& st : step_.in_place) {
    const KvPage& page = table_.Existing(st.seq, st.block_index);
    st.in_place_rows =
        page.tier->PeekPage(KvTierMover::LayerKeyOf(page, layer), mover_.layer_bytes());
    if (st.in_place_rows == nullptr) Fail(st);
  }
  stats_.layers_streamed += static_cast<int64_t>(step_.in_place.size());
  if (step_.streamed.empty() && step_.rebuilt.empty()) return {};
  const int buffer = static_cast<int>(layer % 2);
  KVL_CHECK_MSG(pending_layer_[buffer] == layer, "layers must be begun in order");
  // The next layer's reads are queued before this one's are waited for: its buffers held the
  // layer before, which has finished computing, so the tier goes from this layer's reads straight
  // to the next one's instead of idling until this thread wakes, collects and asks again.
  if (layer + 1 < layout_.num_layers) IssueLayerRead(layer + 1);
  const auto start = std::chrono::steady_clock::now();
  for (PendingRead& read : pending_[buffer]) {
    const std::vector<Status> statuses = read.result.get();
    for (size_t i = 0; i < statuses.size(); ++i) {
      if (statuses[i].ok()) continue;
      // Never wrong bytes: the page reads as dropped this step, and the caller throws the
      // sequence's step away and recomputes its KV (EndStep).
      std::vector<KvStreamStep::Page>& list = read.checkpoints ? step_.rebuilt : step_.streamed;
      Fail(list[static_cast<size_t>(read.stage_indices[i])]);
    }
  }
  pending_[buffer].clear();
  const auto read_done = std::chrono::steady_clock::now();
  stats_.stream_wait_ms += std::chrono::duration<double, std::milli>(read_done - start).count();
  stats_.layers_streamed += static_cast<int64_t>(step_.streamed.size());
  return RebuildOfLayer(layer, buffer);
}

// Every rebuilt page's rows of this layer, for the forward pass to compute in the step (a failed
// page is computed from whatever its buffer holds, but reads as dropped and its step is
// discarded): from the layer's checkpoints, or from the residual the forward pass carried from the
// layer before. Where the next layer has no checkpoint the forward pass runs this layer whole for
// the pages' tokens: attention at this layer sees every earlier position, and every page of the
// step's sequences has its rows of this layer in place by then (resident, streamed, read in place,
// or rebuilt in the same layer), so no page waits on another.
KvLayerRebuild KvLayerStreamer::RebuildOfLayer(int64_t layer, int buffer) {
  KvLayerRebuild r;
  // A windowed layer's rows live in the window rings (kvl/kv_window_release.h), not the pages.
  if (step_.rebuilt.empty() || !layout_.in_block(layer)) return r;
  const auto pages = static_cast<int64_t>(step_.rebuilt.size());
  r.rows = pages * layout_.block_tokens;
  r.positions = rebuilt_positions_.data();
  r.seq_ids = rebuilt_seq_ids_.data();
  if (layout_.is_checkpoint_layer(layer)) {
    r.input = reinterpret_cast<const float*>(checkpoint_stage_[buffer].data());
  }
  r.advance = layer + 1 < layout_.num_layers && !layout_.is_checkpoint_layer(layer + 1);
  r.k_type = layout_.k_type;
  r.k_out = rebuilt_k_.data();
  r.v_type = layout_.v_type;
  r.v_out = rebuilt_v_.data();
  stats_.layers_rebuilt += pages;
  if (r.advance) stats_.layers_advanced += pages;
  return r;
}

void KvLayerStreamer::WaitForReads() {
  for (auto& buffer : pending_) {
    for (PendingRead& read : buffer) read.result.wait();
    buffer.clear();
  }
}

std::span<const SeqId> KvLayerStreamer::EndStep() {
  // A run that stopped early (it never does today) must not leave reads behind.
  WaitForReads();
  step_.ClearPages();
  return step_.failed;
}

KvCache::Rows KvLayerStreamer::Rows(const KvPage& page, SeqId seq, int64_t block_index,
                                    int64_t layer, int64_t offset) {
  const KvStreamStep::Page& st = step_.Find(page, seq, block_index);
  if (st.read_failed) {
    KvCache::Rows rows;
    rows.count = layout_.block_tokens - offset;
    rows.kind = KvCache::Rows::Kind::kDropped;
    return rows;
  }
  if (page.fate == KvPageFate::kCheckpointed) {
    const auto i = static_cast<int64_t>(&st - step_.rebuilt.data());
    return DenseRows(layout_, rebuilt_k_.data() + i * layout_.layer_k_bytes(),
                     rebuilt_v_.data() + i * layout_.layer_v_bytes(), offset);
  }
  // Attention only reads the rows (DenseRows takes them as mutable for the pool's sake).
  uint8_t* data = page.in_place ? const_cast<uint8_t*>(st.in_place_rows)
                                : StageData(layer, &st - step_.streamed.data());
  return DenseRows(layout_, data, data + layout_.layer_k_bytes(), offset);
}

// K and V of every layer of one block rebuilt from the checkpoints it holds: bit-identical to
// what the forward pass stored (the kernels are batch-invariant). A layer without a checkpoint
// takes its input from running the layer before for the block's tokens, which attends to every
// earlier position of the sequence at that layer: those pages must be in the pool (restored in
// order, or the prefix the admission found), and this block's own rows of the layer are written
// just before.
bool KvLayerStreamer::RebuildBlock(SeqId seq, BlockId block, int64_t block_index) {
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
    BlockSource(KvLayerStreamer& streamer, BlockId block) : streamer_(streamer), block_(block) {}
    KvLayerRebuild Layer(int64_t layer) override {
      const KvBlockLayout& layout = streamer_.layout_;
      KvLayerRebuild r;
      // A windowed layer's rows live in its sequence's window ring (kvl/kv_window_release.h):
      // nothing of it is rebuilt into the block.
      if (!layout.in_block(layer)) return r;
      r.rows = layout.block_tokens;
      r.positions = streamer_.block_positions_.data();
      r.seq_ids = streamer_.block_seq_ids_.data();
      if (layout.is_checkpoint_layer(layer)) r.input = streamer_.storage_.residuals(block_, layer);
      r.advance = layer + 1 < layout.num_layers && !layout.is_checkpoint_layer(layer + 1);
      r.k_type = layout.k_type;
      r.k_out = streamer_.storage_.key_bytes(block_, layer);
      r.v_type = layout.v_type;
      r.v_out = streamer_.storage_.value_bytes(block_, layer);
      return r;
    }

   private:
    KvLayerStreamer& streamer_;
    BlockId block_;
  };
  BlockSource source(*this, block);
  const auto start = std::chrono::steady_clock::now();
  rebuilder_->Rebuild(source, cache_);
  // Only rebuilds on their own are timed here: those inside a step are part of its run.
  stats_.rebuild_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return true;
}

}  // namespace kvl
