// Reference counts and the free list of the KV block pool. The free list is an intrusive doubly
// linked list over int32 arrays (no node allocation): its order is the eviction order, the front
// is taken first.
//
// Thread-safety: none; owned by KvManager.
#pragma once

#include <cstdint>
#include <vector>

#include "kvl/kv_manager.h"
#include "kvl/status.h"

namespace kvl::kv_internal {

class BlockPool {
 public:
  // All blocks start free, in id order.
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t refcount(BlockId block) const { return refcount_[block]; }

  // Walking the free list: front to back is the order blocks are taken.
  BlockId free_front() const { return head_; }
  BlockId free_back() const { return tail_; }
  BlockId next_free(BlockId block) const { return next_[block]; }

  // Takes a free block out of the free list and gives it its first reference.
  void Acquire(BlockId block);
  // One more reference to a block in use.
  void Ref(BlockId block);
  // Drops a reference. A block nobody holds goes to the back of the free list when `keep_longer`
  // (it holds a cached prefix worth keeping) and to the front otherwise. Returns true when the
  // block became free.
  bool Unref(BlockId block, bool keep_longer);
  // Moves a free block to the front (it no longer holds anything worth keeping).
  void MoveToFront(BlockId block);

  // The free list is well formed: links agree both ways, it has num_free() blocks, each exactly
  // once, and a block is in it iff its refcount is 0 (refcounts are never negative).
  Status CheckFreeList() const;

 private:
  void Unlink(BlockId block);
  void PushFront(BlockId block);
  void PushBack(BlockId block);

  std::vector<int32_t> refcount_;
  std::vector<BlockId> prev_;  // free list links; kNoBlock at the ends and for blocks in use
  std::vector<BlockId> next_;
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  int32_t num_free_ = 0;
};

}  // namespace kvl::kv_internal
