// The local-disk tier: one page file of fixed-size slots (format in disk_tier.h; opened by
// disk_tier_file.cc), a free-extent allocator that hands a batch consecutive slots, an index
// key -> (slot, checksum, generation) rebuilt from the slots' records at open, and the LRU order
// of the pages that may be evicted.
//
// Coalescing is the point of this file. Put sorts the batch by slot and writes each run of
// consecutive slots with one pwritev; Get sorts its requests by slot and reads each run with one
// read, all of a Get's reads in flight at once (disk_read_queue.h: io_uring where the kernel
// allows it, else one preadv after another). A page's layers, put in one batch, sit in one run, so
// reading them back is one request; one layer of many pages is a request per page, issued
// together. Buffered I/O scatters straight into the caller's pages (header, page, padding
// iovecs); O_DIRECT goes through one aligned bounce buffer, in waves of at most 4 MiB of reads.
//
// Every read is verified twice: the slot's record must carry the magic, the key, the page size,
// the file's epoch, the generation the index expects and a matching record checksum, and the page
// bytes must hash (seeded with the key) to the checksum the index holds, so a stale slot with an
// intact record fails too. A failure is DATA_LOSS for that page only, and its output is zeroed.
//
// A full filesystem is a full tier. At open the tier takes no more slots than the filesystem has
// room for (disk_tier_file.cc). Should a write still fail for want of space (ENOSPC, EDQUOT:
// another writer took it), the slots never written may have no disk blocks behind them, so the
// tier steps aside from them for the rest of its life: it keeps the slots its pages are in, evicts
// to make room there, and answers RESOURCE_EXHAUSTED like any full tier, never an I/O error that
// would leave every later Put failing the same way.
//
// Thread-safety: one mutex serializes the index, the allocator and all file I/O; checksums of a
// Put are computed before taking it.
#include "disk_tier.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "disk_read_queue.h"
#include "page_checksum.h"
#include "tier_worker.h"
#include "kvl/kv_tier.h"
#include "kvl/temp_files.h"

namespace kvl {
namespace {

using kv_internal::AdvanceIovecs;
using kv_internal::DiskReadRequest;
using kv_internal::DiskSlotBytes;
using kv_internal::DiskSlotOffset;
using kv_internal::kDiskAlignment;
using kv_internal::kSlotHeaderBytes;
using kv_internal::kSlotMagic;
using kv_internal::OpenedDiskFile;
using kv_internal::PageChecksum;
using kv_internal::SlotHeader;
using kv_internal::SlotRecordChecksum;

// The O_DIRECT bounce buffer's most: a wave of reads in flight together (one layer of ~100 pages
// on disk is one wave) and the largest single transfer. It is resident for the tier's life, so it
// is kept small beside the KV budget it serves.
constexpr int64_t kMaxBounceBytes = 4ll << 20;
constexpr int kMaxIovecs = 1024;  // Linux IOV_MAX

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

AlignedBuffer AllocateAligned(int64_t bytes) {
  void* p = std::aligned_alloc(kDiskAlignment, static_cast<size_t>(bytes));
  KVL_CHECK_MSG(p != nullptr, "out of memory for a disk tier bounce buffer");
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

class DiskTier final : public DiskKvTier, public kv_internal::DiskTierInfo {
 public:
  static StatusOr<std::unique_ptr<DiskKvTier>> Make(const DiskTierOptions& options);

  ~DiskTier() override {
    worker_.Stop();  // finish GetAsync work while the file is still open
    // A scratch file goes, but only while the path still names it; it is removed before the
    // lock is released, so no other tier can have opened it meanwhile.
    struct stat st;
    if (!persistent_ && ::stat(path_.c_str(), &st) == 0 &&
        static_cast<uint64_t>(st.st_dev) == device_ && static_cast<uint64_t>(st.st_ino) == inode_) {
      ::unlink(path_.c_str());
    }
    temp_guard_.Release();
    ::close(fd_);
  }

  std::string_view name() const override { return name_; }
  TierKind kind() const override { return TierKind::kDisk; }
  const std::string& open_note() const override { return open_note_; }
  int64_t pages_reloaded() const override { return pages_reloaded_; }
  std::vector<PageKey> Keys() const override;
  Status Sync() override;
  int64_t slot_bytes() const override { return slot_bytes_; }
  int64_t num_slots() const override { return num_slots_; }
  bool direct_io_active() const override { return direct_; }
  bool io_uring_active() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return read_queue_.io_uring_active();
  }
  std::string read_path() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return read_queue_.note();
  }
  std::optional<int64_t> SlotOf(PageKey key) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    return it->second.slot;
  }

