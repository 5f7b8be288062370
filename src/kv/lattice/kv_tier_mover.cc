#include "kv_tier_mover.h"

#include <fmt/format.h>

#include <functional>
#include <random>

namespace kvl {
namespace {

// A random id below 2^47: a process's pages take ids upwards from it (KeyOf keeps 56 bits of the
// id), so two processes' ranges meet only if they started within the pages they use of each
// other, about 1 in 2^47 / pages.
uint64_t FirstPageId() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  return (bits & ((uint64_t{1} << 47) - 1)) | 1;
}

}  // namespace

KvTierMover::KvTierMover(const KvManager& manager, KvBlockStorage& storage)
    : manager_(manager),
      storage_(storage),
      layout_(storage.layout()),
      layer_bytes_(layout_.layer_k_bytes() + layout_.layer_v_bytes()),
      checkpoint_layer_bytes_(layout_.block_tokens * layout_.residual_dim *
                              static_cast<int64_t>(sizeof(float))),
      next_page_id_(FirstPageId()) {
  write_list_.reserve(static_cast<size_t>(layout_.num_layers));
  read_list_.reserve(static_cast<size_t>(layout_.num_layers));
  erase_list_.reserve(static_cast<size_t>(layout_.num_layers));
}

KvTier* KvTierMover::TierFor(KvAction action) const {
  switch (action) {
    case KvAction::kDemoteRam:
    case KvAction::kRecomputeResidual:  // the checkpoints
      return tiers_.ram;
    case KvAction::kDemoteDisk:
      return tiers_.disk;
    case KvAction::kDemoteRedis:
      return tiers_.redis;
    default:
      return nullptr;
  }
}

std::span<uint8_t> KvTierMover::LayerPageSpan(BlockId block, int64_t layer, bool residual) {
  if (residual) {
    return {reinterpret_cast<uint8_t*>(storage_.residuals(block, layer)),
            static_cast<size_t>(checkpoint_layer_bytes_)};
  }
  return {storage_.key_bytes(block, layer), static_cast<size_t>(layer_bytes_)};
}

bool KvTierMover::WriteLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t* page_id) {
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

bool KvTierMover::KeepInTier(SeqId seq, int64_t block_index, BlockId block, KvTier* tier,
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

Status KvTierMover::ReadIntoBlock(BlockId block, const KvPage& page, bool residual) {
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

void KvTierMover::LetGo(const KvPage& page) {
  if (!page.content.valid()) {
    ErasePrivatePage(page.tier, page.page_id, page.fate == KvPageFate::kCheckpointed);
  } else if (page.store_pin) {
    store_->Unpin(page.tier, page.content);
  }
}

void KvTierMover::ErasePrivatePage(KvTier* tier, uint64_t page_id, bool residual) {
  erase_list_.clear();
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    if (InTierPage(l, residual)) erase_list_.push_back(KeyOf(page_id, l));
  }
  tier->Erase(erase_list_);
}

void KvTierMover::ForgetDamaged(const KvPage& page) {
  if (page.content.valid()) store_->Forget(page.tier, page.content);
}

int64_t KvTierMover::SaveToStore(SeqId seq, const KvSequencePages& s, KvTier* tier) {
  if (store_ == nullptr || store_->TierIndex(tier) < 0) return 0;
  const std::vector<BlockId>& table = manager_.block_table(seq);
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

void KvTierMover::SaveUnreachablePages(SeqId seq, int64_t first_block, int64_t last_block) {
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

void KvTierMover::SaveBlockToStore(BlockId block, KvContentId content) {
  if (store_ == nullptr || store_->empty() || !content.valid()) return;
  KvTier* tier = store_->tiers().front().tier;
  const Status status = store_->Save(
      tier, content, manager_.BlockTokens(block),
      [&](int64_t l) -> std::span<const uint8_t> { return LayerPageSpan(block, l, false); });
  if (!status.ok()) last_tier_error_ = status;
}

}  // namespace kvl
