// The local-disk tier: one page file of fixed-size slots (layout in disk_tier.h), a free-extent
// allocator that hands a batch consecutive slots, and an index key -> (slot, checksum).
//
// Coalescing is the point of this file. Put sorts the batch by slot and writes each run of
// consecutive slots with one pwritev; Get sorts its requests by slot and reads each run with one
// preadv. Buffered I/O scatters straight into the caller's pages (header, page, padding iovecs);
// O_DIRECT goes through one aligned bounce buffer per run, in chunks of at most 64 MiB.
//
// Every read is verified twice: the slot header must carry the magic, the key and the page size,
// and the page bytes must hash (seeded with the key) to the checksum recorded at Put time, which
// the index keeps in memory, so a stale slot with an intact header fails too. A failure is
// DATA_LOSS for that page only, and its output is zeroed.
//
// Thread-safety: one mutex serializes the index, the allocator and all file I/O; checksums of a
// Put are computed before taking it.
#include "disk_tier.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "page_checksum.h"
#include "tier_worker.h"
#include "kvl/kv_tier.h"
#include "kvl/temp_files.h"

namespace kvl {
namespace {

using kv_internal::DiskSlotBytes;
using kv_internal::kDiskAlignment;
using kv_internal::kSlotHeaderBytes;
using kv_internal::kSlotMagic;
using kv_internal::PageChecksum;
using kv_internal::SlotHeader;

constexpr int64_t kMaxBounceBytes = 64ll << 20;
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

// Drops the first `n` bytes from an iovec array in place; returns the new start index.
int AdvanceIovecs(iovec* iov, int count, int start, size_t n) {
  while (start < count && n >= iov[start].iov_len) {
    n -= iov[start].iov_len;
    ++start;
  }
  if (start < count && n > 0) {
    iov[start].iov_base = static_cast<uint8_t*>(iov[start].iov_base) + n;
    iov[start].iov_len -= n;
  }
  return start;
}

class DiskTier final : public KvTier, public kv_internal::DiskTierInfo {
 public:
  static StatusOr<std::unique_ptr<KvTier>> Make(const DiskTierOptions& options);

  ~DiskTier() override {
    worker_.Stop();  // finish GetAsync work while the file is still open
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
    temp_guard_.Release();
  }

  std::string_view name() const override { return name_; }
  int64_t slot_bytes() const override { return slot_bytes_; }
  int64_t num_slots() const override { return num_slots_; }
  bool direct_io_active() const override { return direct_; }
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
    s.capacity_bytes = num_slots_ * slot_bytes_;
    return s;
  }

 private:
  struct SlotEntry {
    int64_t slot = 0;
    uint64_t checksum = 0;
  };
  // One page of a transfer, in slot order.
  struct SlotIo {
    int64_t slot = 0;
    size_t index = 0;  // into the batch
  };

  DiskTier(const DiskTierOptions& options, int fd, TempFileGuard temp_guard, bool direct,
           std::string name)
      : path_(options.path),
        page_bytes_(options.page_bytes),
        slot_bytes_(DiskSlotBytes(options.page_bytes)),
        num_slots_(options.capacity_bytes / DiskSlotBytes(options.page_bytes)),
        fd_(fd),
        temp_guard_(std::move(temp_guard)),
        direct_(direct),
        name_(std::move(name)),
        zeros_(static_cast<size_t>(kDiskAlignment), 0),
        discard_(static_cast<size_t>(kDiskAlignment)) {
    free_extents_[0] = num_slots_;
    num_free_slots_ = num_slots_;
  }

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
    index_.erase(it);
  }

  // Writes the whole iovec list at `offset`, retrying short writes; counts each syscall.
  Status FullPwritev(iovec* iov, int count, int64_t offset);
  // Reads into the iovec list at `offset` until it is full or the file ends; returns the bytes
  // read. Counts each syscall.
  StatusOr<int64_t> FullPreadv(iovec* iov, int count, int64_t offset);

  Status WriteRun(std::span<const SlotIo> run, std::span<const PageWrite> pages,
                  std::span<const SlotHeader> headers);
  void ReadRun(std::span<const SlotIo> run, std::span<const PageRead> reads,
               std::span<const uint64_t> expected, std::vector<Status>& results);
  Status Verify(const SlotHeader& header, std::span<const uint8_t> page, PageKey key, int64_t slot,
                uint64_t expected, int64_t bytes_available);

  const std::string path_;
  const int64_t page_bytes_;
  const int64_t slot_bytes_;
  const int64_t num_slots_;
  const int fd_;
  // The page file is temporary: registered before it is created, so a signal removes it.
  TempFileGuard temp_guard_;
  const bool direct_;
  const std::string name_;
  const std::vector<uint8_t> zeros_;  // padding source for buffered writes