  Status Put(std::span<const PageWrite> pages) override;
  std::vector<Status> Get(std::span<const PageRead> pages) override;

  std::future<std::vector<Status>> GetAsync(std::vector<PageRead> pages) override {
    return worker_.Submit([this, pages = std::move(pages)] { return Get(pages); });
  }

  void Erase(std::span<const PageKey> keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (PageKey key : keys) EraseLocked(key);
  }

  bool Contains(PageKey key) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return index_.count(key) != 0;
  }

  TierStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    TierStats s = stats_;
    s.pages = static_cast<int64_t>(index_.size());
    s.bytes_used = s.pages * slot_bytes_;
    s.capacity_bytes = (num_slots_ - slots_without_space_) * slot_bytes_;
    return s;
  }

 private:
  struct SlotEntry {
    int64_t slot = 0;
    uint64_t checksum = 0;
    uint64_t generation = 0;
    // Position in evictable_, or evictable_.end() for a page kept until it is erased.
    std::list<PageKey>::iterator lru;
  };
  // One page of a transfer, in slot order.
  struct SlotIo {
    int64_t slot = 0;
    size_t index = 0;  // into the batch
  };
  // One read of a Get: [begin, end) of its SlotIo list, consecutive slots.
  struct ReadChunk {
    size_t begin = 0, end = 0;
    int64_t slots() const { return static_cast<int64_t>(end - begin); }
  };

  DiskTier(const DiskTierOptions& options, OpenedDiskFile file, std::string name);

  int64_t PadBytes() const { return slot_bytes_ - kSlotHeaderBytes - page_bytes_; }
  int64_t MaxSlotsPerDirectOp() const {
    return std::max<int64_t>(1, kMaxBounceBytes / slot_bytes_);
  }
  static constexpr int64_t kMaxSlotsPerBufferedOp = kMaxIovecs / 3;

  // Allocator: free slots as extents start -> length, merged on free. A batch gets one extent
  // when one is long enough (first fit), else the lowest extents in address order; either way
  // the slots come back ascending, so runs are as long as the free space allows.
  std::vector<int64_t> AllocateSlotsLocked(int64_t n);
  void FreeSlotLocked(int64_t slot);
  void EraseLocked(PageKey key) {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    FreeSlotLocked(it->second.slot);
    if (it->second.lru != evictable_.end()) evictable_.erase(it->second.lru);
    index_.erase(it);
  }
  void SetEvictable(std::span<const PageKey> keys, bool evictable) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (PageKey key : keys) {
      auto it = index_.find(key);
      if (it == index_.end()) continue;
      std::list<PageKey>::iterator& lru = it->second.lru;
      if (evictable && lru == evictable_.end()) {
        lru = evictable_.insert(evictable_.end(), key);
      } else if (!evictable && lru != evictable_.end()) {
        evictable_.erase(lru);
        lru = evictable_.end();
      }
    }
  }
  // Drops the least recently used evictable page.
  void EvictOneLocked() {
    KVL_CHECK(!evictable_.empty());
    EraseLocked(evictable_.front());
    ++stats_.evictions;
  }

  // Writes the whole iovec list at `offset`, retrying short writes; counts each syscall. A
  // failure leaves its errno in last_write_errno_.
  Status FullPwritev(iovec* iov, int count, int64_t offset);
  // Put's work once the batch is checked and hashed (mutex_ held): room made, slots taken, the
  // pages written and indexed; on a failed write none of the batch's keys is readable.
  Status PutLocked(std::span<const PageWrite> pages, std::span<const size_t> unique,
                   std::span<SlotHeader> headers);
  // The filesystem ran out of space: the free slots (perhaps never written, so with no disk
  // blocks behind them) are given up; the tier keeps the slots that hold pages.
  void GiveUpFreeSlotsLocked();

  Status WriteRun(std::span<const SlotIo> run, std::span<const PageWrite> pages,
                  std::span<const SlotHeader> headers);
  // Reads the chunks, all in flight at once, and verifies every page (mutex_ held).
  void ReadWave(std::span<const ReadChunk> chunks, std::span<const SlotIo> order,
                std::span<const PageRead> reads, std::span<const SlotEntry> expected,
                std::vector<Status>& results);
  Status Verify(const SlotHeader& header, std::span<const uint8_t> page, PageKey key, int64_t slot,
                const SlotEntry& expected, int64_t bytes_available);

  const std::string path_;
  const int64_t page_bytes_;
  const int64_t slot_bytes_;
  const int64_t num_slots_;
  const int fd_;  // holds the file's lock
  const bool persistent_;
  const bool evict_lru_;
  const uint64_t device_, inode_;  // the file, as opened
  const uint64_t epoch_;
  // A scratch file is registered so that a signal removes it; a persistent one never is.
  TempFileGuard temp_guard_;
  const bool direct_;
  const std::string name_;
  const std::string open_note_;
  int64_t pages_reloaded_ = 0;  // set once, by the constructor
  const std::vector<uint8_t> zeros_;  // padding source for buffered writes

  mutable std::mutex mutex_;
  std::unordered_map<PageKey, SlotEntry> index_;  // guarded by mutex_
  // Pages that may be evicted, least recently used first: those found at open, and (evict_lru)
  // every page. Guarded by mutex_.
  std::list<PageKey> evictable_;
  uint64_t next_generation_ = 1;                  // guarded by mutex_
  std::map<int64_t, int64_t> free_extents_;       // start -> length; guarded by mutex_
  int64_t num_free_slots_ = 0;                    // guarded by mutex_
  TierStats stats_;                               // counters only; guarded by mutex_
  std::vector<uint8_t> discard_;                  // padding sink for buffered reads; mutex_
  int last_write_errno_ = 0;                      // guarded by mutex_
  // Slots given up when the filesystem ran out of space (GiveUpFreeSlotsLocked); mutex_.
  int64_t slots_without_space_ = 0;
  AlignedBuffer bounce_;                          // O_DIRECT staging; guarded by mutex_
  int64_t bounce_bytes_ = 0;
  kv_internal::DiskReadQueue read_queue_;         // guarded by mutex_

  // The O_DIRECT staging buffer, grown to at least `bytes` (mutex_ held).
  uint8_t* BounceBuffer(int64_t bytes) {
    if (bounce_bytes_ < bytes) {
      bounce_ = AllocateAligned(bytes);
      bounce_bytes_ = bytes;
    }
    return bounce_.get();
  }

  kv_internal::TierWorker worker_;  // starts its thread at the first GetAsync
};

