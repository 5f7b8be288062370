// Slower tiers a KV page can be demoted to: a host-RAM pool and a local disk page file today, a
// remote store (Redis) later. A page is the bytes of one KV block (K and V of every layer for
// block_tokens tokens, possibly compressed); the tier does not interpret them.
//
// Every page carries a checksum. A read whose bytes do not match gives DATA_LOSS for that page
// (never wrong bytes), and the caller falls back to recomputing the page. Transfers are batched:
// Put and Get take many pages and a tier coalesces them into as few I/O operations as it can,
// because many small transfers are what makes offload lose to recompute (vLLM's finding).
//
// Thread-safety: every method may be called from any thread; a tier serializes internally.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/status.h"

namespace kvl {

using PageKey = uint64_t;  // chosen by the caller, unique per page it stores

struct PageWrite {
  PageKey key = 0;
  std::span<const uint8_t> bytes;
};

struct PageRead {
  PageKey key = 0;
  std::span<uint8_t> out;  // exactly the page's size
};

struct TierStats {
  int64_t pages = 0;            // pages held now
  int64_t bytes_used = 0;
  int64_t capacity_bytes = 0;
  int64_t puts = 0;             // pages written, total
  int64_t gets = 0;             // pages read, total
  int64_t bytes_written = 0;
  int64_t bytes_read = 0;
  int64_t write_ops = 0;        // I/O operations (after coalescing)
  int64_t read_ops = 0;
  int64_t checksum_failures = 0;
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  virtual std::string_view name() const = 0;  // "ram", "disk", ...

  // Stores the pages (replacing a page with the same key). RESOURCE_EXHAUSTED when they do not
  // fit; then none of them is stored.
  virtual Status Put(std::span<const PageWrite> pages) = 0;
  // Reads the pages; one Status per page, in order: OK, NOT_FOUND, DATA_LOSS (checksum), IO_ERROR.
  virtual std::vector<Status> Get(std::span<const PageRead> pages) = 0;
  // Starts a Get in the background (prefetch ahead of the layer that needs the pages). The spans
  // must stay valid until the future is ready.
  virtual std::future<std::vector<Status>> GetAsync(std::vector<PageRead> pages) = 0;
  virtual void Erase(std::span<const PageKey> keys) = 0;
  virtual bool Contains(PageKey key) const = 0;
  virtual TierStats stats() const = 0;
};

struct RamTierOptions {
  int64_t capacity_bytes = 256ll << 20;
  bool compress = false;  // zstd level 1 (lossless) before storing
};
// stats(): bytes_used counts stored bytes (compressed sizes when compress is on); write_ops and
// read_ops count one copy per page. A page that does not decompress or fails its checksum is
// DATA_LOSS. name() is "ram" or "ram:zstd".
std::unique_ptr<KvTier> MakeRamTier(const RamTierOptions& options);

struct DiskTierOptions {
  std::string path;             // the page file (created, truncated)
  int64_t capacity_bytes = 1ll << 30;
  int64_t page_bytes = 0;       // every page of this tier has this size (slot size)
  bool direct_io = false;       // O_DIRECT, so reads measure the disk and not the page cache
};
// The file holds fixed slots of round_up(64-byte header + page_bytes, 4096) bytes; stats()
// counts whole slots in bytes_used and capacity_bytes, and pwritev/preadv calls in write_ops and
// read_ops. name() is "disk", "disk:direct", or "disk:buffered (O_DIRECT refused: ...)" when the
// filesystem refuses O_DIRECT. INVALID_ARGUMENT for bad options or a page of the wrong size;
// IO_ERROR (with errno text and the path) when the OS fails a transfer, after which none of that
// Put's pages is stored. The page file is deleted with the tier.
StatusOr<std::unique_ptr<KvTier>> MakeDiskTier(const DiskTierOptions& options);

// "ram:SIZE[:zstd]" or "disk:PATH:SIZE[:direct]" as given to --kv-tier.
struct TierSpec {
  std::string kind;  // "ram" | "disk"
  std::string path;
  int64_t capacity_bytes = 0;
  bool compress = false;
  bool direct_io = false;
};
StatusOr<TierSpec> ParseTierSpec(std::string_view text);

// "256MiB" -> 268435456. Units, case-insensitive: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024),
// KB/MB/GB/TB (powers of 1000); a fraction is allowed ("1.5GiB"); a bare number is bytes.
StatusOr<int64_t> ParseByteSize(std::string_view text);

// The tier a spec describes; page_bytes is the disk tier's slot payload (ignored for ram).
StatusOr<std::unique_ptr<KvTier>> MakeTier(const TierSpec& spec, int64_t page_bytes);

}  // namespace kvl
