// The Redis tier: KV pages as binary string values on a Redis server that several processes
// share (the contract, key layout and failure behaviour are in kvl/kv_tier.h). Pages are found by
// key name alone, so two tiers of the same identity and page size reuse each other's pages, and
// the scope digest in every name keeps other models' pages out of sight.
//
// Thread-safety: the caller's operations share one connection (its mutex serializes them);
// GetAsync work runs on the tier's worker thread over a second connection, so a prefetch never
// waits behind a Put. One more mutex guards the counters and the record of stored pages.
#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "page_checksum.h"
#include "redis_connection.h"
#include "tier_worker.h"
#include "kvl/kv_tier.h"

namespace kvl {
namespace {

using kv_internal::PageChecksum;
using kv_internal::RedisConnection;
using kv_internal::RedisCounters;
using kv_internal::RedisPipeline;
using kv_internal::RedisReplyPtr;

static_assert(std::endian::native == std::endian::little,
              "the value header is stored as it lies in memory: little-endian");

constexpr uint32_t kValueMagic = 0x524c564b;  // "KVLR"
constexpr uint32_t kValueFormatVersion = 1;

// The start of every value; the page follows it.
struct ValueHeader {
  uint32_t magic = kValueMagic;
  uint32_t format_version = kValueFormatVersion;
  uint64_t scope = 0;             // ScopeDigest: the same as in the key name
  uint64_t key = 0;               // the PageKey
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;  // PageChecksum(key, payload)
};
static_assert(sizeof(ValueHeader) == 40);

// A Put's SETs go out in round trips of about this many bytes, so hiredis's output buffer (a
// copy of everything appended) stays small while each round trip still carries many pages.
constexpr int64_t kPutChunkBytes = 8ll << 20;
// Keys per DEL command.
constexpr size_t kEraseChunkKeys = 1024;

// What decides a page's bytes for a key: the identity, the page size and this value format. Two
// tiers share pages exactly when their scopes are equal.
uint64_t ScopeDigest(std::string_view identity, int64_t page_bytes) {
  std::string bytes = "kvl redis tier";
  const uint32_t version = kValueFormatVersion;
  bytes.append(reinterpret_cast<const char*>(&version), sizeof(version));
  bytes.append(reinterpret_cast<const char*>(&page_bytes), sizeof(page_bytes));
  bytes.append(identity);
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string_view AsChars(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

bool StartsWith(const redisReply* reply, std::string_view prefix) {
  return std::string_view(reply->str, reply->len).starts_with(prefix);
}

class RedisTier final : public KvTier {
 public:
  explicit RedisTier(const RedisTierOptions& options)
      : page_bytes_(options.page_bytes),
        scope_(ScopeDigest(options.identity, options.page_bytes)),
        key_prefix_(fmt::format("{}:{:016x}:", options.name_space, scope_)),
        ttl_text_(options.ttl_seconds > 0 ? std::to_string(options.ttl_seconds) : ""),
        connection_(options, &counters_),
        async_connection_(options, &counters_) {}

  ~RedisTier() override { worker_.Stop(); }  // finish GetAsync work before the connections go

  Status Connect() { return connection_.Connect(); }

  std::string_view name() const override { return "redis"; }
  TierKind kind() const override { return TierKind::kRedis; }

  Status Put(std::span<const PageWrite> pages) override {
    for (const PageWrite& page : pages) {
      if (page_bytes_ > 0 && static_cast<int64_t>(page.bytes.size()) != page_bytes_) {
        return InvalidArgumentError(fmt::format("redis tier: page {} has {} bytes, the tier's "
                                                "pages have {}",
                                                page.key, page.bytes.size(), page_bytes_));
      }
    }
    std::vector<size_t> stored;  // indices of pages the server said OK to
    std::string refusal;         // the server's error reply, if any
    bool out_of_memory = false;
    std::vector<uint8_t> value;  // one encoded value at a time: hiredis copies it when appended
    std::vector<RedisReplyPtr> replies;
    int64_t round_trips = 0;
    for (size_t begin = 0; begin < pages.size() && refusal.empty();) {
      size_t end = begin;
      for (int64_t chunk = 0; end < pages.size() && (end == begin || chunk < kPutChunkBytes);
           ++end) {
        chunk += static_cast<int64_t>(sizeof(ValueHeader) + pages[end].bytes.size());
      }
      const Status sent = connection_.RoundTrip(
          [&](RedisPipeline& pipeline) {
            for (size_t i = begin; i < end; ++i) {
              Encode(pages[i], &value);
              const std::string key = KeyName(pages[i].key);
              if (ttl_text_.empty()) {
                pipeline.Append({"SET", key, AsChars(value)});
              } else {
                pipeline.Append({"SET", key, AsChars(value), "EX", ttl_text_});
              }
            }
          },
          &replies);
      if (!replies.empty()) ++round_trips;
      for (size_t j = 0; j < replies.size(); ++j) {
        const redisReply* reply = replies[j].get();
        if (reply->type == REDIS_REPLY_STATUS) {
          stored.push_back(begin + j);
        } else if (refusal.empty()) {
          refusal = reply->type == REDIS_REPLY_ERROR ? std::string(reply->str, reply->len)
                                                     : fmt::format("reply type {}", reply->type);
          out_of_memory = reply->type == REDIS_REPLY_ERROR && StartsWith(reply, "OOM");
        }
      }
      if (!sent.ok()) {
        RecordPut(pages, stored, round_trips, /*failed=*/true);
        return IoError(fmt::format("redis tier: Put of {} pages failed after {} were stored: {}",
                                   pages.size(), stored.size(), sent.message()));
      }
      begin = end;
    }
    if (out_of_memory) {
      // The contract: a Put that does not fit stores none of its pages.
      std::vector<PageKey> keys;
      for (size_t i : stored) keys.push_back(pages[i].key);
      Erase(keys);
      RecordPut(pages, {}, round_trips, /*failed=*/false);
      return ResourceExhaustedError(
          fmt::format("redis tier: server {} is out of memory for {} pages (maxmemory {} bytes, and "
                      "its eviction policy frees nothing for them): {}",
                      connection_.address(), pages.size(),
                      counters_.maxmemory.load(std::memory_order_relaxed), refusal));
    }
    if (!refusal.empty()) {
      RecordPut(pages, stored, round_trips, /*failed=*/true);
      return IoError(fmt::format("redis tier: server {} refused a SET ({} of {} pages stored): {}",
                                 connection_.address(), stored.size(), pages.size(), refusal));
    }
    RecordPut(pages, stored, round_trips, /*failed=*/false);
    return Status::Ok();
  }

  std::vector<Status> Get(std::span<const PageRead> pages) override {
    return GetOver(connection_, pages);
  }

  std::future<std::vector<Status>> GetAsync(std::vector<PageRead> pages) override {
    return worker_.Submit(
        [this, pages = std::move(pages)] { return GetOver(async_connection_, pages); });
  }

  void Erase(std::span<const PageKey> keys) override {
    if (keys.empty()) return;
    {
      // Forgotten whatever the server says: a page left behind is still whole and verified.
      std::lock_guard<std::mutex> lock(mutex_);
      for (PageKey key : keys) ForgetLocked(key);
    }
    std::vector<std::string> names;
    names.reserve(keys.size());
    for (PageKey key : keys) names.push_back(KeyName(key));
    std::vector<RedisReplyPtr> replies;
    const Status sent = connection_.RoundTrip(
        [&](RedisPipeline& pipeline) {
          std::vector<std::string_view> args;
          for (size_t begin = 0; begin < names.size(); begin += kEraseChunkKeys) {
            args.assign({"DEL"});
            const size_t end = std::min(names.size(), begin + kEraseChunkKeys);
            for (size_t i = begin; i < end; ++i) args.push_back(names[i]);
            pipeline.Append(args);
          }
        },
        &replies);
    if (!sent.ok()) CountError();
  }

  bool Contains(PageKey key) const override { return ContainsAll(std::span(&key, 1))[0]; }

  std::vector<bool> ContainsAll(std::span<const PageKey> keys) const override {
    std::vector<bool> found(keys.size(), false);
    if (keys.empty()) return found;
    std::vector<RedisReplyPtr> replies;
    const Status sent = connection_.RoundTrip(
        [&](RedisPipeline& pipeline) {
          for (PageKey key : keys) pipeline.Append({"EXISTS", KeyName(key)});
        },
        &replies);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sent.ok()) ++errors_;
    for (size_t i = 0; i < replies.size(); ++i) {
      found[i] = replies[i]->type == REDIS_REPLY_INTEGER && replies[i]->integer == 1;
      if (replies[i]->type == REDIS_REPLY_INTEGER && !found[i]) ForgetLocked(keys[i]);
    }
    return found;
  }

  TierStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    TierStats s;
    s.pages = static_cast<int64_t>(stored_.size());
    s.bytes_used = stored_bytes_;
    s.capacity_bytes = counters_.maxmemory.load(std::memory_order_relaxed);
    s.puts = puts_;
    s.gets = gets_;
    s.bytes_written = bytes_written_;
    s.bytes_read = bytes_read_;
    s.write_ops = write_ops_;
    s.read_ops = read_ops_;
    s.checksum_failures = checksum_failures_;
    s.evictions = 0;  // the server does not say whose keys it evicted or expired
    s.errors = errors_;
    s.reconnects = counters_.reconnects.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::string KeyName(PageKey key) const { return fmt::format("{}{:016x}", key_prefix_, key); }

  void Encode(const PageWrite& page, std::vector<uint8_t>* value) const {
    ValueHeader header;
    header.scope = scope_;
    header.key = page.key;
    header.payload_bytes = page.bytes.size();
    header.payload_checksum = PageChecksum(page.key, page.bytes);
    value->resize(sizeof(header) + page.bytes.size());
    std::memcpy(value->data(), &header, sizeof(header));
    if (!page.bytes.empty()) {
      std::memcpy(value->data() + sizeof(header), page.bytes.data(), page.bytes.size());
    }
  }

  // Checks a GET's reply against everything the page must be, and only then copies it to out.
  Status Decode(const redisReply* reply, const PageRead& read) const {
    if (reply->type == REDIS_REPLY_NIL) {
      return NotFoundError(fmt::format("redis tier: no page {} ({})", read.key, KeyName(read.key)));
    }
    if (reply->type == REDIS_REPLY_ERROR && !StartsWith(reply, "WRONGTYPE")) {
      return IoError(fmt::format("redis tier: server {} refused a GET: {}", connection_.address(),
                                 std::string_view(reply->str, reply->len)));
    }
    if (reply->type != REDIS_REPLY_STRING) {
      return DataLossError(
          fmt::format("redis tier: page {} ({}) is not a string value", read.key, KeyName(read.key)));
    }
    const auto value = std::span(reinterpret_cast<const uint8_t*>(reply->str), reply->len);
    if (value.size() != sizeof(ValueHeader) + read.out.size()) {
      return DataLossError(fmt::format(
          "redis tier: page {} has a value of {} bytes, expected {} (a {}-byte header and {} "
          "bytes of page)",
          read.key, value.size(), sizeof(ValueHeader) + read.out.size(), sizeof(ValueHeader),
          read.out.size()));
    }
    ValueHeader header;
    std::memcpy(&header, value.data(), sizeof(header));
    const auto payload = value.subspan(sizeof(header));
    const char* wrong = header.magic != kValueMagic                     ? "magic"
                        : header.format_version != kValueFormatVersion ? "format version"
                        : header.scope != scope_                       ? "scope"
                        : header.key != read.key                       ? "key"
                        : header.payload_bytes != read.out.size()      ? "length"
                        : header.payload_checksum != PageChecksum(read.key, payload)
                            ? "checksum"
                            : nullptr;
    if (wrong != nullptr) {
      return DataLossError(fmt::format("redis tier: page {} ({}) has a wrong {}", read.key,
                                       KeyName(read.key), wrong));
    }
    if (!payload.empty()) std::memcpy(read.out.data(), payload.data(), payload.size());
    return Status::Ok();
  }

  std::vector<Status> GetOver(RedisConnection& connection, std::span<const PageRead> pages) {
    std::vector<Status> results(pages.size());
    std::vector<size_t> asked;  // pages whose size is right, in pipeline order
    for (size_t i = 0; i < pages.size(); ++i) {
      if (page_bytes_ > 0 && static_cast<int64_t>(pages[i].out.size()) != page_bytes_) {
        results[i] = InvalidArgumentError(
            fmt::format("redis tier: read of page {} asks for {} bytes, the tier's pages have {}",
                        pages[i].key, pages[i].out.size(), page_bytes_));
      } else {
        asked.push_back(i);
      }
    }
    // With a TTL, each GET is followed by an EXPIRE: the TTL counts from a page's last use.
    const size_t stride = ttl_text_.empty() ? 1 : 2;
    std::vector<RedisReplyPtr> replies;
    Status sent = Status::Ok();
    if (!asked.empty()) {
      sent = connection.RoundTrip(
          [&](RedisPipeline& pipeline) {
            for (size_t i : asked) {
              const std::string key = KeyName(pages[i].key);
              pipeline.Append({"GET", key});
              if (stride == 2) pipeline.Append({"EXPIRE", key, ttl_text_});
            }
          },
          &replies);
    }
    for (size_t j = 0; j < asked.size(); ++j) {
      const size_t i = asked[j];
      results[i] = j * stride < replies.size() ? Decode(replies[j * stride].get(), pages[i])
                                               : IoError(std::string(sent.message()));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sent.ok()) ++errors_;
    if (!replies.empty()) ++read_ops_;
    for (size_t i = 0; i < pages.size(); ++i) {
      if (results[i].ok()) {
        ++gets_;
        bytes_read_ += static_cast<int64_t>(pages[i].out.size());
        // Read, so recently used for the server's LRU.
        if (auto it = stored_.find(pages[i].key); it != stored_.end()) {
          NoteStoredLocked(pages[i].key, it->second.bytes);
        }
        continue;
      }
      // Never leave bytes in out that a caller might take for the page.
      if (!pages[i].out.empty()) std::memset(pages[i].out.data(), 0, pages[i].out.size());
      if (results[i].code() == StatusCode::kDataLoss) ++checksum_failures_;
      if (results[i].code() == StatusCode::kNotFound) ForgetLocked(pages[i].key);
    }
    ForgetEvictedLocked();
    return results;
  }

  void RecordPut(std::span<const PageWrite> pages, const std::vector<size_t>& stored,
                 int64_t round_trips, bool failed) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i : stored) {
      const int64_t bytes = static_cast<int64_t>(sizeof(ValueHeader) + pages[i].bytes.size());
      NoteStoredLocked(pages[i].key, bytes);
      ++puts_;
      bytes_written_ += static_cast<int64_t>(pages[i].bytes.size());
    }
    write_ops_ += round_trips;
    if (failed) ++errors_;
    ForgetEvictedLocked();
  }

