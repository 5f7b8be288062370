#include "kvl/kv_pager.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kvl/ops.h"

namespace kvl {

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
      seqs_(static_cast<size_t>(max_seqs)) {
  encode_scratch_.resize(static_cast<size_t>(
      CompressedPageBytes(KvCodecType::kInt8, layout_.block_tokens, layout_.num_layers,
                          layout_.kv_dim)));
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

void KvPager::StartSequence(SeqId seq) {
  SeqPages& s = seqs_[static_cast<size_t>(seq)];
  KVL_CHECK(s.pages.empty());
  s.mass.assign(static_cast<size_t>(max_context_), 0.0f);
  s.steps = 0;
  s.filled_at_step.clear();
}

void KvPager::ReleasePage(Page& page) {
  switch (page.fate) {
    case Fate::kCompressed:
      slabs_.Free(page.codec, page.slots);
      --stats_.compressed_pages;
      break;
    case Fate::kStreamed:
      EraseTierPage(page.tier, page.page_id);
      --stats_.streamed_pages;
      break;
    case Fate::kRebuilt:
      EraseTierPage(page.tier, page.page_id);
      --stats_.rebuilt_pages;
      break;
    case Fate::kEvicted:
      --stats_.evicted_pages;
      break;
    case Fate::kResident:
      break;
  }
  page = Page{};
}

void KvPager::DropSequence(SeqId seq) {
  SeqPages& s = seqs_[static_cast<size_t>(seq)];
  for (Page& page : s.pages) ReleasePage(page);
  s.pages.clear();
  s.mass.clear();
  s.filled_at_step.clear();
  s.steps = 0;
}

bool KvPager::DetachPage(SeqId seq, int64_t block_index, KvAction action, KvTier* tier) {
  const std::vector<BlockId>& table = manager_.block_table(seq);
  KVL_CHECK(block_index >= 0 && block_index + 1 < static_cast<int64_t>(table.size()));
  const BlockId block = table[static_cast<size_t>(block_index)];
  KVL_CHECK_MSG(block != kNoBlock && manager_.refcount(block) == 1,
                "only a resident page this sequence alone holds can be detached");
  SeqPages& s = seqs_[static_cast<size_t>(seq)];
  if (s.pages.size() <= static_cast<size_t>(block_index)) {
    s.pages.resize(static_cast<size_t>(block_index) + 1);
  }
  Page page;
  const int64_t num_layers = layout_.num_layers;
  switch (action) {
    case KvAction::kCompressInt8:
    case KvAction::kCompressInt4: {
      page.fate = Fate::kCompressed;
      page.codec = action == KvAction::kCompressInt8 ? KvCodecType::kInt8 : KvCodecType::kInt4;
      if (slabs_.slots_per_slab(page.codec) < num_layers) return false;
      // Encode before the block goes back to the pool (a new slab may be that very block).
      const int64_t slot = slabs_.slot_bytes(page.codec);
      encode_scratch_.resize(static_cast<size_t>(slot * num_layers));
      for (int64_t l = 0; l < num_layers; ++l) {
        const float* k = WidenedLayer(storage_.key_bytes(block, l), layout_.k_type, 0);
        const float* v = WidenedLayer(storage_.value_bytes(block, l), layout_.v_type, 1);
        EncodeLayer(page.codec, k, v, layout_.block_tokens, layout_.kv_dim,
                    encode_scratch_.data() + l * slot);
      }
      manager_.Detach(seq, block_index);
      // The block was this sequence's alone, so it is free now and one slab is always there.
      const bool allocated = slabs_.Allocate(page.codec, num_layers, &page.slots);
      KVL_CHECK_MSG(allocated, "no slab right after a block was freed");
      for (int64_t l = 0; l < num_layers; ++l) {
        std::memcpy(slabs_.SlotData(page.codec, page.slots[static_cast<size_t>(l)]),
                    encode_scratch_.data() + l * slot, static_cast<size_t>(slot));
      }
      ++stats_.compressed_pages;
      break;
    }
    case KvAction::kDemoteRam:
    case KvAction::kDemoteDisk: {
      KVL_CHECK(tier != nullptr);
      page.fate = Fate::kStreamed;
      page.tier = tier;
      if (!WriteLayerPages(block, tier, /*residual=*/false, &page.page_id)) return false;
      manager_.Detach(seq, block_index);
      ++stats_.streamed_pages;
      break;
    }
    case KvAction::kRecomputeResidual: {
      KVL_CHECK(tier != nullptr && layout_.residual_dim > 0 && rebuild_);
      page.fate = Fate::kRebuilt;
      page.tier = tier;
      if (!WriteLayerPages(block, tier, /*residual=*/true, &page.page_id)) return false;
      manager_.Detach(seq, block_index);
      ++stats_.rebuilt_pages;
      break;
    }
    case KvAction::kEvict:
      page.fate = Fate::kEvicted;
      manager_.Detach(seq, block_index);
      ++stats_.evicted_pages;
      break;
    default:
      KVL_CHECK_MSG(false, "not an action on a running sequence's page");
  }
  s.pages[static_cast<size_t>(block_index)] = std::move(page);
  return true;
}

bool KvPager::EvictCompressedPage(SeqId seq, int64_t block_index) {
  if (!IsCompressed(seq, block_index)) return false;
  Page& page = seqs_[static_cast<size_t>(seq)].pages[static_cast<size_t>(block_index)];
  ReleasePage(page);
  page.fate = Fate::kEvicted;
  ++stats_.evicted_pages;
  return true;
}

bool KvPager::IsCompressed(SeqId seq, int64_t block_index) const {
  const SeqPages& s = seqs_[static_cast<size_t>(seq)];
  return static_cast<size_t>(block_index) < s.pages.size() &&
         s.pages[static_cast<size_t>(block_index)].fate == Fate::kCompressed;
}

bool KvPager::WriteLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t* page_id) {
  const int64_t num_layers = layout_.num_layers;
  const size_t residual_bytes =
      static_cast<size_t>(layout_.block_tokens * layout_.residual_dim) * sizeof(float);
  std::vector<uint8_t>& bytes = page_scratch_;
  std::vector<PageWrite> writes;
  const uint64_t id = next_page_id_++;
  if (residual) {
    for (int64_t l = 0; l < num_layers; ++l) {
      const auto* data = reinterpret_cast<const uint8_t*>(storage_.residuals(block, l));
      writes.push_back({KeyOf(id, l), std::span<const uint8_t>(data, residual_bytes)});
    }
  } else {
    // One layer page = K rows then V rows; staged so each is one contiguous write.
    bytes.resize(static_cast<size_t>(layer_bytes_ * num_layers));
    for (int64_t l = 0; l < num_layers; ++l) {
      uint8_t* out = bytes.data() + l * layer_bytes_;
      std::memcpy(out, storage_.key_bytes(block, l), static_cast<size_t>(layout_.layer_k_bytes()));
      std::memcpy(out + layout_.layer_k_bytes(), storage_.value_bytes(block, l),
                  static_cast<size_t>(layout_.layer_v_bytes()));
      writes.push_back({KeyOf(id, l), std::span<const uint8_t>(out, static_cast<size_t>(layer_bytes_))});
    }
  }
  if (!tier->Put(writes).ok()) return false;  // a full tier stores none of them
  *page_id = id;
  return true;
}

Status KvPager::ReadLayerPages(BlockId block, KvTier* tier, bool residual,
                                       uint64_t page_id) {
  const int64_t num_layers = layout_.num_layers;
  const size_t residual_bytes =
      static_cast<size_t>(layout_.block_tokens * layout_.residual_dim) * sizeof(float);
  std::vector<uint8_t>& bytes = page_scratch_;
  std::vector<PageRead> reads;
  if (residual) {
    for (int64_t l = 0; l < num_layers; ++l) {
      auto* data = reinterpret_cast<uint8_t*>(storage_.residuals(block, l));
      reads.push_back({KeyOf(page_id, l), std::span<uint8_t>(data, residual_bytes)});
    }
  } else {
    bytes.resize(static_cast<size_t>(layer_bytes_ * num_layers));
    for (int64_t l = 0; l < num_layers; ++l) {
      reads.push_back({KeyOf(page_id, l), std::span<uint8_t>(bytes.data() + l * layer_bytes_,
                                                             static_cast<size_t>(layer_bytes_))});
    }
  }
  for (const Status& status : tier->Get(reads)) KVL_RETURN_IF_ERROR(status);
  if (!residual) {
    for (int64_t l = 0; l < num_layers; ++l) {
      const uint8_t* in = bytes.data() + l * layer_bytes_;
      std::memcpy(storage_.key_bytes(block, l), in, static_cast<size_t>(layout_.layer_k_bytes()));
      std::memcpy(storage_.value_bytes(block, l), in + layout_.layer_k_bytes(),
                  static_cast<size_t>(layout_.layer_v_bytes()));
    }
  }
  return Status::Ok();
}

void KvPager::EraseTierPage(KvTier* tier, uint64_t page_id) {
  std::vector<PageKey> keys;
  for (int64_t l = 0; l < layout_.num_layers; ++l) keys.push_back(KeyOf(page_id, l));
  tier->Erase(keys);
}

void KvPager::BeginStep(std::span<const SeqId> seqs) {
  streamed_.clear();
  rebuilt_.clear();
  failed_.clear();
  for (SeqId seq : seqs) {
    SeqPages& s = seqs_[static_cast<size_t>(seq)];
    ++s.steps;
    const int64_t full_blocks = manager_.num_tokens(seq) / layout_.block_tokens;
    if (static_cast<int64_t>(s.filled_at_step.size()) < full_blocks) {
      s.filled_at_step.resize(static_cast<size_t>(full_blocks), s.steps);
    }
    for (size_t b = 0; b < s.pages.size(); ++b) {
      Page& page = s.pages[b];
      page.read_failed = false;
      std::vector<StagedPage>* list = page.fate == Fate::kStreamed ? &streamed_
                                    : page.fate == Fate::kRebuilt ? &rebuilt_
                                                                  : nullptr;
      if (list == nullptr) continue;
      page.stage_index = static_cast<int64_t>(list->size());
      list->push_back({seq, static_cast<int64_t>(b)});
    }
  }
  if (streamed_.empty() && rebuilt_.empty()) return;
  const size_t bytes = streamed_.size() * static_cast<size_t>(layer_bytes_);
  const size_t checkpoint_bytes = rebuilt_.size() * static_cast<size_t>(checkpoint_layer_bytes_);
  for (int i = 0; i < 2; ++i) {
    if (stage_[i].size() < bytes) stage_[i].resize(bytes);
    if (checkpoint_stage_[i].size() < checkpoint_bytes) checkpoint_stage_[i].resize(checkpoint_bytes);
  }
  const size_t rows = rebuilt_.size() * static_cast<size_t>(layout_.block_tokens);
  rebuilt_positions_.resize(rows);
  for (size_t i = 0; i < rebuilt_.size(); ++i) {
    for (int64_t t = 0; t < layout_.block_tokens; ++t) {
      rebuilt_positions_[i * static_cast<size_t>(layout_.block_tokens) + static_cast<size_t>(t)] =
          rebuilt_[i].block_index * layout_.block_tokens + t;
    }
  }
  rebuilt_k_.resize(static_cast<size_t>(layout_.layer_k_bytes()) * rebuilt_.size());
  rebuilt_v_.resize(static_cast<size_t>(layout_.layer_v_bytes()) * rebuilt_.size());
  stats_.staging_bytes = static_cast<int64_t>(stage_[0].size() + stage_[1].size() +
                                              checkpoint_stage_[0].size() +
                                              checkpoint_stage_[1].size() + rebuilt_k_.size() +
                                              rebuilt_v_.size());
  pending_layer_[0] = pending_layer_[1] = -1;
  IssueLayerRead(0);
}

KvPager::Page& KvPager::PageOf(const StagedPage& st) {
  return seqs_[static_cast<size_t>(st.seq)].pages[static_cast<size_t>(st.block_index)];
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
        const Page& page = PageOf(list[i]);
        if (page.tier != tier) continue;
        uint8_t* out = checkpoints ? checkpoint_stage_[buffer].data() + static_cast<int64_t>(i) * bytes
                                   : StageData(layer, static_cast<int64_t>(i));
        reads.push_back({KeyOf(page.page_id, layer), std::span<uint8_t>(out, static_cast<size_t>(bytes))});
        read.stage_indices.push_back(static_cast<int64_t>(i));
      }
      read.result = tier->GetAsync(std::move(reads));
      pending_[buffer].push_back(std::move(read));
    }
  }
}

