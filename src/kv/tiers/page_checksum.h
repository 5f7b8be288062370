// The checksum every KV tier stores with a page. Seeding the hash with the page's key means that
// a page read back under the wrong key (a stale slot, a mixed-up index) fails verification just
// like a flipped bit does.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <span>

#include "kvl/kv_tier.h"

namespace kvl::kv_internal {

inline uint64_t PageChecksum(PageKey key, std::span<const uint8_t> bytes) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), key);
}

}  // namespace kvl::kv_internal
