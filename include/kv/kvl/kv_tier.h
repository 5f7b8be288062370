// Slower tiers a KV page can be demoted to: a host-RAM pool, a local disk page file and a Redis
// server shared by processes. A page is the bytes of one KV block (K and V of every layer for
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
  // A cached page (the KV store's content-addressed pages): the tier may drop it, least recently
  // used first, to make room for a later Put. Other pages stay until they are erased.
  bool evictable = false;
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
  int64_t evictions = 0;        // pages dropped to make room (LRU), total
  // Remote tiers (Redis): operations that failed because the connection or the server did (each
  // Put, Get, Erase, Contains or ContainsAll call counts once), and connections re-established
  // after one was lost. Always 0 for local tiers.
  int64_t errors = 0;
  int64_t reconnects = 0;
};

// What a tier is, which decides how the engine uses it (a RAM tier is read in place, a disk or
// Redis tier outlives the process; each has a policy action that demotes pages to it: demote,
// demote-disk, demote-redis).
enum class TierKind : uint8_t { kRam, kDisk, kRedis };
std::string_view TierKindName(TierKind kind);  // "ram" | "disk" | "redis"

class KvTier {
 public:
  virtual ~KvTier() = default;
  virtual std::string_view name() const = 0;  // "ram", "disk", "ram (zstd)", ...
  virtual TierKind kind() const = 0;

  // Stores the pages (replacing a page with the same key). RESOURCE_EXHAUSTED when they do not
  // fit; then none of them is stored.
  virtual Status Put(std::span<const PageWrite> pages) = 0;
  // Reads the pages; one Status per page, in order: OK, NOT_FOUND, DATA_LOSS (checksum), IO_ERROR.
  virtual std::vector<Status> Get(std::span<const PageRead> pages) = 0;
  // Starts a Get in the background (prefetch ahead of the layer that needs the pages). The spans
  // must stay valid until the future is ready.
  virtual std::future<std::vector<Status>> GetAsync(std::vector<PageRead> pages) = 0;
  virtual void Erase(std::span<const PageKey> keys) = 0;
  // Makes stored pages evictable or not (pins them while a running sequence reads them), as if
  // they had been written so. Keys the tier does not hold are ignored; a tier that never evicts
  // on its own (or, like Redis, evicts by the server's policy) may ignore the call.
  virtual void SetEvictable(std::span<const PageKey> keys, bool evictable) {
    (void)keys;
    (void)evictable;
  }
  virtual bool Contains(PageKey key) const = 0;
  // Contains for many keys, one answer per key in order. A tier that can ask about many keys at
  // once (Redis: one pipelined round trip) overrides it; this one asks key by key.
  virtual std::vector<bool> ContainsAll(std::span<const PageKey> keys) const {
    std::vector<bool> found(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) found[i] = Contains(keys[i]);
    return found;
  }
  // Whether PeekPage can hand out pages in place (an uncompressed RAM tier): pages kept here
  // for a running sequence need no staging buffers.
  virtual bool reads_in_place() const { return false; }
  virtual TierStats stats() const = 0;
  // The page's bytes where the tier holds them, for reading in place (a RAM tier storing it
  // uncompressed); nullptr when the tier cannot (compressed, on disk, remote) or does not hold
  // it. Valid until the next Put, Erase or eviction; counts as a use for LRU eviction. Reading
  // in place skips the checksum: the bytes are the tier's own memory, verified when written.
  virtual const uint8_t* PeekPage(PageKey key, int64_t page_bytes) {
    (void)key;
    (void)page_bytes;
    return nullptr;
  }
};

struct RamTierOptions {
  int64_t capacity_bytes = 256ll << 20;
  bool compress = false;  // zstd level 1 (lossless) before storing
};
// stats(): bytes_used counts stored bytes (compressed sizes when compress is on); write_ops and
// read_ops count one copy per page. A Put that does not fit evicts evictable pages, least
// recently written or read first, and is RESOURCE_EXHAUSTED only when those do not make room. A page that does not decompress or fails its checksum is
// DATA_LOSS. name() is "ram" or "ram:zstd".
std::unique_ptr<KvTier> MakeRamTier(const RamTierOptions& options);