void KvPager::BeginLayer(int64_t layer) {
  if (streamed_.empty() && rebuilt_.empty()) return;
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
      PageOf(st).read_failed = true;
      if (std::find(failed_.begin(), failed_.end(), st.seq) == failed_.end()) failed_.push_back(st.seq);
      ++stats_.stream_read_failures;
    }
  }
  pending_[buffer].clear();
  const auto read_done = std::chrono::steady_clock::now();
  stats_.stream_wait_ms += std::chrono::duration<double, std::milli>(read_done - start).count();
  stats_.layers_streamed += static_cast<int64_t>(streamed_.size());
  if (!rebuilt_.empty()) {
    // Every rebuilt page's K and V of this layer in one batch (a failed page rebuilds from
    // whatever its buffer holds, but reads as dropped and its step is discarded).
    rebuild_(layer, reinterpret_cast<const float*>(checkpoint_stage_[buffer].data()),
             rebuilt_positions_.data(), static_cast<int64_t>(rebuilt_positions_.size()),
             rebuilt_k_.data(), rebuilt_v_.data());
    stats_.layers_rebuilt += static_cast<int64_t>(rebuilt_.size());
    stats_.rebuild_ms += std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - read_done).count();
  }
  // The next layer streams in while this one computes.
  if (layer + 1 < layout_.num_layers) IssueLayerRead(layer + 1);
}

