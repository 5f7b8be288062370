// One batch of KV events as vLLM's msgspec structs encode it (vllm/distributed/kv_events.py,
// the releases routers decode: structs with array_like=True, omit_defaults=True; the events
// tagged, tag=True, with the class name): every struct is a msgpack array of its fields in
// declaration order, an event's first element its tag.
//
//   KVEventBatch     [ts: float64, events: [...], data_parallel_rank: int]
//   BlockStored      ["BlockStored", block_hashes: [uint], parent_block_hash: uint | nil,
//                     token_ids: [int], block_size: int, lora_id: nil, medium: str]
//   BlockRemoved     ["BlockRemoved", block_hashes: [uint], medium: str]
//   AllBlocksCleared ["AllBlocksCleared"]
//
// Hashes go as msgpack unsigned integers (up to 2^64-1: msgspec's int), as vLLM's int hashes do.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kvl/kv_events.h"

namespace kvl::events_internal {

struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  bool has_parent = false;
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  uint32_t token_begin = 0;  // its token ids: tokens[token_begin, token_begin + token_count)
  uint32_t token_count = 0;
};

// The msgpack payload of one KVEventBatch; `tokens` holds the token ids the events point into.
std::string EncodeKvEventBatch(double timestamp_s, std::span<const KvEvent> events,
                               std::span<const int32_t> tokens, const KvEventOptions& options);

}  // namespace kvl::events_internal
