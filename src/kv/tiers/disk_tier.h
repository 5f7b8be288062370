// The local-disk tier's file format, exposed inside the kv layer so tests can find (and corrupt)
// a page on disk. Little-endian, as every machine we build for.
//
//   byte 0:                          [FileHeader, 64 bytes][identity bytes][zero padding to 4096]
//   slot s at 4096 + s * slot_bytes: [SlotRecord, 64 bytes][page, page_bytes][zero padding]
//
// slot_bytes = round_up(64 + page_bytes, 4096), so every slot starts on an O_DIRECT boundary and
// a run of consecutive slots is one contiguous extent: one pwritev / preadv per run.
//
// The header says whose file it is: a file that does not start with kFileMagic is not ours and is
// never changed. Its checksum covers its fields and the identity; a file with a bad checksum,
// another format version, page size or identity is ours but unusable, and is started empty.
//
// A slot's record is its own index entry: the index is rebuilt at open by reading every record.
// A record counts only when its checksum holds, its epoch is the header's (a file started empty
// gets a new epoch, so slots left from before can never come back) and its page size is the
// file's. When two slots name one key, the higher generation wins (a Put writes the new page to a
// fresh slot before it frees the old one). The payload is checked against the record's
// payload_checksum at every Get, so a record whose page was torn by a crash is a miss then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvl/kv_tier.h"
#include "kvl/temp_files.h"

namespace kvl::kv_internal {

inline constexpr uint8_t kFileMagic[8] = {'K', 'V', 'L', 'T', 'I', 'E', 'R', '\n'};
inline constexpr uint32_t kDiskFormatVersion = 1;
inline constexpr int64_t kFileHeaderBytes = 4096;
inline constexpr uint64_t kSlotMagic = 0x32544c53'4c564bull;  // "KVLSLT2" little-endian
inline constexpr int64_t kSlotHeaderBytes = 64;
inline constexpr int64_t kDiskAlignment = 4096;

struct FileHeader {
  uint8_t magic[8] = {};
  uint32_t format_version = 0;
  uint32_t header_bytes = 0;  // kFileHeaderBytes: where slot 0 starts
  uint64_t page_bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t epoch = 0;  // random, new whenever the file is started empty
  uint32_t identity_bytes = 0;  // that many identity bytes follow the header
  uint32_t reserved0 = 0;
  uint64_t reserved1 = 0;
  uint64_t checksum = 0;  // XXH3 of this struct (checksum zero) followed by the identity
};
static_assert(sizeof(FileHeader) == 64);
static_assert(sizeof(FileHeader) + kMaxDiskTierIdentityBytes == kFileHeaderBytes);

struct SlotHeader {  // the slot's record
  uint64_t magic = kSlotMagic;
  uint64_t key = 0;
  uint64_t page_bytes = 0;
  uint64_t generation = 0;  // per file, increasing with every page written
  uint64_t epoch = 0;       // FileHeader::epoch
  uint64_t checksum = 0;    // PageChecksum(key, page): the payload
  uint64_t reserved = 0;
  uint64_t record_checksum = 0;  // XXH3 of the 56 bytes above
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes);

inline int64_t DiskSlotBytes(int64_t page_bytes) {
  return (kSlotHeaderBytes + page_bytes + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment;
}
inline int64_t DiskSlotOffset(int64_t slot, int64_t slot_bytes) {
  return kFileHeaderBytes + slot * slot_bytes;
}

// A slot whose record held at open.
struct FoundSlot {
  int64_t slot = 0;
  PageKey key = 0;
  uint64_t generation = 0;
  uint64_t checksum = 0;  // of the payload, still to be verified at Get
};

// The page file, opened (created, reopened, or started empty) and locked (disk_tier_file.cc).
struct OpenedDiskFile {
  int fd = -1;  // the caller owns it from here: closing it releases the lock
  // The slots the tier has: those asked for, or fewer where the filesystem has no room for them.
  int64_t num_slots = 0;
  uint64_t device = 0, inode = 0;  // what the path named when it was opened
  bool direct = false;
  std::string direct_refused;  // the OS's reason, when O_DIRECT was asked for and refused
  uint64_t epoch = 0;
  std::string note;  // DiskKvTier::open_note()
  std::vector<FoundSlot> found;  // a reopened file's pages: one slot per key, in slot order
  TempFileGuard temp_guard;      // scratch files only: removed by the signal cleanup
};
// Validates the options that concern the file, then opens it as kv_tier.h's "ownership" says.
// Records are read only for slots below num_slots; a longer file is cut to num_slots. A tier
// larger than its filesystem's free space (with what the file holds already) gets the slots that
// fit, said in the note; none fitting is an error naming both sizes. A file that is the tier's
// own but damaged where that rule would refuse it (empty, or its magic damaged while the rest of
// its header, or its first slot, is the tier's) is renamed aside to PATH.damaged-<time>, said in
// the note, and a fresh file is made.
StatusOr<OpenedDiskFile> OpenDiskFile(const DiskTierOptions& options, int64_t num_slots);

uint64_t SlotRecordChecksum(const SlotHeader& record);

// What a disk tier made by MakeDiskTier can tell about itself beyond DiskKvTier.
class DiskTierInfo {
 public:
  virtual ~DiskTierInfo() = default;
  virtual int64_t slot_bytes() const = 0;
  virtual int64_t num_slots() const = 0;
  // The slot holding `key`, if the tier holds it.
  virtual std::optional<int64_t> SlotOf(PageKey key) const = 0;
  // True when the file is open with O_DIRECT (false when asked for but the filesystem refused).
  virtual bool direct_io_active() const = 0;
  // True when a Get's reads go out together through io_uring (false: one preadv after another,
  // because it was not asked for, the build has no liburing, or the kernel refused it).
  virtual bool io_uring_active() const = 0;
  // How reads are issued, and why: "io_uring", "preadv (io_uring refused: ...)".
  virtual std::string read_path() const = 0;
};

}  // namespace kvl::kv_internal
