// The publisher of KV events (kvl/kv_events.h): a queue the engine's step thread appends to
// under a brief lock, and a thread that batches, encodes and sends it, keeps the recent batches
// and answers replay requests, as vLLM's ZmqEventPublisher.
#include "kvl/kv_events.h"

#include <fmt/format.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "kv_event_encoding.h"

namespace kvl {

using events_internal::KvEvent;

namespace {

// The publisher thread's longest sleep: how late a replay request or a batch queued outside a
// step's end can be answered.
constexpr auto kPollPeriod = std::chrono::milliseconds(10);
// Events the engine queues before the publisher takes them, reserved once so the step never
// allocates for them in a steady run (a step of a few sequences changes a few blocks).
constexpr size_t kReservedEvents = 4096;
// Past this many events waiting (a publisher thread that cannot keep up), later ones are dropped
// and counted rather than the engine's memory growing without bound.
constexpr size_t kMaxQueuedEvents = 1 << 20;
// The last frame of a replay: vLLM's END_SEQ, -1 as a signed 8-byte big-endian integer.
constexpr uint64_t kEndOfReplay = ~uint64_t{0};

std::string BigEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

uint64_t FromBigEndian64(const zmq::message_t& m) {
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// vLLM's rule: bind a wildcard or local transport, connect to a named host.
bool BindsEndpoint(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct KvEventPublisher::Impl {
  KvEventOptions options;
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;

  // The engine's side: what it queued since the publisher last took it.
  mutable std::mutex queue_mutex;
  std::condition_variable queue_cv;
  std::vector<KvEvent> queued;
  std::vector<int32_t> queued_tokens;
  bool stopping = false;
  int64_t events_queued = 0;  // step thread (and Create)
  std::atomic<int64_t> events_queued_total{0};
  std::atomic<int64_t> events_dropped{0};

  mutable std::mutex state_mutex;
  KvIndexState state;

  // The publisher thread's own.
  std::vector<KvEvent> sending;
  std::vector<int32_t> sending_tokens;
  uint64_t next_seq = 0;
  std::deque<std::pair<uint64_t, std::string>> recent;  // the last options.replay_batches
  std::atomic<int64_t> batches_sent{0};
  std::atomic<int64_t> replays_served{0};
  std::atomic<int64_t> replay_requests_refused{0};
  std::thread thread;

  void Queue(const KvEvent& event, std::span<const int32_t> tokens) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      if (queued.size() >= kMaxQueuedEvents) {
        events_dropped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      KvEvent& e = queued.emplace_back(event);
      e.token_begin = static_cast<uint32_t>(queued_tokens.size());
      e.token_count = static_cast<uint32_t>(tokens.size());
      queued_tokens.insert(queued_tokens.end(), tokens.begin(), tokens.end());
    }
    ++events_queued;
    events_queued_total.store(events_queued, std::memory_order_relaxed);
  }

  void SendQueued() {
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      std::swap(queued, sending);
      std::swap(queued_tokens, sending_tokens);
    }
    if (sending.empty()) return;
    std::string payload =
        events_internal::EncodeKvEventBatch(WallSeconds(), sending, sending_tokens, options);
    sending.clear();
    sending_tokens.clear();
    const uint64_t seq = next_seq++;
    const std::string seq_bytes = BigEndian64(seq);
    // PUB never blocks: past the high-water mark a slow subscriber loses messages, which it
    // sees as a gap in the sequence numbers and asks the replay socket for.
    pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payload), zmq::send_flags::none);
    batches_sent.fetch_add(1, std::memory_order_relaxed);
    recent.emplace_back(seq, std::move(payload));
    while (static_cast<int64_t>(recent.size()) > options.replay_batches) recent.pop_front();
  }

