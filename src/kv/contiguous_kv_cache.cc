#include <fmt/format.h>

#include <new>

#include "kvl/kv_cache.h"

namespace kvl {

StatusOr<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::Create(int64_t num_layers,
                                                                       int64_t kv_dim,
                                                                       int32_t num_seqs,
                                                                       int64_t max_positions) {
  const double bytes = 2.0 * 4.0 * static_cast<double>(num_layers) * static_cast<double>(kv_dim) *
                       num_seqs * static_cast<double>(max_positions);
  if (num_layers <= 0 || kv_dim <= 0 || num_seqs <= 0 || max_positions <= 0) {
    return InvalidArgumentError("KV cache dimensions must be positive");
  }
  if (bytes > 64.0 * (1ull << 30)) {
    return ResourceExhaustedError(fmt::format(
        "a KV cache of {} sequences x {} positions needs {:.1f} GiB; lower -c or -np", num_seqs,
        max_positions, bytes / (1ull << 30)));
  }
  try {
    return std::unique_ptr<ContiguousKvCache>(
        new ContiguousKvCache(num_layers, kv_dim, num_seqs, max_positions));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {:.1f} GiB for the KV cache", bytes / (1ull << 30)));
  }
}

ContiguousKvCache::ContiguousKvCache(int64_t num_layers, int64_t kv_dim, int32_t num_seqs,
                                     int64_t max_positions)
    : num_layers_(num_layers),
      kv_dim_(kv_dim),
      num_seqs_(num_seqs),
      max_positions_(max_positions),
      k_(static_cast<size_t>(num_seqs * num_layers * max_positions * kv_dim)),
      v_(k_.size()) {}

KvCache::Rows ContiguousKvCache::RowsAt(int32_t seq, int64_t layer, int64_t pos) {
  KVL_CHECK(seq >= 0 && seq < num_seqs_);
  KVL_CHECK(layer >= 0 && layer < num_layers_);
  KVL_CHECK(pos >= 0 && pos < max_positions_);
  const size_t offset =
      static_cast<size_t>(((seq * num_layers_ + layer) * max_positions_ + pos) * kv_dim_);
  return Rows{k_.data() + offset, v_.data() + offset, max_positions_ - pos, kv_dim_};
}

}  // namespace kvl
