#include "block_pool.h"

#include <fmt/format.h>

namespace kvl::kv_internal {

BlockPool::BlockPool(int32_t num_blocks)
    : refcount_(static_cast<size_t>(num_blocks), 0),
      prev_(static_cast<size_t>(num_blocks), kNoBlock),
      next_(static_cast<size_t>(num_blocks), kNoBlock) {
  for (BlockId b = 0; b < num_blocks; ++b) PushBack(b);
}

void BlockPool::Acquire(BlockId block) {
  KVL_CHECK(refcount_[block] == 0);
  Unlink(block);
  refcount_[block] = 1;
}

void BlockPool::Ref(BlockId block) {
  KVL_CHECK(refcount_[block] > 0);
  ++refcount_[block];
}

bool BlockPool::Unref(BlockId block, bool keep_longer) {
  KVL_CHECK(refcount_[block] > 0);
  if (--refcount_[block] > 0) return false;
  if (keep_longer) {
    PushBack(block);
  } else {
    PushFront(block);
  }
  return true;
}

void BlockPool::MoveToFront(BlockId block) {
  KVL_CHECK(refcount_[block] == 0);
  Unlink(block);
  PushFront(block);
}

void BlockPool::Unlink(BlockId block) {
  const BlockId prev = prev_[block], next = next_[block];
  (prev == kNoBlock ? head_ : next_[prev]) = next;
  (next == kNoBlock ? tail_ : prev_[next]) = prev;
  prev_[block] = next_[block] = kNoBlock;
  --num_free_;
}

void BlockPool::PushFront(BlockId block) {
  prev_[block] = kNoBlock;
  next_[block] = head_;
  (head_ == kNoBlock ? tail_ : prev_[head_]) = block;
  head_ = block;
  ++num_free_;
}

void BlockPool::PushBack(BlockId block) {
  next_[block] = kNoBlock;
  prev_[block] = tail_;
  (tail_ == kNoBlock ? head_ : next_[tail_]) = block;
  tail_ = block;
  ++num_free_;
}

Status BlockPool::CheckFreeList() const {
  const int32_t n = num_blocks();
  std::vector<char> seen(static_cast<size_t>(n), 0);
  int32_t count = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = head_; b != kNoBlock; prev = b, b = next_[b]) {
    if (b < 0 || b >= n) return InternalError(fmt::format("free list holds bad block id {}", b));
    if (seen[b]) return InternalError(fmt::format("block {} is twice in the free list", b));
    seen[b] = 1;
    if (prev_[b] != prev) {
      return InternalError(
          fmt::format("block {}: prev link {} but reached from {}", b, prev_[b], prev));
    }
    if (refcount_[b] != 0) {
      return InternalError(
          fmt::format("block {} is free and in use (refcount {})", b, refcount_[b]));
    }
    if (++count > n) return InternalError("free list is longer than the pool");
  }
  if (tail_ != prev)
    return InternalError(fmt::format("free list tail {} but ends at {}", tail_, prev));
  if (count != num_free_) {
    return InternalError(fmt::format("free list has {} blocks, counter says {}", count, num_free_));
  }
  for (BlockId b = 0; b < n; ++b) {
    if (refcount_[b] < 0)
      return InternalError(fmt::format("block {} refcount {}", b, refcount_[b]));
    if (refcount_[b] == 0 && !seen[b]) {
      return InternalError(fmt::format("block {} has refcount 0 but is not in the free list", b));
    }
    if (refcount_[b] > 0 && (prev_[b] != kNoBlock || next_[b] != kNoBlock)) {
      return InternalError(fmt::format("block {} is in use but still linked", b));
    }
  }
  return Status::Ok();
}

}  // namespace kvl::kv_internal