std::vector<SeqId> KvPager::EndStep() {
  // A run that stopped early (it never does today) must not leave reads behind.
  for (auto& buffer : pending_) {
    for (PendingRead& read : buffer) read.result.wait();
    buffer.clear();
  }
  streamed_.clear();
  rebuilt_.clear();
  return failed_;
}

KvCache::Rows KvPager::RowsAt(int32_t seq, int64_t block_index, int64_t layer, int64_t offset) {
  const Page& page = seqs_[static_cast<size_t>(seq)].pages[static_cast<size_t>(block_index)];
  KvCache::Rows rows;
  rows.count = layout_.block_tokens - offset;
  switch (page.fate) {
    case Fate::kCompressed:
      rows.kind = KvCache::Rows::Kind::kCompressed;
      rows.page = LayerView(page.codec, slabs_.SlotData(page.codec, page.slots[static_cast<size_t>(layer)]),
                            layout_.block_tokens, layout_.kv_dim);
      rows.first_row = offset;
      return rows;
    case Fate::kStreamed: {
      if (page.read_failed) {
        rows.kind = KvCache::Rows::Kind::kDropped;
        return rows;
      }
      uint8_t* data = StageData(layer, page.stage_index);
      return DenseRows(layout_, data, data + layout_.layer_k_bytes(), offset);
    }
    case Fate::kRebuilt: {
      if (page.read_failed) {
        rows.kind = KvCache::Rows::Kind::kDropped;
        return rows;
      }
      const int64_t i = page.stage_index;
      return DenseRows(layout_, rebuilt_k_.data() + i * layout_.layer_k_bytes(),
                       rebuilt_v_.data() + i * layout_.layer_v_bytes(), offset);
    }
    case Fate::kEvicted:
      rows.kind = KvCache::Rows::Kind::kDropped;
      return rows;
    case Fate::kResident:
      break;
  }
  KVL_CHECK_MSG(false, "a hole in the block table that the pager does not know");
  return rows;
}