StatusOr<std::unique_ptr<DiskKvTier>> DiskTier::Make(const DiskTierOptions& options) {
  if (options.path.empty()) return InvalidArgumentError("disk tier: the page file path is empty");
  if (options.page_bytes <= 0) {
    return InvalidArgumentError(fmt::format("disk tier {}: page_bytes must be positive, got {}",
                                            options.path, options.page_bytes));
  }
  const int64_t slot_bytes = DiskSlotBytes(options.page_bytes);
  if (options.capacity_bytes < slot_bytes) {
    return InvalidArgumentError(fmt::format(
        "disk tier {}: capacity {} bytes is less than one slot ({} bytes for a {}-byte page)",
        options.path, options.capacity_bytes, slot_bytes, options.page_bytes));
  }
  KVL_ASSIGN_OR_RETURN(OpenedDiskFile file,
                       kv_internal::OpenDiskFile(options, options.capacity_bytes / slot_bytes));
  std::string name = file.direct ? "disk:direct" : "disk";
  if (options.direct_io && !file.direct)
    name = fmt::format("disk:buffered (O_DIRECT refused: {})", file.direct_refused);
  return std::unique_ptr<DiskKvTier>(new DiskTier(options, std::move(file), std::move(name)));
}

DiskTier::DiskTier(const DiskTierOptions& options, OpenedDiskFile file, std::string name)
    : path_(options.path),
      page_bytes_(options.page_bytes),
      slot_bytes_(DiskSlotBytes(options.page_bytes)),
      num_slots_(file.num_slots),
      fd_(file.fd),
      persistent_(options.persistent),
      evict_lru_(options.evict_lru),
      device_(file.device),
      inode_(file.inode),
      epoch_(file.epoch),
      temp_guard_(std::move(file.temp_guard)),
      direct_(file.direct),
      name_(std::move(name)),
      open_note_(std::move(file.note)),
      zeros_(static_cast<size_t>(kDiskAlignment), 0),
      discard_(static_cast<size_t>(kDiskAlignment)),
      read_queue_(options.io_uring) {
  // The index from the records. Pages found at open are evictable, oldest written first.
  std::sort(file.found.begin(), file.found.end(),
            [](const kv_internal::FoundSlot& a, const kv_internal::FoundSlot& b) {
              return a.generation < b.generation;
            });
  for (const kv_internal::FoundSlot& f : file.found) {
    evictable_.push_back(f.key);
    index_[f.key] = {f.slot, f.checksum, f.generation, std::prev(evictable_.end())};
    next_generation_ = std::max(next_generation_, f.generation + 1);
  }
  pages_reloaded_ = static_cast<int64_t>(index_.size());
  // Free extents: the runs between occupied slots.
  std::vector<int64_t> occupied;
  occupied.reserve(index_.size());
  for (const auto& [key, entry] : index_) occupied.push_back(entry.slot);
  std::sort(occupied.begin(), occupied.end());
  int64_t next_free = 0;
  for (int64_t slot : occupied) {
    if (slot > next_free) free_extents_[next_free] = slot - next_free;
    next_free = slot + 1;
  }
  if (next_free < num_slots_) free_extents_[next_free] = num_slots_ - next_free;
  num_free_slots_ = num_slots_ - static_cast<int64_t>(occupied.size());
}

