// KV events in vLLM's wire format (`kvl serve --kv-events`): what KV-aware routers (llm-d's
// precise prefix-cache scorer, NVIDIA Dynamo's KV router, Ray Serve's, the vLLM router) read to
// keep an index of the blocks each replica holds.
//
// The publisher is the KV layer's block observer (kvl/kv_block_observer.h). On the engine's step
// thread it only appends each change to a briefly locked queue; its own thread takes the queue
// (one batch per step, as vLLM sends one per scheduler step), encodes it with msgpack and sends
// it on a ZeroMQ PUB socket as the multipart message [topic, 8-byte big-endian sequence number,
// payload], keeps the last `replay_batches` batches, and answers replay requests on a ROUTER
// socket exactly as vLLM's ZmqEventPublisher does. The payload encoding is in
// src/events/kv_event_encoding.h; docs/KV_EVENTS.md says what each field carries.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvl/kv_block_observer.h"
#include "kvl/status.h"

namespace kvl {

struct KvEventOptions {
  // The PUB socket's address. As vLLM: an address with '*' (tcp://*:5557), "::", ipc:// or
  // inproc:// is bound; any other (tcp://router-host:5557) is connected to (llm-d's indexer
  // binds and the engines connect).
  std::string endpoint;
  // The ROUTER socket that answers replay requests, always bound; empty: none.
  std::string replay_endpoint;
  std::string topic;             // the first frame of every message ("" as vLLM's default)
  int32_t block_size = 16;       // tokens per block: the pool's block_tokens
  int32_t data_parallel_rank = 0;
  // The medium named in the events of the pool's blocks: "GPU", vLLM's name for the memory a
  // request attends from, which routers score as a full hit.
  std::string pool_medium = "GPU";
  int64_t replay_batches = 10000;  // batches kept for replay (vLLM's buffer_steps)
  int64_t send_high_water_mark = 100000;
};

// What the engine held in its prefix index at the end of its last step that changed it, and how
// many events had been queued up to that point (every batch's events, counted from the first).
struct KvIndexState {
  std::vector<uint64_t> hashes;
  int64_t events_through = 0;
};

struct KvEventCounts {
  int64_t events_queued = 0;   // handed over by the engine
  int64_t events_dropped = 0;  // past the queue's bound (a publisher that fell behind): lost
  int64_t batches_sent = 0;
  int64_t replays_served = 0;
  int64_t replay_requests_refused = 0;  // malformed requests, ignored
};

class KvEventPublisher final : public KvBlockObserver {
 public:
  // INVALID_ARGUMENT naming the address when a socket cannot be bound or connected; starts the
  // publisher thread and queues AllBlocksCleared (a router that knew an earlier process at this
  // address forgets what it held).
  static StatusOr<std::unique_ptr<KvEventPublisher>> Create(const KvEventOptions& options);
  ~KvEventPublisher() override;  // sends what is queued (up to a second), then stops

  // KvBlockObserver (the engine's step thread).
  void BlockStored(uint64_t hash, uint64_t parent_hash, bool first_in_chain,
                   std::span<const int32_t> tokens) override;
  void BlockRemoved(uint64_t hash) override;
  void IndexSnapshot(std::span<const uint64_t> hashes) override;

  // Any thread.
  KvIndexState IndexState() const;
  KvEventCounts counts() const;
  const KvEventOptions& options() const;

 private:
  struct Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvl
