// Slabs of compressed KV page layers, carved out of pool blocks: the memory side of the
// "compress" action. A compressed page is num_layers layer slots (kv_codec's layer format, one
// codec per slot class); slots of one class share slabs, each slab one pool block lent out raw by
// the KvManager. So compressed pages live inside the KV budget and a page's savings are real: a
// full block goes back to the pool, its int8 / int4 layers take a fraction of a slab.
//
// A slab whose last slot is freed goes back to the pool at once.
// Thread-safety: none; owned by the step loop. Slot pointers stay valid until freed.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvl/kv_codec.h"
#include "kvl/kv_manager.h"

namespace kvl {

struct SlabSlot {
  BlockId slab = kNoBlock;
  int32_t index = 0;
};

class CompressedSlabs {
 public:
  CompressedSlabs(KvManager& manager, KvBlockStorage& storage);

  // Bytes of one layer slot of `type` (a multiple of 64) and slots per slab.
  int64_t slot_bytes(KvCodecType type) const;
  int64_t slots_per_slab(KvCodecType type) const;

  // `count` slots of `type`, appended to *slots; false (nothing taken) when the pool has no block
  // for a slab that would be needed.
  bool Allocate(KvCodecType type, int64_t count, std::vector<SlabSlot>* slots);
  void Free(KvCodecType type, const std::vector<SlabSlot>& slots);
  uint8_t* SlotData(KvCodecType type, SlabSlot slot);

  int64_t num_slabs() const { return static_cast<int64_t>(slabs_.size()); }
  int64_t slots_used() const { return slots_used_; }
  int64_t bytes_used() const { return bytes_used_; }  // slots in use, not whole slabs

 private:
  struct Class {
    int64_t slot_bytes = 0;
    int64_t slots_per_slab = 0;
    int64_t free_slots = 0;             // across this class's slabs
    std::vector<BlockId> with_free;     // slabs that have a free slot (may hold stale entries)
  };
  struct Slab {
    KvCodecType type = KvCodecType::kInt8;
    std::vector<int32_t> free;  // free slot indices
  };
  Class& ClassOf(KvCodecType type) { return type == KvCodecType::kInt8 ? int8_ : int4_; }
  const Class& ClassOf(KvCodecType type) const {
    return type == KvCodecType::kInt8 ? int8_ : int4_;
  }

  KvManager& manager_;
  KvBlockStorage& storage_;
  Class int8_;
  Class int4_;
  std::unordered_map<BlockId, Slab> slabs_;
  int64_t slots_used_ = 0;
  int64_t bytes_used_ = 0;
};

}  // namespace kvl