struct DiskTierOptions {
  std::string path;             // the page file (see "ownership" below)
  int64_t capacity_bytes = 1ll << 30;
  int64_t page_bytes = 0;       // every page of this tier has this size (slot size)
  bool direct_io = false;       // O_DIRECT, so reads measure the disk and not the page cache
  // Persistent: the file outlives the tier and its pages are found again by the next tier opened
  // on it with the same identity and page size. Scratch (false): the file starts empty and is
  // deleted with the tier (and by the signal cleanup of kvl/temp_files.h).
  bool persistent = true;
  // What the pages are, as opaque bytes (at most kMaxDiskTierIdentityBytes): everything that
  // decides a page's bytes for a key. The engine passes the model identity (weights digest,
  // tokenizer, block size, KV dtype and layout). A file written under another identity, format
  // version or page size is started empty, never read.
  std::string identity{};
  // When a Put does not fit: false evicts only pages written evictable (PageWrite::evictable) and
  // pages found in the file at open, least recently written or read first, and keeps the others
  // until they are erased (the Put is RESOURCE_EXHAUSTED when evicting cannot make room); true
  // evicts any page.
  bool evict_lru = false;
  // A Get's reads all in flight at once through io_uring, where the build has liburing and the
  // kernel allows it; false (or refused): one preadv after another. The bytes are the same.
  bool io_uring = true;
};
inline constexpr int64_t kMaxDiskTierIdentityBytes = 4032;

// A disk tier, with what it can tell beyond KvTier about the file it keeps.
class DiskKvTier : public KvTier {
 public:
  // What open did, for the user: "created", "reopened with 12 pages", or "started empty: <why>"
  // (another identity, format version or page size, a damaged header).
  virtual const std::string& open_note() const = 0;
  // Pages found in the file at open (0 when it was created or started empty).
  virtual int64_t pages_reloaded() const = 0;
  // Every key held now: pages that may be evicted, least recently used first, then the rest.
  virtual std::vector<PageKey> Keys() const = 0;
  // Flushes written pages to the device (fdatasync), so they survive a power loss too. A crash of
  // the process never needs it: written pages are in the OS's cache.
  virtual Status Sync() = 0;
};

// The file is a header (magic, format version, identity, page size) and fixed slots of
// round_up(64-byte record + page_bytes, 4096) bytes; each slot's record names its key and
// carries checksums, so the index is rebuilt at open by reading the records (layout in
// src/kv/tiers/disk_tier.h). stats() counts whole slots in bytes_used and capacity_bytes (the header is
// outside the capacity), pwritev calls in write_ops and read requests (a run of consecutive slots
// each, whether issued by preadv or through io_uring) in read_ops. name() is "disk",
// "disk:direct", or "disk:buffered (O_DIRECT refused: ...)" when the filesystem refuses O_DIRECT.
//
// Ownership: the tier creates a new file itself (O_CREAT|O_EXCL, mode 0600), never follows a
// symbolic link, and refuses (INVALID_ARGUMENT, naming the path and why) anything that is not a
// regular file starting with its header: a user's file is never written, truncated or deleted.
// It holds an exclusive lock (flock) on the file while open: a second tier on the same path, in
// this process or another, is refused. Its own file with another identity, version or page
// size is truncated and started empty (open_note() says so).
//
// Crashes: a page is one write of record and payload; the record's checksum covers its fields
// and the payload's checksum, seeded by the key. A write torn by a crash or kill -9 leaves a slot
// whose record or payload fails its checksum: a miss (NOT_FOUND at open, DATA_LOSS at Get),
// never wrong bytes; other pages are intact. Erase is not written to the file: an erased page can
// be found again after a reopen, with the exact bytes it was put with under its key.
//
// Errors: INVALID_ARGUMENT for bad options or a page of the wrong size; IO_ERROR (with the path
// and the OS's errno text: ENOSPC, EPERM, EIO, ...) when the OS fails an open or a transfer,
// after which none of that Put's pages is stored.
StatusOr<std::unique_ptr<DiskKvTier>> MakeDiskTier(const DiskTierOptions& options);

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string name_space = "kvl";  // the first part of every key name
  // What the pages are, as opaque bytes, like DiskTierOptions::identity: tiers with the same
  // identity and page size share pages (two processes serving one model); others never see them.
  std::string identity{};
  int64_t page_bytes = 0;   // every page has this size; 0: any size
  int64_t ttl_seconds = 0;  // expiry of a page after its last Put or Get; 0: none (the server's
                            // maxmemory and eviction policy bound what it keeps)
  int connect_timeout_ms = 200;
  int io_timeout_ms = 1000;  // bound on each read or write on the connection
};

