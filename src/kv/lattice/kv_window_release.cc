// KvWindowRelease: the local layers' rows of each sequence slot in a ring, released as it turns,
// and the exact rebuild of a window a cached prefix no longer holds (kvl/kv_window_release.h).
#include "kvl/kv_window_release.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvl {

int64_t KvWindowShape::num_local_layers() const {
  return std::count(layer_is_local.begin(), layer_is_local.end(), true);
}

int64_t WindowRingBytes(const KvWindowShape& shape, const KvBlockLayout& layout,
                        int32_t max_seqs) {
  const int64_t rows = shape.ring_tokens() * shape.num_local_layers();
  return static_cast<int64_t>(max_seqs) * rows * (layout.k_row_bytes() + layout.v_row_bytes());
}

StatusOr<std::unique_ptr<KvWindowRelease>> KvWindowRelease::Create(const KvWindowShape& shape,
                                                                   const KvBlockLayout& layout,
                                                                   int32_t max_seqs) {
  if (!shape.releases() || shape.max_run_tokens <= 0 || max_seqs <= 0 ||
      static_cast<int64_t>(shape.layer_is_local.size()) != layout.num_layers) {
    return InvalidArgumentError(fmt::format(
        "a window ring needs a window ({}), local layers ({} of {} flags for {} layers), run "
        "tokens ({}) and slots ({})",
        shape.window, shape.num_local_layers(), shape.layer_is_local.size(), layout.num_layers,
        shape.max_run_tokens, max_seqs));
  }
  return std::unique_ptr<KvWindowRelease>(new KvWindowRelease(shape, layout, max_seqs));
}

KvWindowRelease::KvWindowRelease(const KvWindowShape& shape, const KvBlockLayout& layout,
                                 int32_t max_seqs)
    : shape_(shape), layout_(layout), ring_tokens_(shape.ring_tokens()) {
  int64_t next = 0;
  for (bool local : shape.layer_is_local) local_index_.push_back(local ? next++ : -1);
  layer_bytes_ = ring_tokens_ * (layout.k_row_bytes() + layout.v_row_bytes());
  ring_.assign(static_cast<size_t>(WindowRingBytes(shape, layout, max_seqs)), 0);
  held_.assign(static_cast<size_t>(max_seqs), Held{});
  stats_.ring_bytes = bytes();
}

uint8_t* KvWindowRelease::KeyRow(SeqId seq, int64_t local, int64_t pos) {
  const int64_t layers = shape_.num_local_layers();
  uint8_t* layer = ring_.data() + (static_cast<int64_t>(seq) * layers + local) * layer_bytes_;
  return layer + (pos % ring_tokens_) * layout_.k_row_bytes();
}

uint8_t* KvWindowRelease::ValueRow(SeqId seq, int64_t local, int64_t pos) {
  const int64_t layers = shape_.num_local_layers();
  uint8_t* layer = ring_.data() + (static_cast<int64_t>(seq) * layers + local) * layer_bytes_;
  return layer + ring_tokens_ * layout_.k_row_bytes() + (pos % ring_tokens_) * layout_.v_row_bytes();
}

KvCache::Rows KvWindowRelease::RowsAt(SeqId seq, int64_t layer, int64_t pos) {
  KVL_CHECK(seq >= 0 && static_cast<size_t>(seq) < held_.size());
  const int64_t local = local_index_[static_cast<size_t>(layer)];
  KVL_CHECK(local >= 0);
  const Held& h = held_[static_cast<size_t>(seq)];
  KvCache::Rows rows;
  if (pos < h.from) {
    // Released: older than every window this sequence will read again.
    rows.kind = KvCache::Rows::Kind::kDropped;
    rows.count = h.from - pos;
    return rows;
  }
  KVL_CHECK_MSG(pos < h.to, "a local-layer row past what the sequence's runs claimed");
  // Up to the ring's end or the last held row, whichever comes first.
  const int64_t count = std::min(h.to - pos, ring_tokens_ - pos % ring_tokens_);
  rows = DenseRows(layout_, KeyRow(seq, local, pos), ValueRow(seq, local, pos), 0);
  rows.count = count;
  return rows;
}

void KvWindowRelease::StartSequence(SeqId seq) { held_[static_cast<size_t>(seq)] = Held{}; }

void KvWindowRelease::ClaimRun(SeqId seq, int64_t from, int64_t to) {
  KVL_CHECK(from >= 0 && to > from);
  KVL_CHECK_MSG(to - from <= shape_.max_run_tokens,
                "a forward run writes more of one sequence than its window ring holds");
  Held& h = held_[static_cast<size_t>(seq)];
  // A run that starts past what is held (a rebuild from tokens from its receptive field's start)
  // holds nothing before it; one that starts inside rewrites from there (a draft rolled back).
  if (from > h.to || from < h.from) h.from = from;
  h.to = to;
  h.from = std::max(h.from, to - ring_tokens_);
}

bool KvWindowRelease::HoldsWindow(SeqId seq, int64_t n) const {
  if (n == 0) return true;
  const Held& h = held_[static_cast<size_t>(seq)];
  return h.to >= n && h.from <= std::max<int64_t>(0, n - shape_.window + 1) && h.to - h.from > 0;
}

