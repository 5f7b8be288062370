// The host-RAM tier: a byte-budgeted map from key to a private copy of the page, optionally
// zstd-compressed (level 1: lossless, fast enough to sit on the demote path). Every page keeps
// the checksum of its uncompressed bytes, and a read verifies it after decompressing, so a bad
// decompressor or a stray write into the pool gives DATA_LOSS instead of wrong KV.
//
// Thread-safety: one mutex guards the map and the counters. Compression and decompression run
// outside it on per-thread zstd contexts, so concurrent Puts compress in parallel.
#include <fmt/format.h>
#include <zstd.h>

#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "page_checksum.h"
#include "tier_worker.h"
#include "kvl/kv_tier.h"

namespace kvl {
namespace {

using kv_internal::PageChecksum;

struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* ctx) const { ZSTD_freeCCtx(ctx); }
};
struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* ctx) const { ZSTD_freeDCtx(ctx); }
};

// Per-thread contexts: creating one per page costs more than compressing a small page.
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

constexpr int kZstdLevel = 1;

struct StoredPage {
  std::vector<uint8_t> data;  // the page, or its zstd frame when compressed
  int64_t page_bytes = 0;     // uncompressed size
  uint64_t checksum = 0;      // of the uncompressed bytes, seeded with the key
  bool compressed = false;
  bool evictable = false;
  std::list<PageKey>::iterator lru;  // its place in evictable_ (evictable pages only)
};

class RamTier final : public KvTier {
 public:
  explicit RamTier(const RamTierOptions& options)
      : capacity_bytes_(options.capacity_bytes > 0 ? options.capacity_bytes : 0),
        compress_(options.compress),
        name_(options.compress ? "ram:zstd" : "ram") {}

  ~RamTier() override { worker_.Stop(); }  // finish GetAsync work before the map goes away

  std::string_view name() const override { return name_; }
  TierKind kind() const override { return TierKind::kRam; }

  Status Put(std::span<const PageWrite> pages) override {
    try {
      return PutPages(pages);
    } catch (const std::bad_alloc&) {
      // The tier's bytes are process memory: name that, not the budget, as the cause.
      return ResourceExhaustedError(fmt::format(
          "{} tier: out of memory storing {} pages: the system refused the allocation (capacity "
          "{} bytes)",
          name_, pages.size(), capacity_bytes_));
    }
  }

  Status PutPages(std::span<const PageWrite> pages) {
    // Encode outside the lock. A key given twice in one batch keeps its last page.
    std::vector<StoredPage> encoded(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) KVL_RETURN_IF_ERROR(Encode(pages[i], &encoded[i]));

    std::lock_guard<std::mutex> lock(mutex_);
    std::unordered_map<PageKey, size_t> last_index;
    for (size_t i = 0; i < pages.size(); ++i) last_index[pages[i].key] = i;
    int64_t needed = 0, reclaimed = 0;
    for (const auto& [key, index] : last_index) {
      needed += static_cast<int64_t>(encoded[index].data.size());
      if (auto it = pages_.find(key); it != pages_.end()) {
        reclaimed += static_cast<int64_t>(it->second.data.size());
      }
    }
    int64_t free_bytes = capacity_bytes_ - bytes_used_ + reclaimed;
    // Cached pages other than those this batch replaces (already in `reclaimed`) can make room.
    int64_t evictable_bytes = evictable_bytes_;
    for (const auto& [key, index] : last_index) {
      if (auto it = pages_.find(key); it != pages_.end() && it->second.evictable) {
        evictable_bytes -= static_cast<int64_t>(it->second.data.size());
      }
    }
    if (needed > free_bytes + evictable_bytes) {
      return ResourceExhaustedError(
          fmt::format("{} tier: {} pages need {} bytes but only {} are free (capacity {}, {} used)",
                      name_, last_index.size(), needed, free_bytes, capacity_bytes_, bytes_used_));
    }
    // Room from the coldest cached pages first (never one this batch replaces).
    for (auto it = evictable_.begin(); needed > free_bytes && it != evictable_.end();) {
      const PageKey victim = *it++;
      if (last_index.count(victim) != 0) continue;
      free_bytes += StoredSize(victim);
      EraseLocked(victim);
      ++stats_evictions_;
    }
    for (const auto& [key, index] : last_index) {
      EraseLocked(key);
      StoredPage& slot = pages_[key];
      slot = std::move(encoded[index]);
      slot.evictable = pages[index].evictable;
      if (slot.evictable) {
        slot.lru = evictable_.insert(evictable_.end(), key);
        evictable_bytes_ += static_cast<int64_t>(slot.data.size());
      }
      bytes_used_ += static_cast<int64_t>(slot.data.size());
    }
    for (const PageWrite& page : pages)
      stats_bytes_written_ += static_cast<int64_t>(page.bytes.size());
    stats_puts_ += static_cast<int64_t>(pages.size());
    stats_write_ops_ += static_cast<int64_t>(pages.size());  // one copy per page
    return Status::Ok();
  }