std::vector<PageKey> DiskTier::Keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PageKey> keys(evictable_.begin(), evictable_.end());
  keys.reserve(index_.size());
  for (const auto& [key, entry] : index_) {
    if (entry.lru == evictable_.end()) keys.push_back(key);
  }
  return keys;
}

Status DiskTier::Sync() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (::fdatasync(fd_) != 0) {
    return IoError(fmt::format("disk tier: cannot flush {} to its device: {}", path_,
                               std::strerror(errno)));
  }
  return Status::Ok();
}

std::vector<int64_t> DiskTier::AllocateSlotsLocked(int64_t n) {
  KVL_CHECK(n <= num_free_slots_);
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(n));
  auto take = [&](std::map<int64_t, int64_t>::iterator it, int64_t count) {
    const int64_t start = it->first, length = it->second;
    for (int64_t s = start; s < start + count; ++s) slots.push_back(s);
    free_extents_.erase(it);
    if (count < length) free_extents_[start + count] = length - count;
    num_free_slots_ -= count;
  };
  for (auto it = free_extents_.begin(); it != free_extents_.end(); ++it) {
    if (it->second >= n) {
      take(it, n);
      return slots;
    }
  }
  while (static_cast<int64_t>(slots.size()) < n) {
    auto it = free_extents_.begin();
    take(it, std::min(it->second, n - static_cast<int64_t>(slots.size())));
  }
  return slots;
}