// Exactness, from the top layer down: a local layer l needs its own rows of the window
// [n - window + 1, n), so its input at those positions; its input at q is exact when the layer
// below's input at q is and, if the layer below is local, that layer's rows (q - window, q] are:
// every local layer below adds window - 1 positions. Global layers add none: they read the
// cached K/V, exact, of every position before n.
int64_t KvWindowRelease::RebuildStart(int64_t n) const {
  // The topmost local layer needs its inputs from n - (window - 1) on, the next one down
  // window - 1 before that, and so on.
  return std::max<int64_t>(0, n - shape_.num_local_layers() * (shape_.window - 1));
}

KvWindowRebuild KvWindowRelease::ChooseWindowRebuild(int64_t n, bool residuals_available,
                                                     const KvWindowRebuildPrices& p) const {
  if (n == 0) return KvWindowRebuild::kNone;
  if (!residuals_available) return KvWindowRebuild::kFromTokens;
  const double block = static_cast<double>(std::max<int64_t>(1, p.block_tokens));
  const double local_share = static_cast<double>(shape_.num_local_layers()) /
                             static_cast<double>(std::max<int64_t>(1, p.num_layers));
  const double window_tokens = static_cast<double>(std::min(n, shape_.window - 1));
  const double residual_ms = p.residual_page_ms * window_tokens / block * local_share;
  const double tokens_ms = p.tokens_page_ms * static_cast<double>(n - RebuildStart(n)) / block;
  return residual_ms <= tokens_ms ? KvWindowRebuild::kFromResiduals : KvWindowRebuild::kFromTokens;
}

bool KvWindowRelease::ResidualsCover(const KvManager& manager, KvBlockStorage& storage, SeqId seq,
                                     int64_t n) const {
  const KvBlockLayout& layout = storage.layout();
  if (layout.residual_dim == 0 || layout.checkpoint_every != 1 || n == 0) return false;
  const int64_t first = std::max<int64_t>(0, n - shape_.window + 1);
  const std::vector<BlockId>& table = manager.block_table(seq);
  for (int64_t b = first / layout.block_tokens; b <= (n - 1) / layout.block_tokens; ++b) {
    const BlockId block = table[static_cast<size_t>(b)];
    if (block == kNoBlock || manager.CheckpointsMissing(block)) return false;
  }
  return true;
}

void KvWindowRelease::RebuildFromResiduals(const KvManager& manager, KvBlockStorage& storage,
                                           KvRebuilder& rebuilder, SeqId seq, int64_t n) {
  const int64_t first = std::max<int64_t>(0, n - shape_.window + 1);
  const int64_t count = n - first;
  ClaimRun(seq, first, n);
  if (count == 0) return;

  // One run of ring rows [begin, begin + rows): each local layer's K and V from its checkpoints
  // (every layer keeps them here), written straight into the ring; the global layers rebuild
  // nothing (their rows are the pool's, exact).
  class RingRunSource final : public KvRebuildSource {
   public:
    RingRunSource(KvWindowRelease& release, const KvManager& manager, KvBlockStorage& storage,
                  SeqId seq, int64_t begin, int64_t rows)
        : release_(release), manager_(manager), storage_(storage), seq_(seq), begin_(begin),
          rows_(rows), seq_ids_(static_cast<size_t>(rows), seq) {}
    KvLayerRebuild Layer(int64_t l) override {
      KvLayerRebuild r;
      if (!release_.IsLocal(l)) return r;
      const KvBlockLayout& layout = storage_.layout();
      const int64_t dim = layout.residual_dim;
      release_.checkpoints_.resize(static_cast<size_t>(rows_ * dim));
      release_.positions_.resize(static_cast<size_t>(rows_));
      const std::vector<BlockId>& table = manager_.block_table(seq_);
      for (int64_t i = 0; i < rows_; ++i) {
        const int64_t pos = begin_ + i;
        const BlockId block = table[static_cast<size_t>(pos / layout.block_tokens)];
        std::memcpy(&release_.checkpoints_[static_cast<size_t>(i * dim)],
                    storage_.residuals(block, l) + (pos % layout.block_tokens) * dim,
                    sizeof(float) * static_cast<size_t>(dim));
        release_.positions_[static_cast<size_t>(i)] = pos;
      }
      const int64_t local = release_.local_index_[static_cast<size_t>(l)];
      r.rows = rows_;
      r.positions = release_.positions_.data();
      r.seq_ids = seq_ids_.data();
      r.input = release_.checkpoints_.data();
      r.k_type = layout.k_type;
      r.k_out = release_.KeyRow(seq_, local, begin_);
      r.v_type = layout.v_type;
      r.v_out = release_.ValueRow(seq_, local, begin_);
      release_.stats_.rows_rebuilt += rows_;
      return r;
    }

   private:
    KvWindowRelease& release_;
    const KvManager& manager_;
    KvBlockStorage& storage_;
    SeqId seq_;
    int64_t begin_, rows_;
    std::vector<int32_t> seq_ids_;
  };
  // The ring's rows are contiguous up to its end: at most two runs.
  for (int64_t i = 0; i < count;) {
    const int64_t pos = first + i;
    const int64_t m = std::min(count - i, ring_tokens_ - pos % ring_tokens_);
    RingRunSource source(*this, manager, storage, seq, pos, m);
    rebuilder.Rebuild(source, nullptr);
    i += m;
  }
  ++stats_.rebuilds_from_residuals;
}

void KvWindowRelease::CountTokenRebuild(int64_t tokens) {
  ++stats_.rebuilds_from_tokens;
  stats_.tokens_rebuilt += tokens;
}

}  // namespace kvl