  mutable std::mutex mutex_;
  std::unordered_map<PageKey, SlotEntry> index_;  // guarded by mutex_
  std::map<int64_t, int64_t> free_extents_;       // start -> length; guarded by mutex_
  int64_t num_free_slots_ = 0;                    // guarded by mutex_
  TierStats stats_;                               // counters only; guarded by mutex_
  std::vector<uint8_t> discard_;                  // padding sink for buffered reads; mutex_
  AlignedBuffer bounce_;                          // O_DIRECT staging; guarded by mutex_
  int64_t bounce_bytes_ = 0;

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

StatusOr<std::unique_ptr<KvTier>> DiskTier::Make(const DiskTierOptions& options) {
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
  std::filesystem::path dir = std::filesystem::path(options.path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return InvalidArgumentError(
        fmt::format("disk tier {}: directory {} does not exist", options.path, dir.string()));
  }

  // The tier truncates, overwrites and finally deletes its file: never a device or a directory.
  struct stat existing;
  if (::stat(options.path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    return InvalidArgumentError(
        fmt::format("disk tier: {} exists and is not a regular file", options.path));
  }

  TempFileGuard temp_guard(options.path);
  const int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  bool direct = false;
  std::string fallback_reason;
  int fd = -1;
  if (options.direct_io) {
    fd = ::open(options.path.c_str(), flags | O_DIRECT, 0600);
    if (fd < 0 && errno != EINVAL) {
      return IoError(
          fmt::format("disk tier: cannot create {}: {}", options.path, std::strerror(errno)));
    }
    if (fd >= 0) {
      // Some filesystems accept O_DIRECT at open and refuse the first aligned write: probe.
      AlignedBuffer probe = AllocateAligned(kDiskAlignment);
      std::memset(probe.get(), 0, kDiskAlignment);
      if (::pwrite(fd, probe.get(), kDiskAlignment, 0) == kDiskAlignment &&
          ::ftruncate(fd, 0) == 0) {
        direct = true;
      } else {
        fallback_reason = std::strerror(errno);
        ::close(fd);
        fd = -1;
      }
    } else {
      fallback_reason = std::strerror(EINVAL);
    }
  }
  if (fd < 0) {
    fd = ::open(options.path.c_str(), flags, 0600);
    if (fd < 0) {
      return IoError(
          fmt::format("disk tier: cannot create {}: {}", options.path, std::strerror(errno)));
    }
  }
  std::string name = direct ? "disk:direct" : "disk";
  if (options.direct_io && !direct)
    name = fmt::format("disk:buffered (O_DIRECT refused: {})", fallback_reason);
  return std::unique_ptr<KvTier>(new DiskTier(options, fd, std::move(temp_guard), direct, std::move(name)));
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
      return IoError(fmt::format("disk tier: write of {} at byte {} failed: {}", path_, offset,
                                 n < 0 ? std::strerror(errno) : "no progress"));
    }
    offset += n;
    start = AdvanceIovecs(iov, count, start, static_cast<size_t>(n));
  }
  return Status::Ok();
}

StatusOr<int64_t> DiskTier::FullPreadv(iovec* iov, int count, int64_t offset) {
  int64_t total = 0;
  int start = 0;
  while (start < count) {
    const ssize_t n = ::preadv(fd_, iov + start, count - start, offset + total);
    ++stats_.read_ops;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return IoError(fmt::format("disk tier: read of {} at byte {} failed: {}", path_,
                                 offset + total, std::strerror(errno)));
    }
    if (n == 0) break;  // end of file: the caller finds which slots are incomplete
    total += n;
    start = AdvanceIovecs(iov, count, start, static_cast<size_t>(n));
  }
  return total;
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
    headers[i].checksum = PageChecksum(pages[i].key, pages[i].bytes);
  }

  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t needed = static_cast<int64_t>(unique.size());
  int64_t replaced = 0;
  for (size_t i : unique) replaced += static_cast<int64_t>(index_.count(pages[i].key));
  if (needed > num_free_slots_ + replaced) {
    return ResourceExhaustedError(fmt::format(
        "{} tier {}: {} pages need {} bytes but only {} are free ({} of {} slots of {} bytes)",
        name_, path_, needed, needed * slot_bytes_, (num_free_slots_ + replaced) * slot_bytes_,
        num_free_slots_ + replaced, num_slots_, slot_bytes_));
  }
  // Fresh slots keep the old pages readable until the new ones are on disk; when space is
  // short, the replaced pages' slots are reused instead.
  if (needed > num_free_slots_) {
    for (size_t i : unique) EraseLocked(pages[i].key);
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
    EraseLocked(pages[io.index].key);
    index_[pages[io.index].key] = {io.slot, headers[io.index].checksum};
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
      KVL_RETURN_IF_ERROR(
          FullPwritev(iov.data(), static_cast<int>(iov.size()), run[begin].slot * slot_bytes_));
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
    KVL_RETURN_IF_ERROR(FullPwritev(&iov, 1, run[begin].slot * slot_bytes_));
  }
  return Status::Ok();
}