  void NoteStoredLocked(PageKey key, int64_t bytes) const {
    auto [it, inserted] = stored_.try_emplace(key);
    if (!inserted) stored_bytes_ -= it->second.bytes;
    it->second = {bytes, ++use_serial_};
    stored_bytes_ += bytes;
    use_order_.push_back({key, use_serial_});
  }

  void ForgetLocked(PageKey key) const {
    auto it = stored_.find(key);
    if (it == stored_.end()) return;
    stored_bytes_ -= it->second.bytes;
    stored_.erase(it);
  }

  // The server evicts by its own maxmemory policy and says nothing of which keys went, so what
  // this process believes stored would otherwise grow with every page it ever wrote (a page
  // that is never read again is never found gone). More value bytes than maxmemory cannot all
  // be held: the least recently written or read are forgotten until they could (the server's
  // LRU is approximate, so a page forgotten here may still be there, and the count a little
  // low). use_order_ lists every use (a page used again is listed again; an entry whose serial
  // is no longer the page's is stale), compacted when stale entries outnumber the pages.
  void ForgetEvictedLocked() const {
    const int64_t maxmemory = counters_.maxmemory.load(std::memory_order_relaxed);
    while (maxmemory > 0 && stored_bytes_ > maxmemory && !use_order_.empty()) {
      const auto [key, serial] = use_order_.front();
      use_order_.pop_front();
      auto it = stored_.find(key);
      if (it != stored_.end() && it->second.serial == serial) ForgetLocked(key);
    }
    if (use_order_.size() > 2 * stored_.size() + 1024) {
      std::erase_if(use_order_, [this](const std::pair<PageKey, uint64_t>& use) {
        auto it = stored_.find(use.first);
        return it == stored_.end() || it->second.serial != use.second;
      });
    }
  }

