// The tier mover: every byte a page moves between its pool block and a tier, whole pages at a
// time. One of the pager's parts (KvPager owns it): it writes a page leaving the pool into a
// tier (the KV store's, under the page's content id, or the pager's own under a private page id),
// reads one back into a block, lets a tier page go, and writes pages through to the store (at the
// end of a request, for pages the prefix index cannot reach, and for pool blocks about to be
// reused). It changes no page's fate: the pager does, with what the mover reports.
//
// A tier page is one layer of a page (K rows then V rows at the cache's element type, or one
// layer of residual checkpoints), so that the layer streamer (kv_layer_streamer.h) can fetch
// exactly the layer a step is about to read.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvl/kv_manager.h"
#include "kvl/kv_page_table.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"
#include "kvl/status.h"

namespace kvl {

class KvTierMover {
 public:
  KvTierMover(const KvManager& manager, KvBlockStorage& storage);

  void set_tiers(KvTiers tiers) { tiers_ = tiers; }
  void set_store(KvStore* store) { store_ = store; }
  KvStore* store() const { return store_; }
  // The tier an action keeps a page in (demote: its tier; recompute-residual: RAM, for the
  // checkpoints); nullptr for actions that keep nothing in a tier.
  KvTier* TierFor(KvAction action) const;

  // One layer page: K rows then V rows.
  int64_t layer_bytes() const { return layer_bytes_; }
  // One layer of a page's residual checkpoints.
  int64_t checkpoint_layer_bytes() const { return checkpoint_layer_bytes_; }
  // Layers of a page in its tier pages: every layer, or the checkpoint layers (`residual`).
  bool InTierPage(int64_t layer, bool residual) const {
    return !residual || layout_.is_checkpoint_layer(layer);
  }
  // The tier key of one layer of a page held in a tier (the store's, or the pager's own).
  static PageKey LayerKeyOf(const KvPage& page, int64_t layer) {
    return page.content.valid() ? KvStore::LayerKey(page.content, layer)
                                : KeyOf(page.page_id, layer);
  }

  // Page `block_index` of `seq`, in `block`, kept in `tier` (a running page leaving the pool, or a
  // preempted one): in the store when it has a content id and the store covers the tier, else
  // under a fresh private page id. Fills the page's tier fields; false (the page untouched) where
  // the tier is full or failing (last_tier_error says why).
  bool KeepInTier(SeqId seq, int64_t block_index, BlockId block, KvTier* tier, bool residual,
                  KvPage* page);
  // A page held in `page.tier` read back into `block`: its K/V layers, or its checkpoint layers
  // (`residual`). A damaged or partial store page is forgotten by the store, so that it is
  // written afresh rather than found again.
  Status ReadIntoBlock(BlockId block, const KvPage& page, bool residual);
  // Lets go of a page held in a tier: the pager's own pages are erased, the store's stay cached
  // (unpinned).
  void LetGo(const KvPage& page);
  // The pager's own page `page_id` erased from `tier`: its checkpoint layers (`residual`), or
  // every layer.
  void ErasePrivatePage(KvTier* tier, uint64_t page_id, bool residual);
  // A store page that failed its read (checksum, I/O, gone from the tier) is never found again.
  void ForgetDamaged(const KvPage& page);

  // Write-through to the store (see KvPager's methods of the same names).
  int64_t SaveToStore(SeqId seq, const KvSequencePages& pages, KvTier* tier);
  void SaveUnreachablePages(SeqId seq, int64_t first_block, int64_t last_block);
  void SaveBlockToStore(BlockId block, KvContentId content);

  // Why the last page that could not be saved to a tier was refused (OK when none was).
  const Status& last_tier_error() const { return last_tier_error_; }

 private:
  static PageKey KeyOf(uint64_t page_id, int64_t layer) {
    return (page_id << 8) | static_cast<uint64_t>(layer);
  }
  // One layer of a page as the tier stores it: K rows then V rows (adjacent in the block), or the
  // layer's residual checkpoints.
  std::span<uint8_t> LayerPageSpan(BlockId block, int64_t layer, bool residual);
  // A whole page saved in a tier as one tier page per layer under a fresh private page id.
  bool WriteLayerPages(BlockId block, KvTier* tier, bool residual, uint64_t* page_id);

  const KvManager& manager_;
  KvBlockStorage& storage_;
  KvBlockLayout layout_;
  int64_t layer_bytes_;
  int64_t checkpoint_layer_bytes_;
  KvTiers tiers_;
  KvStore* store_ = nullptr;
  // Private page ids start at a random point (FirstPageId): a Redis tier is shared by processes,
  // and two engines numbering their private pages from 1 under one scope would overwrite each
  // other's pages with bytes that pass the checksum (it is seeded by the key, not the writer).
  uint64_t next_page_id_;
  // One transfer's layer pages, reused.
  std::vector<PageWrite> write_list_;
  std::vector<PageRead> read_list_;
  std::vector<PageKey> erase_list_;
  Status last_tier_error_;
};

}  // namespace kvl