std::vector<Status> DiskTier::Get(std::span<const PageRead> reads) {
  std::vector<Status> results(reads.size());
  std::vector<uint64_t> expected(reads.size(), 0);
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
    expected[i] = it->second.checksum;
    order.push_back({it->second.slot, i});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const SlotIo& a, const SlotIo& b) { return a.slot < b.slot; });
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && order[end].slot == order[end - 1].slot + 1) ++end;
    ReadRun(std::span(order).subspan(begin, end - begin), reads, expected, results);
    begin = end;
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

void DiskTier::ReadRun(std::span<const SlotIo> run, std::span<const PageRead> reads,
                       std::span<const uint64_t> expected, std::vector<Status>& results) {
  const int64_t pad = PadBytes();
  if (!direct_) {
    std::vector<SlotHeader> headers(std::min<size_t>(run.size(), kMaxSlotsPerBufferedOp));
    std::vector<iovec> iov;
    for (size_t begin = 0; begin < run.size(); begin += kMaxSlotsPerBufferedOp) {
      const size_t end = std::min(run.size(), begin + kMaxSlotsPerBufferedOp);
      iov.clear();
      for (size_t j = begin; j < end; ++j) {
        iov.push_back({&headers[j - begin], kSlotHeaderBytes});
        iov.push_back({reads[run[j].index].out.data(), reads[run[j].index].out.size()});
        if (pad > 0) iov.push_back({discard_.data(), static_cast<size_t>(pad)});
      }
      StatusOr<int64_t> got =
          FullPreadv(iov.data(), static_cast<int>(iov.size()), run[begin].slot * slot_bytes_);
      for (size_t j = begin; j < end; ++j) {
        const size_t i = run[j].index;
        if (!got.ok()) {
          results[i] = got.status();
          continue;
        }
        const int64_t available = *got - static_cast<int64_t>(j - begin) * slot_bytes_;
        results[i] = Verify(headers[j - begin], reads[i].out, reads[i].key, run[j].slot,
                            expected[i], available);
      }
    }
    return;
  }
  const int64_t chunk_slots = MaxSlotsPerDirectOp();
  for (size_t begin = 0; begin < run.size(); begin += chunk_slots) {
    const size_t end = std::min(run.size(), begin + static_cast<size_t>(chunk_slots));
    const int64_t bytes = static_cast<int64_t>(end - begin) * slot_bytes_;
    uint8_t* bounce = BounceBuffer(bytes);
    iovec iov{bounce, static_cast<size_t>(bytes)};
    StatusOr<int64_t> got = FullPreadv(&iov, 1, run[begin].slot * slot_bytes_);
    for (size_t j = begin; j < end; ++j) {
      const size_t i = run[j].index;
      if (!got.ok()) {
        results[i] = got.status();
        continue;
      }
      const uint8_t* slot = bounce + static_cast<int64_t>(j - begin) * slot_bytes_;
      SlotHeader header;
      std::memcpy(&header, slot, kSlotHeaderBytes);
      const std::span<const uint8_t> page(slot + kSlotHeaderBytes,
                                          static_cast<size_t>(page_bytes_));
      const int64_t available = *got - static_cast<int64_t>(j - begin) * slot_bytes_;
      results[i] = Verify(header, page, reads[i].key, run[j].slot, expected[i], available);
      if (results[i].ok()) std::memcpy(reads[i].out.data(), page.data(), page.size());
    }
  }
}

Status DiskTier::Verify(const SlotHeader& header, std::span<const uint8_t> page, PageKey key,
                        int64_t slot, uint64_t expected, int64_t bytes_available) {
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
  } else if (header.checksum != expected) {
    problem = "the slot holds a different version of the page";
  } else if (PageChecksum(key, page) != expected) {
    problem = "checksum mismatch";
  } else {
    return Status::Ok();
  }
  ++stats_.checksum_failures;
  return DataLossError(
      fmt::format("{} tier {}: page {} in slot {}: {}", name_, path_, key, slot, problem));
}

}  // namespace

StatusOr<std::unique_ptr<KvTier>> MakeDiskTier(const DiskTierOptions& options) {
  return DiskTier::Make(options);
}

}  // namespace kvl
