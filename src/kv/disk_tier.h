// The local-disk tier's file layout, exposed inside the kv layer so tests can find (and corrupt)
// a page on disk. The page file is an array of fixed-size slots:
//
//   slot s at byte s * slot_bytes:  [SlotHeader, 64 bytes][page, page_bytes][zero padding]
//
// slot_bytes = round_up(64 + page_bytes, 4096), so every slot starts on an O_DIRECT boundary and
// a run of consecutive slots is one contiguous extent: one pwritev / preadv per run.
#pragma once

#include <cstdint>
#include <optional>

#include "kvl/kv_tier.h"

namespace kvl::kv_internal {

inline constexpr uint64_t kSlotMagic = 0x31544c53'4c564bull;  // "KVLSLT1" little-endian
inline constexpr int64_t kSlotHeaderBytes = 64;
inline constexpr int64_t kDiskAlignment = 4096;

struct SlotHeader {
  uint64_t magic = kSlotMagic;
  uint64_t key = 0;
  uint64_t page_bytes = 0;
  uint64_t checksum = 0;  // PageChecksum(key, page)
  uint8_t reserved[kSlotHeaderBytes - 4 * sizeof(uint64_t)] = {};
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes);

inline int64_t DiskSlotBytes(int64_t page_bytes) {
  return (kSlotHeaderBytes + page_bytes + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment;
}

// What a disk tier made by MakeDiskTier can tell about itself beyond KvTier.
class DiskTierInfo {
 public:
  virtual ~DiskTierInfo() = default;
  virtual int64_t slot_bytes() const = 0;
  virtual int64_t num_slots() const = 0;
  // The slot holding `key`, if the tier holds it.
  virtual std::optional<int64_t> SlotOf(PageKey key) const = 0;
  // True when the file is open with O_DIRECT (false when asked for but the filesystem refused).
  virtual bool direct_io_active() const = 0;
};

}  // namespace kvl::kv_internal
