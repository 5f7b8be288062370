// One connection of the Redis KV tier to its server: hiredis in blocking mode with a timeout on
// every read and write, pipelined round trips, and a reconnect schedule. When the connection is
// lost it is dropped, and the next round trip whose time has come connects again; until then
// round trips fail at once, so a server that went away costs the caller nothing but a miss.
//
// Thread-safety: one mutex serializes round trips (and reconnects) on a connection. The counters
// are atomics, shared by all the connections of a tier.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/kv_tier.h"
#include "kvl/status.h"

namespace kvl::kv_internal {

struct RedisReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

// What the connections of one tier share.
struct RedisCounters {
  std::atomic<int64_t> reconnects{0};  // connections re-established after a loss
  std::atomic<int64_t> maxmemory{0};   // the server's, as CONFIG GET said at the last connect
};

// The commands of one round trip, handed to hiredis as they are appended (it copies them into
// its output buffer, so the arguments need not outlive Append).
class RedisPipeline {
 public:
  explicit RedisPipeline(redisContext* context) : context_(context) {}
  // One command; arguments are binary-safe bytes.
  void Append(std::span<const std::string_view> args);
  void Append(std::initializer_list<std::string_view> args) {
    Append(std::span<const std::string_view>(args.begin(), args.size()));
  }
  int count() const { return count_; }
  bool ok() const { return ok_; }  // false when hiredis could not allocate a command

 private:
  redisContext* context_;
  int count_ = 0;
  bool ok_ = true;
  std::vector<const char*> argv_;  // scratch for Append
  std::vector<size_t> argv_lengths_;
};

class RedisConnection {
 public:
  // The first reconnect attempt after a loss waits this long; each failed attempt doubles the
  // wait, up to kMaxReconnectDelay.
  static constexpr std::chrono::milliseconds kFirstReconnectDelay{50};
  static constexpr std::chrono::milliseconds kMaxReconnectDelay{2000};

  RedisConnection(const RedisTierOptions& options, RedisCounters* counters);
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;
  ~RedisConnection();

  // Connects now (the tier's creation): IO_ERROR naming host:port when the server cannot be
  // reached or does not answer PING.
  Status Connect();

  // Connects first when the connection is down and its reconnect time has come (IO_ERROR at once
  // when it has not), lets `append` add the round trip's commands, sends them and reads one reply
  // per command into *replies, in order. When the connection fails (or a read or write times
  // out), *replies holds the replies read before it, the connection is dropped, the next attempt
  // is scheduled, and the status is IO_ERROR naming host:port and why.
  Status RoundTrip(const std::function<void(RedisPipeline&)>& append,
                   std::vector<RedisReplyPtr>* replies);

  const std::string& address() const { return address_; }  // "host:port"

 private:
  using Clock = std::chrono::steady_clock;

  Status EnsureConnectedLocked();
  Status ConnectLocked();
  Status RoundTripLocked(const std::function<void(RedisPipeline&)>& append,
                         std::vector<RedisReplyPtr>* replies);
  void DropLocked(std::string message);  // message: what failed, naming the server
  std::string DescribeErrorLocked() const;

  const std::string host_;
  const int port_;
  const int connect_timeout_ms_;
  const int io_timeout_ms_;
  const std::string address_;
  RedisCounters* const counters_;

  std::mutex mutex_;
  redisContext* context_ = nullptr;  // null while down; guarded by mutex_
  bool ever_connected_ = false;      // guarded by mutex_
  std::string last_error_;           // why it is down, naming the server; guarded by mutex_
  Clock::time_point next_attempt_{};                       // guarded by mutex_
  std::chrono::milliseconds next_delay_ = kFirstReconnectDelay;  // after the next failed attempt
};

}  // namespace kvl::kv_internal
