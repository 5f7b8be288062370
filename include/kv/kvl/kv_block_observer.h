// The one place the KV layer tells the world which blocks it holds: every change of the prefix
// index (a full block becomes findable by prefix, or stops being so), and at the end of each step
// that changed it, the whole index. `kvl serve --kv-events` hands the engine an observer that
// publishes these as vLLM's KV events (src/events/), so that a KV-aware router keeps an index of
// what this replica holds; nothing in the KV layer depends on who listens.
//
// Threading: every call comes from the engine's step thread, inside the step: an implementation
// must only copy what it is given into a queue and return (no I/O, no waiting on a consumer).
#pragma once

#include <cstdint>
#include <span>

namespace kvl {

class KvBlockObserver {
 public:
  virtual ~KvBlockObserver() = default;

  // A full block entered the prefix index under `hash` (the pool's hash chain over 16-token
  // blocks, kv/pool/block_hash.h). `first_in_chain`: block 0 of its sequence, whose
  // parent_hash is the model identity rather than a block's.
  virtual void BlockStored(uint64_t hash, uint64_t parent_hash, bool first_in_chain,
                           std::span<const int32_t> tokens) = 0;
  // The block under `hash` left the prefix index (its pool block was taken for other contents).
  virtual void BlockRemoved(uint64_t hash) = 0;
  // The prefix index's every hash, read from the index itself at the end of a step that changed
  // it: the engine's state that a consumer of the events can be checked against. `hashes` is
  // valid during the call only.
  virtual void IndexSnapshot(std::span<const uint64_t> hashes) = 0;
};

}  // namespace kvl