// A tier on a Redis server, through hiredis. Each page is one string value under
// "<name_space>:<16 hex digits of the scope>:<16 hex digits of the PageKey>", the scope being a
// digest of the identity, the page size and the value format's version. A value is a 40-byte
// header (magic, format version, scope, key, payload length, XXH3 checksum of the payload seeded
// with the key) followed by the page; Get checks all of it, so a value that was damaged, cut
// short, or written under another key or scope is DATA_LOSS (counted in checksum_failures), never
// wrong bytes. A Put is one pipeline of SETs (in chunks of a few MiB), a Get one pipeline of GETs
// (each followed by an EXPIRE when ttl_seconds refreshes it), ContainsAll one pipeline of EXISTS,
// an Erase one DEL. GetAsync runs on a worker thread with its own connection.
//
// Creation connects and sends PING: a server that cannot be reached is IO_ERROR naming
// host:port. Afterwards a lost connection makes each operation fail at once (Put IO_ERROR, Get
// IO_ERROR for every page not yet read, Contains false), each read or write bounded by
// io_timeout_ms; the tier then reconnects at the first operation after a delay that starts at
// 50 ms and doubles to 2 s while attempts fail. A Put refused by the server's maxmemory
// (noeviction policy) is RESOURCE_EXHAUSTED and the pages of it already written are deleted.
//
// stats(): pages and bytes_used are what this process stored and has not erased (values with
// their headers), less pages a Get or Contains found gone; the server may have evicted or expired
// more, and other processes' pages are not counted. capacity_bytes is the server's maxmemory
// (CONFIG GET at connection; 0 when unlimited or refused). evictions is 0: the server does not
// say whose keys it evicted. write_ops and read_ops count round trips.
StatusOr<std::unique_ptr<KvTier>> MakeRedisTier(const RedisTierOptions& options);

// "ram:SIZE[:zstd]", "disk:PATH:SIZE[:direct][:scratch]" or
// "redis://HOST[:PORT][/NAMESPACE][?ttl=SECONDS]" as given to --kv-tier. A disk tier is
// persistent unless ":scratch" is given. A redis HOST may be an IPv6 address in brackets.
struct TierSpec {
  TierKind kind = TierKind::kRam;
  std::string path;
  int64_t capacity_bytes = 0;
  bool compress = false;
  bool direct_io = false;
  bool persistent = true;  // disk only
  std::string host;        // redis only
  int port = 6379;
  std::string name_space = "kvl";
  int64_t ttl_seconds = 0;
};
StatusOr<TierSpec> ParseTierSpec(std::string_view text);

// "256MiB" -> 268435456. Units, case-insensitive: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024),
// KB/MB/GB/TB (powers of 1000); a fraction is allowed ("1.5GiB"); a bare number is bytes.
StatusOr<int64_t> ParseByteSize(std::string_view text);

// The tiers a pool's pages can go to while their sequence runs or waits (any may be absent).
struct KvTiers {
  KvTier* ram = nullptr;
  KvTier* disk = nullptr;
  KvTier* redis = nullptr;  // pages demoted over the network (--kv-policy demote-redis, auto)
};

// The tier a spec describes; page_bytes is the disk tier's slot payload and identity its
// DiskTierOptions::identity, and the same for redis (both ignored for ram).
StatusOr<std::unique_ptr<KvTier>> MakeTier(const TierSpec& spec, int64_t page_bytes,
                                           std::string_view identity = {});

}  // namespace kvl