  // A request is [identity, "", start sequence number (8 bytes, big-endian)]; the answer is
  // [identity, "", seq, payload] for each kept batch from it on, then [identity, "", -1, ""].
  void ServeReplay() {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(*replay, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      return;
    }
    if (frames.size() != 3 || frames[2].size() != 8) {
      replay_requests_refused.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const uint64_t start = FromBigEndian64(frames[2]);
    const std::string identity = frames[0].to_string();
    for (const auto& [seq, payload] : recent) {
      if (seq < start) continue;
      replay->send(zmq::buffer(identity), zmq::send_flags::sndmore);
      replay->send(zmq::message_t(), zmq::send_flags::sndmore);
      replay->send(zmq::buffer(BigEndian64(seq)), zmq::send_flags::sndmore);
      replay->send(zmq::buffer(payload), zmq::send_flags::none);
    }
    replay->send(zmq::buffer(identity), zmq::send_flags::sndmore);
    replay->send(zmq::message_t(), zmq::send_flags::sndmore);
    replay->send(zmq::buffer(BigEndian64(kEndOfReplay)), zmq::send_flags::sndmore);
    replay->send(zmq::message_t(), zmq::send_flags::none);
    replays_served.fetch_add(1, std::memory_order_relaxed);
  }

  void Run() {
    for (;;) {
      if (replay) {
        zmq::pollitem_t item{replay->handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(0));
        if (item.revents & ZMQ_POLLIN) ServeReplay();
      }
      bool stop = false;
      {
        std::unique_lock<std::mutex> lock(queue_mutex);
        queue_cv.wait_for(lock, kPollPeriod, [this] { return stopping || !queued.empty(); });
        stop = stopping;
      }
      SendQueued();
      if (stop) return;
    }
  }
};

StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    const KvEventOptions& options) {
  if (options.endpoint.empty()) return InvalidArgumentError("--kv-events: an address is needed");
  if (options.replay_batches < 1) {
    return InvalidArgumentError(fmt::format(
        "KV events: keep at least 1 batch for replay (got {})", options.replay_batches));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    impl->pub.set(zmq::sockopt::sndhwm, static_cast<int>(options.send_high_water_mark));
    impl->pub.set(zmq::sockopt::linger, 1000);
    if (BindsEndpoint(options.endpoint)) {
      impl->pub.bind(options.endpoint);
    } else {
      impl->pub.connect(options.endpoint);
    }
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(fmt::format(
        "--kv-events {}: {} (use tcp://*:PORT to bind, tcp://HOST:PORT to connect)",
        options.endpoint, e.what()));
  }
  if (!options.replay_endpoint.empty()) {
    try {
      impl->replay.emplace(impl->context, zmq::socket_type::router);
      impl->replay->set(zmq::sockopt::linger, 0);
      impl->replay->bind(options.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return InvalidArgumentError(fmt::format("--kv-events-replay {}: {} (an address to bind)",
                                              options.replay_endpoint, e.what()));
    }
  }
  for (auto* events : {&impl->queued, &impl->sending}) events->reserve(kReservedEvents);
  for (auto* tokens : {&impl->queued_tokens, &impl->sending_tokens}) {
    tokens->reserve(kReservedEvents * static_cast<size_t>(std::max(options.block_size, 1)));
  }
  // A router that indexed an earlier process at this address forgets what it held.
  KvEvent cleared;
  cleared.kind = KvEvent::Kind::kAllCleared;
  impl->Queue(cleared, {});
  impl->state.events_through = impl->events_queued;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mutex);
    impl_->stopping = true;
  }
  impl_->queue_cv.notify_one();
  impl_->thread.join();
}

void KvEventPublisher::BlockStored(uint64_t hash, uint64_t parent_hash, bool first_in_chain,
                                   std::span<const int32_t> tokens) {
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.hash = hash;
  // vLLM's parent_block_hash is None for a chain's first block; ours is the model identity then.
  e.has_parent = !first_in_chain;
  e.parent_hash = parent_hash;
  impl_->Queue(e, tokens);
}

void KvEventPublisher::BlockRemoved(uint64_t hash) {
  KvEvent e;
  e.kind = KvEvent::Kind::kRemoved;
  e.hash = hash;
  impl_->Queue(e, {});
}

// The step's end: its events go out as one batch now, and the index is kept for IndexState.
void KvEventPublisher::IndexSnapshot(std::span<const uint64_t> hashes) {
  {
    std::lock_guard<std::mutex> lock(impl_->state_mutex);
    impl_->state.hashes.assign(hashes.begin(), hashes.end());
    impl_->state.events_through = impl_->events_queued;
  }
  impl_->queue_cv.notify_one();
}

KvIndexState KvEventPublisher::IndexState() const {
  std::lock_guard<std::mutex> lock(impl_->state_mutex);
  return impl_->state;
}

KvEventCounts KvEventPublisher::counts() const {
  KvEventCounts c;
  c.events_queued = impl_->events_queued_total.load(std::memory_order_relaxed);
  c.events_dropped = impl_->events_dropped.load(std::memory_order_relaxed);
  c.batches_sent = impl_->batches_sent.load(std::memory_order_relaxed);
  c.replays_served = impl_->replays_served.load(std::memory_order_relaxed);
  c.replay_requests_refused = impl_->replay_requests_refused.load(std::memory_order_relaxed);
  return c;
}

const KvEventOptions& KvEventPublisher::options() const { return impl_->options; }

}  // namespace kvl
