// Helpers shared by the KV tier tests: page contents, one-page transfers, scratch paths.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <future>
#include <memory>
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

// A tier whose reads, synchronous and asynchronous, can be made to fail as a corrupt page's do
// (DATA_LOSS); everything else is the inner tier's.
class FailingReadsTier final : public KvTier {
 public:
  explicit FailingReadsTier(std::unique_ptr<KvTier> inner) : inner_(std::move(inner)) {}
  bool fail_reads = false;

  std::string_view name() const override { return inner_->name(); }
  TierKind kind() const override { return inner_->kind(); }
  Status Put(std::span<const PageWrite> pages) override { return inner_->Put(pages); }
  std::vector<Status> Get(std::span<const PageRead> pages) override {
    std::vector<Status> statuses = inner_->Get(pages);
    if (fail_reads) {
      for (Status& s : statuses) s = DataLossError("page checksum mismatch (test)");
    }
    return statuses;
  }
  std::future<std::vector<Status>> GetAsync(std::vector<PageRead> pages) override {
    if (!fail_reads) return inner_->GetAsync(std::move(pages));
    std::promise<std::vector<Status>> done;
    done.set_value(Get(pages));
    return done.get_future();
  }
  void Erase(std::span<const PageKey> keys) override { inner_->Erase(keys); }
  bool Contains(PageKey key) const override { return inner_->Contains(key); }
  bool reads_in_place() const override { return inner_->reads_in_place(); }
  TierStats stats() const override { return inner_->stats(); }
  const uint8_t* PeekPage(PageKey key, int64_t page_bytes) override {
    return inner_->PeekPage(key, page_bytes);
  }

 private:
  std::unique_ptr<KvTier> inner_;
};

inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "kvl_tier_test_" + std::to_string(::getpid()) + "_" + name;
}

}  // namespace kvl