float* KvPager::AttentionMass(int32_t seq) {
  std::vector<float>& mass = seqs_[static_cast<size_t>(seq)].mass;
  return track_attention_ && !mass.empty() ? mass.data() : nullptr;
}

double KvPager::PageMass(SeqId seq, int64_t block_index) const {
  const SeqPages& s = seqs_[static_cast<size_t>(seq)];
  if (s.mass.empty()) return 0;
  const int64_t first = block_index * layout_.block_tokens;
  double sum = 0;
  for (int64_t p = first; p < first + layout_.block_tokens; ++p) sum += s.mass[static_cast<size_t>(p)];
  const int64_t since = static_cast<size_t>(block_index) < s.filled_at_step.size()
                            ? s.steps - s.filled_at_step[static_cast<size_t>(block_index)] + 1
                            : 1;
  return sum / static_cast<double>(std::max<int64_t>(1, since));
}

bool KvPager::IsDetached(SeqId seq, int64_t block_index) const {
  const SeqPages& s = seqs_[static_cast<size_t>(seq)];
  return static_cast<size_t>(block_index) < s.pages.size() &&
         s.pages[static_cast<size_t>(block_index)].fate != Fate::kResident;
}

int64_t KvPager::steps(SeqId seq) const { return seqs_[static_cast<size_t>(seq)].steps; }

KvPagerStats KvPager::stats() const {
  KvPagerStats st = stats_;
  st.slab_blocks = slabs_.num_slabs();
  st.compressed_bytes = slabs_.bytes_used();
  return st;
}

}  // namespace kvl
