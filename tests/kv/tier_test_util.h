// Helpers shared by the KV tier tests: page contents, one-page transfers, scratch paths.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvl/kv_tier.h"

namespace kvl {

// Deterministic page contents: compressible ones look like small-integer KV, the others are noise.
inline std::vector<uint8_t> PageBytes(PageKey key, size_t size, bool compressible = false) {
  std::vector<uint8_t> bytes(size);
  std::mt19937_64 rng(key * 0x9E3779B97F4A7C15ull + size);
  for (size_t i = 0; i < size; ++i) {
    bytes[i] =
        compressible ? static_cast<uint8_t>((i / 64 + key) % 7) : static_cast<uint8_t>(rng());
  }
  return bytes;
}

inline Status PutOne(KvTier& tier, PageKey key, const std::vector<uint8_t>& bytes) {
  const PageWrite write{key, bytes};
  return tier.Put(std::span(&write, 1));
}

inline Status GetOne(KvTier& tier, PageKey key, std::vector<uint8_t>& out) {
  const PageRead read{key, out};
  return tier.Get(std::span(&read, 1))[0];
}

inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "kvl_tier_test_" + std::to_string(::getpid()) + "_" + name;
}

}  // namespace kvl
