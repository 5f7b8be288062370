#include "redis_connection.h"

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace kvl::kv_internal {
namespace {

// hiredis sends with write(2). On a socket the server has closed, the kernel answers a write
// with SIGPIPE, whose default action ends the process: a Redis restart would take the engine
// down with it. Blocking SIGPIPE in this thread for the round trip turns it into EPIPE (an I/O
// error hiredis reports); one raised meanwhile is consumed before the old mask comes back, so it
// is never delivered late. The process's own SIGPIPE disposition is left alone.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec no_wait{0, 0};
        sigtimedwait(&sigpipe_, nullptr, &no_wait);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t sigpipe_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

timeval Milliseconds(int ms) {
  return timeval{.tv_sec = ms / 1000, .tv_usec = static_cast<suseconds_t>(ms % 1000) * 1000};
}

std::string FormatAddress(const std::string& host, int port) {
  // An IPv6 literal goes in brackets, as in the tier spec.
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

}  // namespace

void RedisPipeline::Append(std::span<const std::string_view> args) {
  argv_.clear();
  argv_lengths_.clear();
  for (std::string_view arg : args) {
    argv_.push_back(arg.data());
    argv_lengths_.push_back(arg.size());
  }
  if (redisAppendCommandArgv(context_, static_cast<int>(argv_.size()), argv_.data(),
                             argv_lengths_.data()) != REDIS_OK) {
    ok_ = false;
    return;
  }
  ++count_;
}

RedisConnection::RedisConnection(const RedisTierOptions& options, RedisCounters* counters)
    : host_(options.host),
      port_(options.port),
      connect_timeout_ms_(options.connect_timeout_ms),
      io_timeout_ms_(options.io_timeout_ms),
      address_(FormatAddress(options.host, options.port)),
      counters_(counters) {}

RedisConnection::~RedisConnection() {
  if (context_ != nullptr) redisFree(context_);
}

Status RedisConnection::Connect() {
  std::lock_guard<std::mutex> lock(mutex_);
  return EnsureConnectedLocked();
}

Status RedisConnection::RoundTrip(const std::function<void(RedisPipeline&)>& append,
                                  std::vector<RedisReplyPtr>* replies) {
  replies->clear();
  std::lock_guard<std::mutex> lock(mutex_);
  KVL_RETURN_IF_ERROR(EnsureConnectedLocked());
  return RoundTripLocked(append, replies);
}

Status RedisConnection::EnsureConnectedLocked() {
  if (context_ != nullptr) return Status::Ok();
  const Clock::time_point now = Clock::now();
  if (now < next_attempt_) {
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_attempt_ - now).count();
    return IoError(fmt::format("{}; next reconnect attempt in {} ms", last_error_, wait));
  }
  Status connected = ConnectLocked();
  if (!connected.ok()) {
    last_error_ = connected.message();
    next_attempt_ = now + next_delay_;
    next_delay_ = std::min(next_delay_ * 2, kMaxReconnectDelay);
    return connected;
  }
  if (ever_connected_) counters_->reconnects.fetch_add(1, std::memory_order_relaxed);
  ever_connected_ = true;
  next_delay_ = kFirstReconnectDelay;
  return Status::Ok();
}

Status RedisConnection::ConnectLocked() {
  redisContext* context =
      redisConnectWithTimeout(host_.c_str(), port_, Milliseconds(connect_timeout_ms_));
  if (context == nullptr) {
    return IoError(fmt::format("redis server {} is unavailable: out of memory for a connection",
                               address_));
  }
  if (context->err != 0) {
    std::string why = context->errstr;
    redisFree(context);
    return IoError(fmt::format("redis server {} is unavailable: {} (connect timeout {} ms)",
                               address_, why, connect_timeout_ms_));
  }
  if (redisSetTimeout(context, Milliseconds(io_timeout_ms_)) != REDIS_OK) {
    std::string why = context->errstr;
    redisFree(context);
    return IoError(fmt::format("redis server {}: cannot set the I/O timeout: {}", address_, why));
  }
  redisEnableKeepAlive(context);  // best effort: notices a vanished peer on an idle connection
  context_ = context;

  // PING proves a Redis server answers and lets us in (one asking for a password does not).
  std::vector<RedisReplyPtr> replies;
  Status pinged = RoundTripLocked(
      [](RedisPipeline& p) {
        p.Append({"PING"});
        p.Append({"CONFIG", "GET", "maxmemory"});
      },
      &replies);
  if (!pinged.ok()) return pinged;  // RoundTripLocked dropped the connection
  const redisReply* pong = replies[0].get();
  if (pong->type != REDIS_REPLY_STATUS || std::string_view(pong->str, pong->len) != "PONG") {
    std::string answer = pong->type == REDIS_REPLY_ERROR || pong->type == REDIS_REPLY_STATUS ||
                                 pong->type == REDIS_REPLY_STRING
                             ? std::string(pong->str, pong->len)
                             : fmt::format("a reply of type {}", pong->type);
    redisFree(context_);
    context_ = nullptr;
    return IoError(fmt::format("redis server {} is unavailable: PING answered '{}'", address_,
                               answer));
  }
  // CONFIG may be renamed or refused (managed Redis services): then the capacity is unknown (0).
  int64_t maxmemory = 0;
  const redisReply* config = replies[1].get();
  if (config->type == REDIS_REPLY_ARRAY && config->elements == 2 &&
      config->element[1]->type == REDIS_REPLY_STRING) {
    maxmemory = std::strtoll(config->element[1]->str, nullptr, 10);
  }
  counters_->maxmemory.store(maxmemory, std::memory_order_relaxed);
  return Status::Ok();
}

Status RedisConnection::RoundTripLocked(const std::function<void(RedisPipeline&)>& append,
                                        std::vector<RedisReplyPtr>* replies) {
  ScopedSigpipeBlock no_sigpipe;
  RedisPipeline pipeline(context_);
  append(pipeline);
  if (!pipeline.ok()) {
    // Part of a command may sit in the output buffer: the connection's state is unknown.
    DropLocked(fmt::format("redis server {}: hiredis could not allocate a command", address_));
    return IoError(last_error_);
  }
  for (int i = 0; i < pipeline.count(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(context_, &reply) != REDIS_OK || reply == nullptr) {
      DropLocked(fmt::format("redis server {}: {}", address_, DescribeErrorLocked()));
      return IoError(last_error_);
    }
    replies->emplace_back(static_cast<redisReply*>(reply));
  }
  return Status::Ok();
}

std::string RedisConnection::DescribeErrorLocked() const {
  if (context_->err == REDIS_ERR_EOF) return "the server closed the connection";
  // A blocking socket whose SO_RCVTIMEO/SO_SNDTIMEO expired reports EAGAIN.
  if (context_->err == REDIS_ERR_IO &&
      std::strcmp(context_->errstr, std::strerror(EAGAIN)) == 0) {
    return fmt::format("no answer within the I/O timeout ({} ms)", io_timeout_ms_);
  }
  return context_->errstr[0] != '\0' ? std::string(context_->errstr) : "unknown hiredis error";
}

void RedisConnection::DropLocked(std::string message) {
  redisFree(context_);
  context_ = nullptr;
  last_error_ = std::move(message);
  next_attempt_ = Clock::now() + kFirstReconnectDelay;
  next_delay_ = std::min(kFirstReconnectDelay * 2, kMaxReconnectDelay);
}

}  // namespace kvl::kv_internal
