// The prefix index: block hash -> the block registered under it. Open addressing with linear
// probing over one array sized at construction, because a node-based map allocates a node per
// insert and a decode step registers a block whenever one fills (STYLE.md: no heap allocation in
// the per-token step). At most one entry per block, so the table never grows.
//
// Thread-safety: none; owned by KvManager.
#pragma once

#include <cstdint>
#include <vector>

#include "kvl/kv_manager.h"
#include "kvl/status.h"

namespace kvl::kv_internal {

class PrefixIndex {
 public:
  // Room for max_entries entries at a load factor of at most 1/2.
  explicit PrefixIndex(int32_t max_entries) : max_entries_(max_entries) {
    int bits = 1;
    while ((int64_t{1} << bits) < 2 * static_cast<int64_t>(max_entries)) ++bits;
    shift_ = 64 - bits;
    slots_.resize(size_t{1} << bits);
  }

  int64_t size() const { return size_; }

  // The block registered under hash, or kNoBlock.
  BlockId Find(uint64_t hash) const {
    for (size_t i = Home(hash);; i = Next(i)) {
      const Slot& slot = slots_[i];
      if (slot.block == kNoBlock) return kNoBlock;
      if (slot.hash == hash) return slot.block;
    }
  }

  // hash must not be present.
  void Insert(uint64_t hash, BlockId block) {
    KVL_CHECK(block != kNoBlock && size_ < max_entries_);
    size_t i = Home(hash);
    for (; slots_[i].block != kNoBlock; i = Next(i)) KVL_CHECK(slots_[i].hash != hash);
    slots_[i] = {hash, block};
    ++size_;
  }

  // hash must be present. Backward-shift deletion: the entries after the hole that could live
  // in it move back, so lookups never need tombstones.
  void Erase(uint64_t hash) {
    size_t hole = Home(hash);
    while (slots_[hole].hash != hash || slots_[hole].block == kNoBlock) {
      KVL_CHECK(slots_[hole].block != kNoBlock);
      hole = Next(hole);
    }
    for (size_t j = Next(hole); slots_[j].block != kNoBlock; j = Next(j)) {
      // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
      const size_t home = Home(slots_[j].hash);
      const bool home_after_hole =
          hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (home_after_hole) continue;
      slots_[hole] = slots_[j];
      hole = j;
    }
    slots_[hole] = Slot{};
    --size_;
  }

  // fn(hash, block) for every entry, in no particular order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Slot& slot : slots_) {
      if (slot.block != kNoBlock) fn(slot.hash, slot.block);
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    BlockId block = kNoBlock;
  };
  // Fibonacci hashing spreads even a deliberately weak test hash over the table.
  size_t Home(uint64_t hash) const {
    return static_cast<size_t>((hash * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  size_t Next(size_t i) const { return (i + 1) & (slots_.size() - 1); }

  int32_t max_entries_;
  int shift_ = 0;
  int64_t size_ = 0;
  std::vector<Slot> slots_;  // [power of two]; block == kNoBlock: empty
};

}  // namespace kvl::kv_internal
