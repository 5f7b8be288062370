// KvPager bringing pages back into the pool: a resume's restore, the pages an admission reads in
// place or settles, and PromoteBack, where a running sequence's pages that left the pool
// losslessly (a tier, or residual checkpoints) come back into fresh blocks once the pool has
// blocks to spare, so that the steps after read them in the pool instead of from their tier at
// every step.
#include <chrono>

#include "kv_layer_streamer.h"
#include "kv_tier_mover.h"
#include "kvl/kv_pager.h"

namespace kvl {
namespace {

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int64_t KvPager::RestorePages(SeqId seq, int64_t first_block, int64_t num_blocks,
                              std::vector<double>* page_ms) {
  KvSequencePages& s = table_.Bound(seq);
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
  if (!mover_->ReadIntoBlock(block, page, residual).ok()) return BringBack::kReadFailed;
  if (residual) {
    if (!streamer_->RebuildBlock(seq, block, block_index)) return BringBack::kNeedsEarlierPages;
  } else if (layout_.residual_dim > 0) {
    page.checkpoint_missing = true;  // only K/V came back
    manager_.MarkCheckpointsMissing(block);
  }
  return BringBack::kDone;
}

int64_t KvPager::PromoteBack(KvPagePlan& plan) {
  KVL_CHECK_MSG(plan.state_version == manager_.state_version(),
                "a promotion plan made against an older state of the pool");
  int64_t promoted = 0;
  for (KvPageAction& a : plan.actions) {
    a.applied = false;
    a.failed = false;
    KvPage& page = table_.Existing(a.seq, a.block_index);
    KVL_CHECK_MSG((page.fate == KvPageFate::kInTier || page.fate == KvPageFate::kCheckpointed) &&
                      !page.awaiting_restore,
                  "only a running sequence's page in a tier or checkpoints can be promoted back");
    const BlockId next = manager_.next_free_block();
    if (next == kNoBlock) break;
    const auto start = std::chrono::steady_clock::now();
    // The block may hold a cached page the prefix cache still finds: it goes to the store first,
    // as any block reused for new contents does.
    SpillFreeBlock(next);
    const BlockId block = manager_.Reattach(a.seq, a.block_index);
    KVL_CHECK(block == next);
    const BringBack result = BringIntoBlock(a.seq, a.block_index, block, page);
    if (result != BringBack::kDone) {
      // The page stays where it was and attention goes on reading it there; whatever the read
      // left in the block is never seen (it goes back to the pool with no identity).
      manager_.Detach(a.seq, a.block_index, /*lossless=*/true);
      a.failed = result == BringBack::kReadFailed;
      if (a.failed) ++promote_read_failures_;
      continue;
    }
    manager_.RestoreIdentity(a.seq, a.block_index);
    ReleasePage(page);  // let go from its tier (the store's pages stay cached there); resident
    a.applied = true;
    a.measured_ms = MillisecondsSince(start);
    ++promoted_back_pages_;
    ++promoted;
  }
  return promoted;
}

void KvPager::ReadInPlace(SeqId seq, int64_t first_block, int64_t num_blocks) {
  KvSequencePages& s = table_.Bound(seq);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  for (int64_t b = first_block; b < first_block + num_blocks; ++b) {
    KvPage& page = s.pages[static_cast<size_t>(b)];
    KVL_CHECK(page.awaiting_restore && page.fate == KvPageFate::kInTier && page.store_pin &&
              table[static_cast<size_t>(b)] == kNoBlock);
    page.awaiting_restore = false;
    // A RAM tier's page is read where it lies; a disk tier's is streamed into the staging at
    // each step, as a demoted page is (the admission counted it against the staging's room).
    page.in_place = page.tier->reads_in_place();
    table_.Hold(page);
  }
}

void KvPager::SettleRestoredPages(SeqId seq) {
  KvSequencePages& s = table_.Bound(seq);
  const std::vector<BlockId>& table = manager_.block_table(seq);
  for (size_t b = 0; b < s.pages.size() && b < table.size(); ++b) {
    KvPage& page = s.pages[b];
    // A page dropped at a preemption that has its block again is recomputed into it by this step
    // (or found by prefix): resident from now on, and a candidate for relief like any other.
    if (page.fate == KvPageFate::kDropped && table[b] != kNoBlock) KvPageTable::MakeResident(page);
    if (!page.awaiting_restore) continue;
    KVL_CHECK(table[b] != kNoBlock);
    mover_->LetGo(page);
    KvPageTable::MakeResident(page);
  }
}

}  // namespace kvl