  std::vector<Status> Get(std::span<const PageRead> pages) override {
    std::vector<Status> results(pages.size());
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < pages.size(); ++i) {
      results[i] = ReadLocked(pages[i]);
      if (!results[i].ok() && results[i].code() != StatusCode::kInvalidArgument &&
          !pages[i].out.empty()) {
        // Never leave half-decoded bytes where the caller might look.
        std::memset(pages[i].out.data(), 0, pages[i].out.size());
      }
    }
    return results;
  }

  std::future<std::vector<Status>> GetAsync(std::vector<PageRead> pages) override {
    return worker_.Submit([this, pages = std::move(pages)] { return Get(pages); });
  }

  void Erase(std::span<const PageKey> keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (PageKey key : keys) EraseLocked(key);
  }

  bool reads_in_place() const override { return !compress_; }

  void SetEvictable(std::span<const PageKey> keys, bool evictable) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (PageKey key : keys) {
      auto it = pages_.find(key);
      if (it == pages_.end() || it->second.evictable == evictable) continue;
      StoredPage& page = it->second;
      const int64_t size = static_cast<int64_t>(page.data.size());
      page.evictable = evictable;
      if (evictable) {
        page.lru = evictable_.insert(evictable_.end(), key);
        evictable_bytes_ += size;
      } else {
        evictable_.erase(page.lru);
        evictable_bytes_ -= size;
      }
    }
  }

  const uint8_t* PeekPage(PageKey key, int64_t page_bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pages_.find(key);
    if (it == pages_.end() || it->second.compressed || it->second.page_bytes != page_bytes) {
      return nullptr;
    }
    Touch(it->second);
    return it->second.data.data();
  }

  bool Contains(PageKey key) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return pages_.count(key) != 0;
  }

  TierStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    TierStats s;
    s.pages = static_cast<int64_t>(pages_.size());
    s.bytes_used = bytes_used_;
    s.capacity_bytes = capacity_bytes_;
    s.puts = stats_puts_;
    s.gets = stats_gets_;
    s.bytes_written = stats_bytes_written_;
    s.bytes_read = stats_bytes_read_;
    s.write_ops = stats_write_ops_;
    s.read_ops = stats_read_ops_;
    s.checksum_failures = stats_checksum_failures_;
    s.evictions = stats_evictions_;
    return s;
  }

 private:
  int64_t StoredSize(PageKey key) const {
    return static_cast<int64_t>(pages_.at(key).data.size());
  }

  void EraseLocked(PageKey key) {
    auto it = pages_.find(key);
    if (it == pages_.end()) return;
    if (it->second.evictable) {
      evictable_.erase(it->second.lru);
      evictable_bytes_ -= static_cast<int64_t>(it->second.data.size());
    }
    bytes_used_ -= static_cast<int64_t>(it->second.data.size());
    pages_.erase(it);
  }

  // A read is a use: a cached page moves to the hot end of the eviction order.
  void Touch(StoredPage& page) {
    if (page.evictable) evictable_.splice(evictable_.end(), evictable_, page.lru);
  }

  Status Encode(const PageWrite& page, StoredPage* out) const {
    out->page_bytes = static_cast<int64_t>(page.bytes.size());
    out->checksum = PageChecksum(page.key, page.bytes);
    if (compress_ && !page.bytes.empty()) {
      std::vector<uint8_t> frame(ZSTD_compressBound(page.bytes.size()));
      const size_t n = ZSTD_compressCCtx(ThreadCCtx(), frame.data(), frame.size(),
                                         page.bytes.data(), page.bytes.size(), kZstdLevel);
      if (ZSTD_isError(n)) {
        return InternalError(fmt::format("ram tier: zstd could not compress page {}: {}", page.key,
                                         ZSTD_getErrorName(n)));
      }
      // Incompressible pages (random bytes, already-quantized KV) are kept as they are.
      if (n < page.bytes.size()) {
        frame.resize(n);
        frame.shrink_to_fit();
        out->data = std::move(frame);
        out->compressed = true;
        return Status::Ok();
      }
    }
    out->data.assign(page.bytes.begin(), page.bytes.end());
    out->compressed = false;
    return Status::Ok();
  }

  Status ReadLocked(const PageRead& read) {
    auto it = pages_.find(read.key);
    if (it == pages_.end())
      return NotFoundError(fmt::format("{} tier: no page {}", name_, read.key));
    const StoredPage& page = it->second;
    if (static_cast<int64_t>(read.out.size()) != page.page_bytes) {
      return InvalidArgumentError(fmt::format("{} tier: page {} has {} bytes, the read asks for {}",
                                              name_, read.key, page.page_bytes, read.out.size()));
    }
    ++stats_read_ops_;
    if (page.compressed) {
      const size_t n = ZSTD_decompressDCtx(ThreadDCtx(), read.out.data(), read.out.size(),
                                           page.data.data(), page.data.size());
      if (ZSTD_isError(n) || n != read.out.size()) {
        ++stats_checksum_failures_;
        return DataLossError(
            fmt::format("{} tier: page {} does not decompress: {}", name_, read.key,
                        ZSTD_isError(n) ? ZSTD_getErrorName(n)
                                        : fmt::format("{} of {} bytes", n, read.out.size())));
      }
    } else if (!page.data.empty()) {
      std::memcpy(read.out.data(), page.data.data(), page.data.size());
    }
    if (PageChecksum(read.key, read.out) != page.checksum) {
      ++stats_checksum_failures_;
      return DataLossError(fmt::format("{} tier: page {} fails its checksum", name_, read.key));
    }
    ++stats_gets_;
    stats_bytes_read_ += page.page_bytes;
    Touch(it->second);
    return Status::Ok();
  }

  const int64_t capacity_bytes_;
  const bool compress_;
  const std::string name_;

  mutable std::mutex mutex_;
  std::unordered_map<PageKey, StoredPage> pages_;  // guarded by mutex_
  std::list<PageKey> evictable_;  // cached pages, least recently used first; guarded by mutex_
  int64_t evictable_bytes_ = 0;   // their stored sizes; guarded by mutex_
  int64_t bytes_used_ = 0;                         // sum of stored sizes; guarded by mutex_
  int64_t stats_puts_ = 0, stats_gets_ = 0, stats_bytes_written_ = 0, stats_bytes_read_ = 0;
  int64_t stats_write_ops_ = 0, stats_read_ops_ = 0, stats_checksum_failures_ = 0;
  int64_t stats_evictions_ = 0;

  kv_internal::TierWorker worker_;  // starts its thread at the first GetAsync
};

}  // namespace

std::unique_ptr<KvTier> MakeRamTier(const RamTierOptions& options) {
  return std::make_unique<RamTier>(options);
}

}  // namespace kvl
