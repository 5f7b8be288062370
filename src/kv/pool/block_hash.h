// The hash chain that names full blocks: hash(block k) = BlockHash(hash(block k-1), its tokens),
// with the model identity standing in for the parent of block 0. A hash only finds a candidate;
// the prefix index always confirms a hit by comparing tokens and parent, so the hash needs to be
// well mixed, not cryptographic.
#pragma once

#include <cstdint>
#include <span>

namespace kvl::kv_internal {

// splitmix64's finalizer: a bijection on 64 bits with full avalanche.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline uint64_t DefaultBlockHash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  // The length is mixed in so that a block of n tokens never equals a prefix of a longer one.
  uint64_t h = Mix64(parent_hash ^ (kGolden * (tokens.size() + 1)));
  size_t i = 0;
  // Two token ids per round: each round is a bijection of (h, word), so two different blocks
  // with the same parent collide only by chance.
  for (; i + 1 < tokens.size(); i += 2) {
    const uint64_t word = static_cast<uint32_t>(tokens[i]) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    h = Mix64(h + kGolden + word);
  }
  if (i < tokens.size()) h = Mix64(h + kGolden + static_cast<uint32_t>(tokens[i]));
  return h;
}

}  // namespace kvl::kv_internal
