// KvPager's per-step stream: the pages of a step's sequences that live outside the pool (K/V in
// a tier, or residual checkpoints) staged layer by layer for attention, each layer's reads issued
// while the previous layer computes; the pages to rebuild handed to the forward pass layer by
// layer, which computes them inside the step (KvLayerRebuild); and the rows attention reads
// (RowsAt). The pager's page
// fates and transfers are in kv_pager.cc.
#include <chrono>
#include <cstring>

#include "kvl/kv_pager.h"

namespace kvl {

void KvPager::BeginStep(std::span<const SeqId> seqs) {
  streamed_.clear();
  in_place_.clear();
  rebuilt_.clear();
  failed_.clear();
  for (SeqId seq : seqs) {
    KvSequencePages& s = Bound(seq);
    access_.BeginStep(s, manager_.num_tokens(seq));
    const size_t blocks = manager_.block_table(seq).size();
    for (size_t b = 0; b < s.pages.size() && b < blocks; ++b) {
      KvPage& page = s.pages[b];
      page.read_failed = false;
      if (page.awaiting_restore) continue;
      std::vector<StagedPage>* list = page.fate == KvPageFate::kInTier
                                          ? (page.in_place ? &in_place_ : &streamed_)
                                      : page.fate == KvPageFate::kCheckpointed ? &rebuilt_
                                                                               : nullptr;
      if (list == nullptr) continue;
      page.stage_index = static_cast<int64_t>(list->size());
      list->push_back({seq, static_cast<int64_t>(b)});
    }
  }
  if (streamed_.empty() && rebuilt_.empty() && in_place_.empty()) return;
  KVL_CHECK_MSG(static_cast<int64_t>(streamed_.size() + rebuilt_.size()) <= staging_capacity_pages_,
                "more pages staged than the reserved staging holds");
  for (size_t i = 0; i < rebuilt_.size(); ++i) {
    for (int64_t t = 0; t < layout_.block_tokens; ++t) {
      const size_t row = i * static_cast<size_t>(layout_.block_tokens) + static_cast<size_t>(t);
      rebuilt_positions_[row] = rebuilt_[i].block_index * layout_.block_tokens + t;
      rebuilt_seq_ids_[row] = rebuilt_[i].seq;
    }
  }
  pending_layer_[0] = pending_layer_[1] = -1;
  IssueLayerRead(0);
}

KvPage& KvPager::PageOf(const StagedPage& st) {
  return Bound(st.seq).pages[static_cast<size_t>(st.block_index)];
}

uint8_t* KvPager::StageData(int64_t layer, int64_t stage_index) {
  return stage_[layer % 2].data() + stage_index * layer_bytes_;
}

// Starts the reads of one layer of every streamed page (K/V) and every rebuilt page
// (checkpoints) into their buffers, one batch per tier and kind.
void KvPager::IssueLayerRead(int64_t layer) {
  const int buffer = static_cast<int>(layer % 2);
  KVL_CHECK(pending_[buffer].empty());
  pending_layer_[buffer] = layer;
  for (bool checkpoints : {false, true}) {
    // Checkpoints are read at checkpoint layers only; the layers after one run from it.
    if (checkpoints && !layout_.is_checkpoint_layer(layer)) continue;
    const std::vector<StagedPage>& list = checkpoints ? rebuilt_ : streamed_;
    const int64_t bytes = checkpoints ? checkpoint_layer_bytes_ : layer_bytes_;
    std::vector<KvTier*> tiers;
    for (const StagedPage& st : list) {
      KvTier* tier = PageOf(st).tier;
      if (std::find(tiers.begin(), tiers.end(), tier) == tiers.end()) tiers.push_back(tier);
    }
    for (KvTier* tier : tiers) {
      PendingRead read;
      read.checkpoints = checkpoints;
      std::vector<PageRead> reads;
      for (size_t i = 0; i < list.size(); ++i) {
        const KvPage& page = PageOf(list[i]);
        if (page.tier != tier) continue;
        uint8_t* out = checkpoints ? checkpoint_stage_[buffer].data() + static_cast<int64_t>(i) * bytes
                                   : StageData(layer, static_cast<int64_t>(i));
        reads.push_back({LayerKeyOf(page, layer), std::span<uint8_t>(out, static_cast<size_t>(bytes))});
        read.stage_indices.push_back(static_cast<int64_t>(i));
      }
      read.result = tier->GetAsync(std::move(reads));
      pending_[buffer].push_back(std::move(read));
    }
  }
}

KvLayerRebuild KvPager::BeginLayer(int64_t layer) {
  // Pages read in place: this layer's rows where the tier holds them. A page the tier no longer
  // has (evicted to make room for another) reads as dropped, and its sequence is recomputed.
  for (const StagedPage& st : in_place_) {
    KvPage& page = PageOf(st);
    page.in_place_rows = page.tier->PeekPage(LayerKeyOf(page, layer), layer_bytes_);
    if (page.in_place_rows != nullptr) continue;
    page.read_failed = true;
    // Never found again by a lookup: the sequence is recomputed, not sent back to this page.
    if (page.content.valid()) store_->Forget(page.tier, page.content);
    if (std::find(failed_.begin(), failed_.end(), st.seq) == failed_.end()) failed_.push_back(st.seq);
    ++stats_.stream_read_failures;
  }
  stats_.layers_streamed += static_cast<int64_t>(in_place_.size());
  if (streamed_.empty() && rebuilt_.empty()) return {};
  const int buffer = static_cast<int>(layer % 2);
  KVL_CHECK_MSG(pending_layer_[buffer] == layer, "layers must be begun in order");
  const auto start = std::chrono::steady_clock::now();
  for (PendingRead& read : pending_[buffer]) {
    const std::vector<Status> statuses = read.result.get();
    for (size_t i = 0; i < statuses.size(); ++i) {
      if (statuses[i].ok()) continue;
      // Never wrong bytes: the page reads as dropped this step, and the caller throws the
      // sequence's step away and recomputes its KV (EndStep).
      const std::vector<StagedPage>& list = read.checkpoints ? rebuilt_ : streamed_;
      const StagedPage& st = list[static_cast<size_t>(read.stage_indices[i])];
      KvPage& page = PageOf(st);
      page.read_failed = true;
      if (page.content.valid()) store_->Forget(page.tier, page.content);
      if (std::find(failed_.begin(), failed_.end(), st.seq) == failed_.end()) failed_.push_back(st.seq);
      ++stats_.stream_read_failures;
    }
  }
  pending_[buffer].clear();
  const auto read_done = std::chrono::steady_clock::now();
  stats_.stream_wait_ms += std::chrono::duration<double, std::milli>(read_done - start).count();
  stats_.layers_streamed += static_cast<int64_t>(streamed_.size());
  const KvLayerRebuild rebuild = RebuildOfLayer(layer, buffer);
  // The next layer streams in while this one computes.
  if (layer + 1 < layout_.num_layers) IssueLayerRead(layer + 1);
  return rebuild;
}

// Every rebuilt page's rows of this layer, for the forward pass to compute in the step (a failed
// page is computed from whatever its buffer holds, but reads as dropped and its step is
// discarded): from the layer's checkpoints, or from the residual the forward pass carried from the
// layer before. Where the next layer has no checkpoint the forward pass runs this layer whole for
// the pages' tokens: attention at this layer sees every earlier position, and every page of the
// step's sequences has its rows of this layer in place by then (resident, streamed, read in place,
// or rebuilt in the same layer), so no page waits on another.
KvLayerRebuild KvPager::RebuildOfLayer(int64_t layer, int buffer) {
  KvLayerRebuild r;
  // A windowed layer's rows live in the window rings (kvl/kv_window_release.h), not the pages.
  if (rebuilt_.empty() || !layout_.in_block(layer)) return r;
  r.rows = static_cast<int64_t>(rebuilt_.size()) * layout_.block_tokens;
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
  stats_.layers_rebuilt += static_cast<int64_t>(rebuilt_.size());
  if (r.advance) stats_.layers_advanced += static_cast<int64_t>(rebuilt_.size());
  return r;
}

std::span<const SeqId> KvPager::EndStep() {
  // A run that stopped early (it never does today) must not leave reads behind.
  for (auto& buffer : pending_) {
    for (PendingRead& read : buffer) read.result.wait();
    buffer.clear();
  }
  streamed_.clear();
  in_place_.clear();
  rebuilt_.clear();
  return failed_;
}

KvCache::Rows KvPager::RowsAt(int32_t seq, int64_t block_index, int64_t layer, int64_t offset) {
  const KvPage& page = Bound(seq).pages[static_cast<size_t>(block_index)];
  KvCache::Rows rows;
  rows.count = layout_.block_tokens - offset;
  switch (page.fate) {
    case KvPageFate::kCompressed:
      rows.kind = KvCache::Rows::Kind::kCompressed;
      rows.page = LayerView(page.codec, slabs_.SlotData(page.codec, page.slots[static_cast<size_t>(layer)]),
                            layout_.block_tokens, layout_.kv_dim);
      rows.first_row = offset;
      return rows;
    case KvPageFate::kInTier: {
      if (page.read_failed) {
        rows.kind = KvCache::Rows::Kind::kDropped;
        return rows;
      }
      // Attention only reads the rows (DenseRows takes them as mutable for the pool's sake).
      uint8_t* data = page.in_place ? const_cast<uint8_t*>(page.in_place_rows)
                                    : StageData(layer, page.stage_index);
      return DenseRows(layout_, data, data + layout_.layer_k_bytes(), offset);
    }
    case KvPageFate::kCheckpointed: {
      if (page.read_failed) {
        rows.kind = KvCache::Rows::Kind::kDropped;
        return rows;
      }
      const int64_t i = page.stage_index;
      return DenseRows(layout_, rebuilt_k_.data() + i * layout_.layer_k_bytes(),
                       rebuilt_v_.data() + i * layout_.layer_v_bytes(), offset);
    }
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

}  // namespace kvl