void DiskTier::FreeSlotLocked(int64_t slot) {
  int64_t start = slot, length = 1;
  auto next = free_extents_.upper_bound(slot);
  if (next != free_extents_.begin()) {
    auto prev = std::prev(next);
    KVL_CHECK(prev->first + prev->second <= slot);  // not already free
    if (prev->first + prev->second == slot) {
      start = prev->first;
      length += prev->second;
      free_extents_.erase(prev);
    }
  }
  if (next != free_extents_.end() && next->first == slot + 1) {
    length += next->second;
    free_extents_.erase(next);
  }
  free_extents_[start] = length;
  ++num_free_slots_;
}

Status DiskTier::FullPwritev(iovec* iov, int count, int64_t offset) {
  int start = 0;
  while (start < count) {
    const ssize_t n = ::pwritev(fd_, iov + start, count - start, offset);
    ++stats_.write_ops;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      last_write_errno_ = n < 0 ? errno : EIO;
      return IoError(fmt::format("disk tier: write of {} at byte {} failed: {}", path_, offset,
                                 n < 0 ? std::strerror(errno) : "no progress"));
    }
    offset += n;
    start = AdvanceIovecs(iov, count, start, static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status DiskTier::Put(std::span<const PageWrite> pages) {
  for (const PageWrite& page : pages) {
    if (static_cast<int64_t>(page.bytes.size()) != page_bytes_) {
      return InvalidArgumentError(
          fmt::format("{} tier {}: page {} has {} bytes, this tier stores {}", name_, path_,
                      page.key, page.bytes.size(), page_bytes_));
    }
  }
  // A key given twice in one batch keeps its last page; the rest keep batch order.
  std::unordered_map<PageKey, size_t> last_index;
  for (size_t i = 0; i < pages.size(); ++i) last_index[pages[i].key] = i;
  std::vector<size_t> unique;
  unique.reserve(last_index.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    if (last_index[pages[i].key] == i) unique.push_back(i);
  }
  std::vector<SlotHeader> headers(pages.size());
  for (size_t i : unique) {
    headers[i].key = pages[i].key;
    headers[i].page_bytes = static_cast<uint64_t>(page_bytes_);
    headers[i].epoch = epoch_;
    headers[i].checksum = PageChecksum(pages[i].key, pages[i].bytes);
  }

  std::lock_guard<std::mutex> lock(mutex_);
  last_write_errno_ = 0;
  Status status = PutLocked(pages, unique, headers);
  if (status.ok() || (last_write_errno_ != ENOSPC && last_write_errno_ != EDQUOT)) return status;
  // The filesystem is full before the tier is: the tier shrinks to the slots it has written and
  // tries once more there, evicting as a full tier does.
  const int64_t given_up = num_free_slots_;
  GiveUpFreeSlotsLocked();
  fmt::print(stderr,
             "kvl: {} tier {}: the filesystem is full ({}): the tier gives up {} slots it had "
             "not written and holds at most {} pages from now on, evicting to make room\n",
             name_, path_, std::strerror(last_write_errno_), given_up,
             num_slots_ - slots_without_space_);
  last_write_errno_ = 0;
  status = PutLocked(pages, unique, headers);
  if (status.ok() || status.code() == StatusCode::kResourceExhausted) return status;
  return ResourceExhaustedError(fmt::format("{} tier {} is full: its filesystem has no room left ({})",
                                            name_, path_, status.message()));
}

void DiskTier::GiveUpFreeSlotsLocked() {
  slots_without_space_ += num_free_slots_;
  free_extents_.clear();
  num_free_slots_ = 0;
}

Status DiskTier::PutLocked(std::span<const PageWrite> pages, std::span<const size_t> unique,
                           std::span<SlotHeader> headers) {
  const int64_t needed = static_cast<int64_t>(unique.size());
  // Room: free slots, evictable pages, and the kept pages this batch replaces.
  int64_t replaced_kept = 0;
  for (size_t i : unique) {
    auto it = index_.find(pages[i].key);
    replaced_kept += it != index_.end() && it->second.lru == evictable_.end();
  }
  const int64_t room = num_free_slots_ + static_cast<int64_t>(evictable_.size()) + replaced_kept;
  if (needed > room) {
    return ResourceExhaustedError(fmt::format(
        "{} tier {}: {} pages need {} bytes but only {} are free ({} of {} slots of {} bytes)",
        name_, path_, needed, needed * slot_bytes_, room * slot_bytes_, room,
        num_slots_ - slots_without_space_, slot_bytes_));
  }
  // Fresh slots keep the old pages readable until the new ones are on disk; when space is
  // short, the replaced pages' slots are reused first, then the coldest evictable pages'.
  if (needed > num_free_slots_) {
    for (size_t i : unique) EraseLocked(pages[i].key);
  }
  while (needed > num_free_slots_) EvictOneLocked();
  // Generations in batch order, so a reopened file resolves a key the way this tier does.
  for (size_t i : unique) {
    headers[i].generation = next_generation_++;
    headers[i].record_checksum = SlotRecordChecksum(headers[i]);
  }
  const std::vector<int64_t> slots = AllocateSlotsLocked(needed);
  std::vector<SlotIo> order(unique.size());
  for (size_t j = 0; j < unique.size(); ++j) order[j] = {slots[j], unique[j]};
  std::sort(order.begin(), order.end(),
            [](const SlotIo& a, const SlotIo& b) { return a.slot < b.slot; });

  Status status;
  for (size_t begin = 0; begin < order.size() && status.ok();) {
    size_t end = begin + 1;
    while (end < order.size() && order[end].slot == order[end - 1].slot + 1) ++end;
    status = WriteRun(std::span(order).subspan(begin, end - begin), pages, headers);
    begin = end;
  }
  if (!status.ok()) {
    // After a failed Put none of the batch's keys is readable: the caller recomputes them.
    for (const SlotIo& io : order) FreeSlotLocked(io.slot);
    for (size_t i : unique) EraseLocked(pages[i].key);
    return status;
  }
  for (const SlotIo& io : order) {
    const PageKey key = pages[io.index].key;
    EraseLocked(key);
    auto lru = evictable_.end();
    if (evict_lru_ || pages[io.index].evictable) lru = evictable_.insert(evictable_.end(), key);
    index_[key] = {io.slot, headers[io.index].checksum, headers[io.index].generation, lru};
  }
  stats_.puts += static_cast<int64_t>(pages.size());
  stats_.bytes_written += static_cast<int64_t>(order.size()) * page_bytes_;
  return Status::Ok();
}

Status DiskTier::WriteRun(std::span<const SlotIo> run, std::span<const PageWrite> pages,
                          std::span<const SlotHeader> headers) {
  const int64_t pad = PadBytes();
  if (!direct_) {
    std::vector<iovec> iov;
    for (size_t begin = 0; begin < run.size(); begin += kMaxSlotsPerBufferedOp) {
      const size_t end = std::min(run.size(), begin + kMaxSlotsPerBufferedOp);
      iov.clear();
      for (size_t j = begin; j < end; ++j) {
        const size_t i = run[j].index;
        iov.push_back({const_cast<SlotHeader*>(&headers[i]), kSlotHeaderBytes});
        iov.push_back({const_cast<uint8_t*>(pages[i].bytes.data()), pages[i].bytes.size()});
        if (pad > 0) iov.push_back({const_cast<uint8_t*>(zeros_.data()), static_cast<size_t>(pad)});
      }
      KVL_RETURN_IF_ERROR(FullPwritev(iov.data(), static_cast<int>(iov.size()),
                                      DiskSlotOffset(run[begin].slot, slot_bytes_)));
    }
    return Status::Ok();
  }
  const int64_t chunk_slots = MaxSlotsPerDirectOp();
  for (size_t begin = 0; begin < run.size(); begin += chunk_slots) {
    const size_t end = std::min(run.size(), begin + static_cast<size_t>(chunk_slots));
    const int64_t bytes = static_cast<int64_t>(end - begin) * slot_bytes_;
    uint8_t* bounce = BounceBuffer(bytes);
    for (size_t j = begin; j < end; ++j) {
      uint8_t* slot = bounce + static_cast<int64_t>(j - begin) * slot_bytes_;
      const size_t i = run[j].index;
      std::memcpy(slot, &headers[i], kSlotHeaderBytes);
      std::memcpy(slot + kSlotHeaderBytes, pages[i].bytes.data(), pages[i].bytes.size());
      std::memset(slot + kSlotHeaderBytes + page_bytes_, 0, static_cast<size_t>(pad));
    }
    iovec iov{bounce, static_cast<size_t>(bytes)};
    KVL_RETURN_IF_ERROR(FullPwritev(&iov, 1, DiskSlotOffset(run[begin].slot, slot_bytes_)));
  }
  return Status::Ok();
}

std::vector<Status> DiskTier::Get(std::span<const PageRead> reads) {
  std::vector<Status> results(reads.size());
  std::vector<SlotEntry> expected(reads.size());
  std::vector<SlotIo> order;
  order.reserve(reads.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < reads.size(); ++i) {
    if (static_cast<int64_t>(reads[i].out.size()) != page_bytes_) {
      results[i] = InvalidArgumentError(
          fmt::format("{} tier {}: read of page {} asks for {} bytes, pages are {}", name_, path_,
                      reads[i].key, reads[i].out.size(), page_bytes_));
      continue;
    }
    auto it = index_.find(reads[i].key);
    if (it == index_.end()) {
      results[i] = NotFoundError(fmt::format("{} tier {}: no page {}", name_, path_, reads[i].key));
      continue;
    }
    expected[i] = it->second;
    // A read is a use: an evictable page moves to the hot end.
    if (it->second.lru != evictable_.end()) {
      evictable_.splice(evictable_.end(), evictable_, it->second.lru);
    }
    order.push_back({it->second.slot, i});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const SlotIo& a, const SlotIo& b) { return a.slot < b.slot; });
  // One read per run of consecutive slots (cut where a run outgrows one transfer), sent in waves
  // that fit the bounce buffer: every read of a wave is in flight at once.
  const int64_t max_slots = direct_ ? MaxSlotsPerDirectOp() : kMaxSlotsPerBufferedOp;
  std::vector<ReadChunk> chunks;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && order[end].slot == order[end - 1].slot + 1 &&
           static_cast<int64_t>(end - begin) < max_slots) {
      ++end;
    }
    chunks.push_back({begin, end});
    begin = end;
  }
  for (size_t first = 0; first < chunks.size();) {
    size_t last = first + 1;
    int64_t slots = chunks[first].slots();
    while (last < chunks.size() &&
           (!direct_ || (slots + chunks[last].slots()) * slot_bytes_ <= kMaxBounceBytes)) {
      slots += chunks[last].slots();
      ++last;
    }
    ReadWave(std::span(chunks).subspan(first, last - first), order, reads, expected, results);
    first = last;
  }
  for (const SlotIo& io : order) {
    if (results[io.index].ok()) {
      ++stats_.gets;
      stats_.bytes_read += page_bytes_;
    } else {
      std::memset(reads[io.index].out.data(), 0, reads[io.index].out.size());  // never wrong bytes
    }
  }
  return results;
}

