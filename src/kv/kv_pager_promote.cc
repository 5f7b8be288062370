// KvPager::PromoteBack: a running sequence's pages that left the pool losslessly (a tier, or
// residual checkpoints) come back into fresh blocks once the pool has blocks to spare, so that
// the steps after read them in the pool instead of from their tier at every step.
#include "kvl/kv_pager.h"

#include <chrono>

namespace kvl {

int64_t KvPager::PromoteBack(KvPagePlan& plan) {
  KVL_CHECK_MSG(plan.state_version == manager_.state_version(),
                "a promotion plan made against an older state of the pool");
  int64_t promoted = 0;
  for (KvPageAction& a : plan.actions) {
    a.applied = false;
    a.failed = false;
    KvPage& page = Bound(a.seq).pages[static_cast<size_t>(a.block_index)];
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
      if (a.failed) ++stats_.stream_read_failures;
      continue;
    }
    manager_.RestoreIdentity(a.seq, a.block_index);
    ReleasePage(page);  // let go from its tier (the store's pages stay cached there); resident
    a.applied = true;
    a.measured_ms = MillisecondsSince(start);
    ++stats_.promoted_back_pages;
    ++promoted;
  }
  return promoted;
}

}  // namespace kvl
