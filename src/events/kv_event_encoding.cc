#include "kv_event_encoding.h"

#include <msgpack.hpp>

#include <string_view>

namespace kvl::events_internal {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackEvent(Packer& pk, const KvEvent& e, std::span<const int32_t> tokens,
               const KvEventOptions& options) {
  switch (e.kind) {
    case KvEvent::Kind::kStored:
      pk.pack_array(7);
      PackString(pk, "BlockStored");
      pk.pack_array(1);
      pk.pack_uint64(e.hash);
      if (e.has_parent) {
        pk.pack_uint64(e.parent_hash);
      } else {
        pk.pack_nil();
      }
      pk.pack_array(e.token_count);
      for (int32_t t : tokens.subspan(e.token_begin, e.token_count)) pk.pack_int32(t);
      pk.pack_int32(options.block_size);
      pk.pack_nil();  // lora_id: kvl serves no adapters
      PackString(pk, options.pool_medium);
      return;
    case KvEvent::Kind::kRemoved:
      pk.pack_array(3);
      PackString(pk, "BlockRemoved");
      pk.pack_array(1);
      pk.pack_uint64(e.hash);
      PackString(pk, options.pool_medium);
      return;
    case KvEvent::Kind::kAllCleared:
      pk.pack_array(1);
      PackString(pk, "AllBlocksCleared");
      return;
  }
}

}  // namespace

std::string EncodeKvEventBatch(double timestamp_s, std::span<const KvEvent> events,
                               std::span<const int32_t> tokens, const KvEventOptions& options) {
  msgpack::sbuffer buffer;
  Packer pk(&buffer);
  pk.pack_array(3);
  pk.pack_double(timestamp_s);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) PackEvent(pk, e, tokens, options);
  pk.pack_int32(options.data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

}  // namespace kvl::events_internal