void DiskTier::ReadWave(std::span<const ReadChunk> chunks, std::span<const SlotIo> order,
                        std::span<const PageRead> reads, std::span<const SlotEntry> expected,
                        std::vector<Status>& results) {
  const int64_t pad = PadBytes();
  int64_t wave_slots = 0;
  for (const ReadChunk& c : chunks) wave_slots += c.slots();
  // Where each slot of the wave lands. O_DIRECT: the whole slot in the bounce buffer, one iovec
  // per read. Buffered: the record in `headers`, the page straight in the caller's buffer.
  uint8_t* bounce = direct_ ? BounceBuffer(wave_slots * slot_bytes_) : nullptr;
  std::vector<SlotHeader> headers(direct_ ? 0 : static_cast<size_t>(wave_slots));
  std::vector<iovec> iov;
  std::vector<size_t> first_iov(chunks.size());
  int64_t k = 0;  // the slot's index in the wave
  for (size_t c = 0; c < chunks.size(); ++c) {
    first_iov[c] = iov.size();
    if (direct_) {
      iov.push_back({bounce + k * slot_bytes_, static_cast<size_t>(chunks[c].slots() * slot_bytes_)});
      k += chunks[c].slots();
      continue;
    }
    for (size_t j = chunks[c].begin; j < chunks[c].end; ++j, ++k) {
      const PageRead& read = reads[order[j].index];
      iov.push_back({&headers[static_cast<size_t>(k)], kSlotHeaderBytes});
      iov.push_back({read.out.data(), read.out.size()});
      if (pad > 0) iov.push_back({discard_.data(), static_cast<size_t>(pad)});
    }
  }
  std::vector<DiskReadRequest> requests(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    const size_t end = c + 1 < chunks.size() ? first_iov[c + 1] : iov.size();
    requests[c].iov = iov.data() + first_iov[c];
    requests[c].iov_count = static_cast<int>(end - first_iov[c]);
    requests[c].offset = DiskSlotOffset(order[chunks[c].begin].slot, slot_bytes_);
  }
  stats_.read_ops += read_queue_.ReadAll(fd_, requests);

  k = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const DiskReadRequest& r = requests[c];
    for (size_t j = chunks[c].begin; j < chunks[c].end; ++j, ++k) {
      const size_t i = order[j].index;
      if (r.error != 0) {
        results[i] = IoError(fmt::format("disk tier: read of {} at byte {} failed: {}", path_,
                                         r.offset + r.bytes_read, std::strerror(r.error)));
        continue;
      }
      // The bytes of this slot that arrived (fewer when the file ends inside it).
      const int64_t available = r.bytes_read - static_cast<int64_t>(j - chunks[c].begin) * slot_bytes_;
      if (!direct_) {
        results[i] = Verify(headers[static_cast<size_t>(k)], reads[i].out, reads[i].key,
                            order[j].slot, expected[i], available);
        continue;
      }
      const uint8_t* slot = bounce + k * slot_bytes_;
      SlotHeader header;
      std::memcpy(&header, slot, kSlotHeaderBytes);
      const std::span<const uint8_t> page(slot + kSlotHeaderBytes, static_cast<size_t>(page_bytes_));
      results[i] = Verify(header, page, reads[i].key, order[j].slot, expected[i], available);
      if (results[i].ok()) std::memcpy(reads[i].out.data(), page.data(), page.size());
    }
  }
}

