// KvBlockStorage (the pool's K/V floats) and PagedKvCache (the forward pass's view of them).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <new>

#include "kvl/kv_manager.h"

namespace kvl {

StatusOr<std::unique_ptr<KvBlockStorage>> KvBlockStorage::Create(const KvBlockLayout& layout,
                                                                 int64_t num_blocks) {
  if (layout.block_tokens <= 0 || layout.num_layers <= 0 || layout.kv_dim <= 0 || num_blocks <= 0) {
    return InvalidArgumentError(fmt::format(
        "KV storage needs positive sizes: {} blocks of {} tokens x {} layers x {} floats",
        num_blocks, layout.block_tokens, layout.num_layers, layout.kv_dim));
  }
  const double bytes = static_cast<double>(num_blocks) * static_cast<double>(layout.block_bytes());
  if (num_blocks > INT64_MAX / layout.block_bytes()) {
    return ResourceExhaustedError(
        fmt::format("{} KV blocks of {} bytes ({:.0f} GiB) overflow 64 bits", num_blocks,
                    layout.block_bytes(), bytes / (1ull << 30)));
  }
  try {
    return std::unique_ptr<KvBlockStorage>(new KvBlockStorage(layout, num_blocks));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(fmt::format("cannot allocate {:.2f} GiB for {} KV blocks",
                                              bytes / (1ull << 30), num_blocks));
  } catch (const std::length_error&) {
    return ResourceExhaustedError(fmt::format("cannot allocate {:.2f} GiB for {} KV blocks",
                                              bytes / (1ull << 30), num_blocks));
  }
}

KvBlockStorage::KvBlockStorage(const KvBlockLayout& layout, int64_t num_blocks)
    : layout_(layout),
      num_blocks_(num_blocks),
      k_(static_cast<size_t>(num_blocks * layout.floats_per_tensor())),
      v_(k_.size()),
      residual_(static_cast<size_t>(num_blocks * layout.residual_floats())) {}

float* KvBlockStorage::residuals(BlockId block, int64_t layer) {
  if (layout_.residual_dim == 0) return nullptr;
  return residual_.data() +
         (block * layout_.num_layers + layer) * layout_.block_tokens * layout_.residual_dim;
}

float* KvBlockStorage::keys(BlockId block, int64_t layer) {
  return k_.data() + (block * layout_.num_layers + layer) * layout_.block_tokens * layout_.kv_dim;
}

float* KvBlockStorage::values(BlockId block, int64_t layer) {
  return v_.data() + (block * layout_.num_layers + layer) * layout_.block_tokens * layout_.kv_dim;
}

void KvBlockStorage::CopyBlock(BlockId src, BlockId dst) {
  KVL_CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_);
  // A block's layers are contiguous ([block][layer][token][kv_dim]), so one copy per tensor.
  const int64_t n = layout_.floats_per_tensor();
  std::copy_n(k_.data() + src * n, n, k_.data() + dst * n);
  std::copy_n(v_.data() + src * n, n, v_.data() + dst * n);
  const int64_t r = layout_.residual_floats();
  std::copy_n(residual_.data() + src * r, r, residual_.data() + dst * r);
}

PagedKvCache::PagedKvCache(const KvManager& manager, KvBlockStorage& storage)
    : manager_(manager), storage_(storage) {
  const KvBlockLayout& a = manager.options().layout;
  const KvBlockLayout& b = storage.layout();
  KVL_CHECK(a.block_tokens == b.block_tokens && a.num_layers == b.num_layers &&
            a.kv_dim == b.kv_dim && a.residual_dim == b.residual_dim);
  KVL_CHECK(storage.num_blocks() >= manager.num_blocks());
}

int64_t PagedKvCache::kv_dim() const { return storage_.layout().kv_dim; }
int64_t PagedKvCache::num_layers() const { return storage_.layout().num_layers; }

KvCache::Rows PagedKvCache::RowsAt(int32_t seq, int64_t layer, int64_t pos) {
  // Called per (seq, layer, run of rows) from several threads during a forward: reads only.
  const std::vector<BlockId>& table = manager_.block_table(seq);
  const KvBlockLayout& layout = storage_.layout();
  KVL_CHECK(layer >= 0 && layer < layout.num_layers);
  KVL_CHECK(pos >= 0 && pos < manager_.num_tokens(seq));
  const BlockId block = table[static_cast<size_t>(pos / layout.block_tokens)];
  const int64_t offset = pos % layout.block_tokens;
  return Rows{storage_.keys(block, layer) + offset * layout.kv_dim,
              storage_.values(block, layer) + offset * layout.kv_dim, layout.block_tokens - offset,
              layout.kv_dim};
}

}  // namespace kvl

namespace kvl {

float* PagedKvCache::ResidualAt(int32_t seq, int64_t layer, int64_t pos) {
  const KvBlockLayout& layout = storage_.layout();
  if (layout.residual_dim == 0) return nullptr;
  KVL_CHECK(pos >= 0 && pos < manager_.num_tokens(seq));
  const BlockId block = manager_.block_table(seq)[static_cast<size_t>(pos / layout.block_tokens)];
  return storage_.residuals(block, layer) + (pos % layout.block_tokens) * layout.residual_dim;
}

}  // namespace kvl
