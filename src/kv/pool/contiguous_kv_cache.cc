#include <fmt/format.h>

#include <algorithm>
#include <new>

#include "kvl/kv_cache.h"

namespace kvl {

StatusOr<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::Create(int64_t num_layers,
                                                                       int64_t kv_dim,
                                                                       int32_t num_seqs,
                                                                       int64_t max_positions,
                                                                       int64_t residual_dim) {
  const double bytes = 4.0 * static_cast<double>(num_layers) *
                       static_cast<double>(2 * kv_dim + residual_dim) * num_seqs *
                       static_cast<double>(max_positions);
  if (num_layers <= 0 || kv_dim <= 0 || num_seqs <= 0 || max_positions <= 0 || residual_dim < 0) {
    return InvalidArgumentError("KV cache dimensions must be positive");
  }
  if (bytes > 64.0 * (1ull << 30)) {
    return ResourceExhaustedError(fmt::format(
        "a KV cache of {} sequences x {} positions needs {:.1f} GiB; lower -c or -np", num_seqs,
        max_positions, bytes / (1ull << 30)));
  }
  try {
    return std::unique_ptr<ContiguousKvCache>(
        new ContiguousKvCache(num_layers, kv_dim, num_seqs, max_positions, residual_dim));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {:.1f} GiB for the KV cache", bytes / (1ull << 30)));
  }
}

ContiguousKvCache::ContiguousKvCache(int64_t num_layers, int64_t kv_dim, int32_t num_seqs,
                                     int64_t max_positions, int64_t residual_dim)
    : num_layers_(num_layers),
      kv_dim_(kv_dim),
      num_seqs_(num_seqs),
      max_positions_(max_positions),
      k_(static_cast<size_t>(num_seqs * num_layers * max_positions * kv_dim)),
      v_(k_.size()),
      residual_dim_(residual_dim),
      residual_(static_cast<size_t>(num_seqs * num_layers * max_positions * residual_dim)) {}

size_t ContiguousKvCache::RowIndex(int32_t seq, int64_t layer, int64_t pos) const {
  KVL_CHECK(seq >= 0 && seq < num_seqs_);
  KVL_CHECK(layer >= 0 && layer < num_layers_);
  KVL_CHECK(pos >= 0 && pos < max_positions_);
  return static_cast<size_t>((seq * num_layers_ + layer) * max_positions_ + pos);
}

KvCache::Rows ContiguousKvCache::RowsAt(int32_t seq, int64_t layer, int64_t pos) {
  const size_t offset = RowIndex(seq, layer, pos) * static_cast<size_t>(kv_dim_);
  Rows rows;
  rows.k = k_.data() + offset;
  rows.v = v_.data() + offset;
  rows.count = max_positions_ - pos;
  rows.stride = kv_dim_;
  return rows;
}

float* ContiguousKvCache::ResidualAt(int32_t seq, int64_t layer, int64_t pos) {
  if (residual_dim_ == 0) return nullptr;
  return residual_.data() + RowIndex(seq, layer, pos) * static_cast<size_t>(residual_dim_);
}

void ContiguousKvCache::ClearKv(int32_t seq) {
  const size_t begin = RowIndex(seq, 0, 0) * static_cast<size_t>(kv_dim_);
  const size_t count = static_cast<size_t>(num_layers_ * max_positions_ * kv_dim_);
  std::fill(k_.begin() + static_cast<std::ptrdiff_t>(begin),
            k_.begin() + static_cast<std::ptrdiff_t>(begin + count), 0.0f);
  std::fill(v_.begin() + static_cast<std::ptrdiff_t>(begin),
            v_.begin() + static_cast<std::ptrdiff_t>(begin + count), 0.0f);
}

}  // namespace kvl