Status DiskTier::Verify(const SlotHeader& header, std::span<const uint8_t> page, PageKey key,
                        int64_t slot, const SlotEntry& expected, int64_t bytes_available) {
  std::string problem;
  if (bytes_available < kSlotHeaderBytes + page_bytes_) {
    problem = fmt::format("the file ends inside the slot (truncated: {} of {} bytes)",
                          std::max<int64_t>(bytes_available, 0), kSlotHeaderBytes + page_bytes_);
  } else if (header.magic != kSlotMagic) {
    problem = fmt::format("bad slot magic {:#x}", header.magic);
  } else if (header.key != key) {
    problem = fmt::format("the slot header names key {}", header.key);
  } else if (header.page_bytes != static_cast<uint64_t>(page_bytes_)) {
    problem = fmt::format("the slot header says {} page bytes, expected {}", header.page_bytes,
                          page_bytes_);
  } else if (header.epoch != epoch_ || header.generation != expected.generation ||
             header.checksum != expected.checksum) {
    problem = "the slot holds a different version of the page";
  } else if (header.record_checksum != SlotRecordChecksum(header)) {
    problem = "the slot record is damaged (record checksum mismatch)";
  } else if (PageChecksum(key, page) != expected.checksum) {
    problem = "checksum mismatch";
  } else {
    return Status::Ok();
  }
  ++stats_.checksum_failures;
  return DataLossError(
      fmt::format("{} tier {}: page {} in slot {}: {}", name_, path_, key, slot, problem));
}

}  // namespace

StatusOr<std::unique_ptr<DiskKvTier>> MakeDiskTier(const DiskTierOptions& options) {
  return DiskTier::Make(options);
}

}  // namespace kvl