  void CountError() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++errors_;
  }

  const int64_t page_bytes_;
  const uint64_t scope_;
  const std::string key_prefix_;  // "<name_space>:<scope as 16 hex digits>:"
  const std::string ttl_text_;    // seconds, or empty for no expiry

  RedisCounters counters_;
  mutable RedisConnection connection_;  // the caller's operations
  RedisConnection async_connection_;    // GetAsync work, on worker_'s thread

  mutable std::mutex mutex_;
  // What this process stored and has not erased, found gone or known evicted: key -> value
  // bytes and the serial of its last write or read; use_order_ is their order
  // (ForgetEvictedLocked).
  struct StoredValue {
    int64_t bytes = 0;
    uint64_t serial = 0;
  };
  mutable std::unordered_map<PageKey, StoredValue> stored_;           // guarded by mutex_
  mutable std::deque<std::pair<PageKey, uint64_t>> use_order_;        // guarded by mutex_
  mutable int64_t stored_bytes_ = 0;                                  // guarded by mutex_
  mutable uint64_t use_serial_ = 0;                                   // guarded by mutex_
  int64_t puts_ = 0, gets_ = 0, bytes_written_ = 0, bytes_read_ = 0;  // guarded by mutex_
  int64_t write_ops_ = 0, read_ops_ = 0, checksum_failures_ = 0;      // guarded by mutex_
  mutable int64_t errors_ = 0;                                        // guarded by mutex_

  kv_internal::TierWorker worker_;  // starts its thread at the first GetAsync
};

}  // namespace

StatusOr<std::unique_ptr<KvTier>> MakeRedisTier(const RedisTierOptions& options) {
  auto invalid = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format("redis tier: {}", why));
  };
  if (options.host.empty()) return invalid("the host is empty");
  if (options.port < 1 || options.port > 65535) {
    return invalid(fmt::format("port {} is not from 1 to 65535", options.port));
  }
  if (options.name_space.empty()) return invalid("the namespace is empty");
  if (options.page_bytes < 0) return invalid("page_bytes is negative");
  if (options.ttl_seconds < 0) return invalid("ttl_seconds is negative");
  if (options.connect_timeout_ms <= 0 || options.io_timeout_ms <= 0) {
    return invalid("the connect and I/O timeouts must be positive");
  }
  auto tier = std::make_unique<RedisTier>(options);
  KVL_RETURN_IF_ERROR(tier->Connect());
  return std::unique_ptr<KvTier>(std::move(tier));
}

}  // namespace kvl
