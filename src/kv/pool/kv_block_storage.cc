// KvBlockStorage (the pool's K/V floats) and PagedKvCache (the forward pass's view of them).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <new>

#include "kvl/kv_manager.h"
#include "kvl/kv_window_release.h"

namespace kvl {

namespace {
int64_t AlignedBlockBytes(const KvBlockLayout& layout) {
  return (layout.block_bytes() + 63) / 64 * 64;
}
}  // namespace

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

void KvBlockLayout::SetWindowedLayers(const std::vector<bool>& windowed) {
  KVL_CHECK(static_cast<int64_t>(windowed.size()) == num_layers);
  block_layer.assign(windowed.size(), -1);
  int32_t next = 0;
  for (size_t l = 0; l < windowed.size(); ++l) {
    if (!windowed[l]) block_layer[l] = next++;
  }
}

int64_t KvBlockLayout::block_layers() const {
  if (block_layer.empty()) return num_layers;
  return std::count_if(block_layer.begin(), block_layer.end(), [](int32_t i) { return i >= 0; });
}

KvBlockStorage::KvBlockStorage(const KvBlockLayout& layout, int64_t num_blocks)
    : layout_(layout), num_blocks_(num_blocks) {
  if (layout.block_layers() < layout.num_layers) {
    windowed_scratch_.resize(static_cast<size_t>(layout.layer_k_bytes() + layout.layer_v_bytes()));
  }
  // 64-byte aligned blocks: compressed-page slabs (kv_codec) want their layers on cache lines.
  const size_t block = static_cast<size_t>(AlignedBlockBytes(layout));
  const size_t total = block * static_cast<size_t>(num_blocks);
  auto* p = static_cast<uint8_t*>(::operator new[](total, std::align_val_t{64}));
  std::memset(p, 0, total);  // touch it now: the budget is memory we hold, not a promise
  data_.reset(p);
}

void KvBlockStorage::FreeAligned::operator()(uint8_t* p) const {
  ::operator delete[](p, std::align_val_t{64});
}

uint8_t* KvBlockStorage::bytes(BlockId block) {
  KVL_CHECK(block >= 0 && block < num_blocks_);
  return data_.get() + block * AlignedBlockBytes(layout_);
}

uint8_t* KvBlockStorage::key_bytes(BlockId block, int64_t layer) {
  if (layout_.block_layer.empty()) {
    return bytes(block) + layer * (layout_.layer_k_bytes() + layout_.layer_v_bytes());
  }
  const int32_t index = layout_.block_layer[static_cast<size_t>(layer)];
  if (index < 0) {
    // A windowed layer: its rows live in the window ring. Copies of the page (tiers, the store,
    // compressed slabs) carry this scratch layer instead, which nothing reads back for attention.
    KVL_CHECK(block >= 0 && block < num_blocks_);
    return windowed_scratch_.data();
  }
  return bytes(block) + index * (layout_.layer_k_bytes() + layout_.layer_v_bytes());
}

uint8_t* KvBlockStorage::value_bytes(BlockId block, int64_t layer) {
  return key_bytes(block, layer) + layout_.layer_k_bytes();
}

float* KvBlockStorage::keys(BlockId block, int64_t layer) {
  KVL_CHECK_MSG(layout_.k_type == DType::kF32, "keys() of a cache whose K is not f32");
  return reinterpret_cast<float*>(key_bytes(block, layer));
}

float* KvBlockStorage::values(BlockId block, int64_t layer) {
  KVL_CHECK_MSG(layout_.v_type == DType::kF32, "values() of a cache whose V is not f32");
  return reinterpret_cast<float*>(value_bytes(block, layer));
}

float* KvBlockStorage::residuals(BlockId block, int64_t layer) {
  if (layout_.residual_dim == 0) return nullptr;
  KVL_CHECK_MSG(layout_.is_checkpoint_layer(layer), "no checkpoints are kept at this layer");
  return reinterpret_cast<float*>(bytes(block) + layout_.kv_bytes()) +
         layer / layout_.checkpoint_every * layout_.block_tokens * layout_.residual_dim;
}

void KvBlockStorage::CopyBlock(BlockId src, BlockId dst) {
  std::memcpy(bytes(dst), bytes(src), static_cast<size_t>(layout_.block_bytes()));
}

PagedKvCache::PagedKvCache(const KvManager& manager, KvBlockStorage& storage,
                           KvDetachedPages* detached)
    : manager_(manager), storage_(storage), detached_(detached) {
  const KvBlockLayout& a = manager.options().layout;
  const KvBlockLayout& b = storage.layout();
  KVL_CHECK(a.block_tokens == b.block_tokens && a.num_layers == b.num_layers &&
            a.kv_dim == b.kv_dim && a.residual_dim == b.residual_dim &&
            a.checkpoint_every == b.checkpoint_every);
  KVL_CHECK(storage.num_blocks() >= manager.num_blocks());
  KVL_CHECK(a.block_layer == b.block_layer);
}

int64_t PagedKvCache::kv_dim() const { return storage_.layout().kv_dim; }
int64_t PagedKvCache::num_layers() const { return storage_.layout().num_layers; }

KvCache::Rows PagedKvCache::RowsAt(int32_t seq, int64_t layer, int64_t pos) {
  // Called per (seq, layer, run of rows) from several threads during a forward: reads only.
  const std::vector<BlockId>& table = manager_.block_table(seq);
  const KvBlockLayout& layout = storage_.layout();
  KVL_CHECK(layer >= 0 && layer < layout.num_layers);
  KVL_CHECK(pos >= 0 && pos < manager_.num_tokens(seq));
  const int64_t block_index = pos / layout.block_tokens;
  if (!layout.in_block(layer)) {
    KVL_CHECK_MSG(window_ != nullptr, "a windowed layer without its window ring");
    return window_->RowsAt(seq, layer, pos);
  }
  const BlockId block = table[static_cast<size_t>(block_index)];
  const int64_t offset = pos % layout.block_tokens;
  if (block == kNoBlock) {
    KVL_CHECK_MSG(detached_ != nullptr, "a detached KV page without a pager");
    return detached_->RowsAt(seq, block_index, layer, offset);
  }
  return DenseRows(layout, storage_.key_bytes(block, layer), storage_.value_bytes(block, layer),
                   offset);
}

KvCache::Rows DenseRows(const KvBlockLayout& layout, uint8_t* k, uint8_t* v, int64_t offset) {
  KvCache::Rows rows;
  rows.type = layout.k_type;
  rows.v_type = layout.v_type;
  rows.count = layout.block_tokens - offset;
  rows.stride = layout.kv_dim;
  const int64_t first = offset * layout.kv_dim;
  if (layout.k_type == DType::kF32) {
    rows.k = reinterpret_cast<float*>(k) + first;
  } else if (IsQuantKvType(layout.k_type)) {
    rows.k_q = k + offset * layout.k_row_bytes();
  } else {
    rows.k_half = reinterpret_cast<uint16_t*>(k) + first;
  }
  if (layout.v_type == DType::kF32) {
    rows.v = reinterpret_cast<float*>(v) + first;
  } else if (IsQuantKvType(layout.v_type)) {
    rows.v_q = v + offset * layout.v_row_bytes();
  } else {
    rows.v_half = reinterpret_cast<uint16_t*>(v) + first;
  }
  return rows;
}

StatusOr<DType> ParseKvCacheType(std::string_view text) {
  if (text == "f32") return DType::kF32;
  if (text == "f16") return DType::kF16;
  if (text == "bf16") return DType::kBF16;
  if (text == "q8_0") return DType::kQ8_0;
  if (text == "q4_0") return DType::kQ4_0;
  if (text == "q8_0r") return DType::kQ8_0R;
  if (text == "q4_0r") return DType::kQ4_0R;
  return InvalidArgumentError(fmt::format(
      "KV cache type '{}': use f32, f16, bf16, q8_0, q4_0, q8_0r or q4_0r (int8 / int4 pages of "
      "whole blocks come from --kv-policy compress / compress-int4)",
      text));
}

bool PagedKvCache::keys_rotated() const { return IsRotatedKvType(storage_.layout().k_type); }
bool PagedKvCache::values_rotated() const { return IsRotatedKvType(storage_.layout().v_type); }

KvLayerRebuild PagedKvCache::BeginLayer(int64_t layer) {
  return detached_ != nullptr ? detached_->BeginLayer(layer) : KvLayerRebuild{};
}

float* PagedKvCache::AttentionMass(int32_t seq) {
  return detached_ != nullptr ? detached_->AttentionMass(seq) : nullptr;
}

}  // namespace kvl

namespace kvl {

float* PagedKvCache::ResidualAt(int32_t seq, int64_t layer, int64_t pos) {
  const KvBlockLayout& layout = storage_.layout();
  // Only the checkpoint layers' inputs are kept (KvBlockLayout::checkpoint_every).
  if (layout.residual_dim == 0 || !layout.is_checkpoint_layer(layer)) return nullptr;
  KVL_CHECK(pos >= 0 && pos < manager_.num_tokens(seq));
  const BlockId block = manager_.block_table(seq)[static_cast<size_t>(pos / layout.block_tokens)];
  if (block == kNoBlock) return nullptr;  // the page left the pool, its checkpoints with it
  return storage_.residuals(block, layer) + (pos % layout.block_tokens) * layout.residual_dim;
}

}  // namespace kvl
