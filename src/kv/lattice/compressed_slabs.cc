#include "kvl/compressed_slabs.h"

#include <algorithm>

namespace kvl {

CompressedSlabs::CompressedSlabs(KvManager& manager, KvBlockStorage& storage)
    : manager_(manager), storage_(storage) {
  const KvBlockLayout& l = storage.layout();
  for (KvCodecType type : {KvCodecType::kInt8, KvCodecType::kInt4}) {
    Class& c = ClassOf(type);
    if (type == KvCodecType::kInt4 && l.kv_dim % 2 != 0) continue;  // int4 packs channel pairs
    c.slot_bytes = CompressedLayerBytes(type, l.block_tokens, l.kv_dim);
    c.slots_per_slab = l.block_bytes() / c.slot_bytes;
  }
}

int64_t CompressedSlabs::slot_bytes(KvCodecType type) const { return ClassOf(type).slot_bytes; }
int64_t CompressedSlabs::slots_per_slab(KvCodecType type) const {
  return ClassOf(type).slots_per_slab;
}

bool CompressedSlabs::Allocate(KvCodecType type, int64_t count, std::vector<SlabSlot>* slots) {
  Class& c = ClassOf(type);
  if (c.slots_per_slab == 0) return false;
  // New slabs first, so a failure takes nothing.
  const int64_t missing = std::max<int64_t>(0, count - c.free_slots);
  const int64_t new_slabs = (missing + c.slots_per_slab - 1) / c.slots_per_slab;
  std::vector<BlockId> fresh;
  for (int64_t i = 0; i < new_slabs; ++i) {
    const BlockId block = manager_.AcquireRawBlock();
    if (block == kNoBlock) {
      for (BlockId b : fresh) manager_.ReleaseRawBlock(b);
      return false;
    }
    fresh.push_back(block);
  }
  for (BlockId block : fresh) {
    Slab& slab = slabs_[block];
    slab.type = type;
    // Popped from the back: slot 0 is handed out first.
    for (int64_t i = c.slots_per_slab - 1; i >= 0; --i) slab.free.push_back(static_cast<int32_t>(i));
    c.free_slots += c.slots_per_slab;
    c.with_free.push_back(block);
  }
  for (int64_t taken = 0; taken < count;) {
    KVL_CHECK(!c.with_free.empty());
    const BlockId block = c.with_free.back();
    auto it = slabs_.find(block);
    if (it == slabs_.end() || it->second.free.empty() || it->second.type != type) {
      c.with_free.pop_back();  // stale: released, or filled up since
      continue;
    }
    slots->push_back({block, it->second.free.back()});
    it->second.free.pop_back();
    --c.free_slots;
    ++slots_used_;
    bytes_used_ += c.slot_bytes;
    ++taken;
  }
  return true;
}

void CompressedSlabs::Free(KvCodecType type, const std::vector<SlabSlot>& slots) {
  Class& c = ClassOf(type);
  for (const SlabSlot& slot : slots) {
    auto it = slabs_.find(slot.slab);
    KVL_CHECK(it != slabs_.end() && it->second.type == type);
    Slab& slab = it->second;
    if (slab.free.empty()) c.with_free.push_back(slot.slab);
    slab.free.push_back(slot.index);
    ++c.free_slots;
    --slots_used_;
    bytes_used_ -= c.slot_bytes;
    if (static_cast<int64_t>(slab.free.size()) == c.slots_per_slab) {
      c.free_slots -= c.slots_per_slab;
      slabs_.erase(it);
      manager_.ReleaseRawBlock(slot.slab);
    }
  }
}

uint8_t* CompressedSlabs::SlotData(KvCodecType type, SlabSlot slot) {
  return storage_.bytes(slot.slab) + slot.index * ClassOf(type).slot_bytes;
}

}  // namespace kvl
