// KvStore: content-addressed pages in every tier, looked up by walking a prefix's content ids.
#include "kvl/kv_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "pool/block_hash.h"

namespace kvl {
namespace {

// The identity page: what a lookup compares, then zeros to the tier page's size.
struct IdentityHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t block_tokens;
  uint64_t id_lo;
  uint64_t id_hi;
};
constexpr uint64_t kIdentityMagic = 0x31524f5453564b4cull;  // "LKVSTOR1"
constexpr uint32_t kStoreFormatVersion = 1;
// Salts that keep a page's layer keys and its identity key apart.
constexpr uint64_t kLayerSalt = 0x6c61796572000000ull;
constexpr uint64_t kIdentitySalt = 0x6964656e74697479ull;

int64_t IdentityBytes(const KvBlockLayout& layout) {
  return static_cast<int64_t>(sizeof(IdentityHeader)) + layout.block_tokens * 4;
}

}  // namespace

KvStore::KvStore(const KvBlockLayout& layout, int64_t layer_bytes, std::vector<KvStoreTier> tiers)
    : layout_(layout), layer_bytes_(layer_bytes), tiers_(std::move(tiers)), stats_(tiers_.size()) {
  KVL_CHECK(tiers_.empty() || Fits(layout, layer_bytes));
  identity_.assign(static_cast<size_t>(layer_bytes_), 0);
}

bool KvStore::Fits(const KvBlockLayout& layout, int64_t layer_bytes) {
  return IdentityBytes(layout) <= layer_bytes;
}

PageKey KvStore::LayerKey(KvContentId id, int64_t layer) {
  return kv_internal::Mix64(id.lo ^ kv_internal::Mix64(id.hi + kLayerSalt + static_cast<uint64_t>(layer)));
}

PageKey KvStore::IdentityKey(KvContentId id) {
  return kv_internal::Mix64(id.lo ^ kv_internal::Mix64(id.hi + kIdentitySalt));
}

int64_t KvStore::TierIndex(const KvTier* tier) const {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i].tier == tier) return static_cast<int64_t>(i);
  }
  return -1;
}

void KvStore::FillIdentity(KvContentId id, std::span<const int32_t> tokens,
                           std::span<uint8_t> out) const {
  KVL_CHECK(static_cast<int64_t>(tokens.size()) == layout_.block_tokens);
  const IdentityHeader header{kIdentityMagic, kStoreFormatVersion,
                              static_cast<uint32_t>(layout_.block_tokens), id.lo, id.hi};
  std::memset(out.data(), 0, out.size());
  std::memcpy(out.data(), &header, sizeof(header));
  std::memcpy(out.data() + sizeof(header), tokens.data(), tokens.size_bytes());
}

int64_t KvStore::Lookup(std::span<const KvContentId> ids, std::span<const int32_t> tokens,
                        std::vector<KvTier*>* where) {
  const size_t n = ids.size();
  const size_t bt = static_cast<size_t>(layout_.block_tokens);
  KVL_CHECK(tokens.size() >= n * bt);
  where->assign(n, nullptr);
  if (n == 0) return 0;
  const size_t compare_bytes = static_cast<size_t>(IdentityBytes(layout_));
  size_t limit = n;  // pages past the first one no tier holds are of no use
  std::vector<size_t> asked;
  for (size_t t = 0; t < tiers_.size() && limit > 0; ++t) {
    KvTier* tier = tiers_[t].tier;
    asked.clear();
    for (size_t b = 0; b < limit; ++b) {
      if ((*where)[b] == nullptr) asked.push_back(b);
    }
    if (asked.empty()) break;
    ++stats_[t].lookups;
    std::vector<KvContentId> asked_ids;
    for (size_t b : asked) asked_ids.push_back(ids[b]);
    const std::vector<bool> held = HoldsWhole(tier, asked_ids);
    // Identity pages of the pages the tier holds whole, read in one batch and compared whole.
    std::vector<size_t> candidates;
    for (size_t i = 0; i < asked.size(); ++i) {
      if (held[i]) candidates.push_back(asked[i]);
    }
    if (candidates.empty()) continue;
    identity_read_.resize(candidates.size() * static_cast<size_t>(layer_bytes_));
    reads_.clear();
    for (size_t i = 0; i < candidates.size(); ++i) {
      reads_.push_back({IdentityKey(ids[candidates[i]]),
                        std::span<uint8_t>(identity_read_.data() + i * static_cast<size_t>(layer_bytes_),
                                           static_cast<size_t>(layer_bytes_))});
    }
    const std::vector<Status> results = tier->Get(reads_);
    for (size_t i = 0; i < candidates.size(); ++i) {
      const size_t b = candidates[i];
      if (!results[i].ok()) {
        if (results[i].code() != StatusCode::kNotFound) ++stats_[t].errors;
        continue;
      }
      FillIdentity(ids[b], tokens.subspan(b * bt, bt), identity_);
      if (std::memcmp(identity_.data(), reads_[i].out.data(), compare_bytes) != 0) {
        ++stats_[t].identity_mismatches;
        continue;
      }
      (*where)[b] = tier;
    }
    // Pages this tier lacks are asked of the slower tiers: a gap may be filled further down.
  }
  size_t found = 0;
  while (found < n && (*where)[found] != nullptr) ++found;
  where->resize(found);
  for (KvTier* tier : *where) ++stats_[static_cast<size_t>(TierIndex(tier))].hit_blocks;
  return static_cast<int64_t>(found);
}

std::vector<bool> KvStore::HoldsWhole(KvTier* tier, std::span<const KvContentId> ids) {
  const size_t per_page = static_cast<size_t>(layout_.num_layers) + 1;
  std::vector<PageKey> keys;
  keys.reserve(ids.size() * per_page);
  for (KvContentId id : ids) {
    for (int64_t l = 0; l < layout_.num_layers; ++l) keys.push_back(LayerKey(id, l));
    keys.push_back(IdentityKey(id));
  }
  const std::vector<bool> present = tier->ContainsAll(keys);
  std::vector<bool> whole(ids.size(), true);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!present[i]) whole[i / per_page] = false;
  }
  return whole;
}

const std::vector<PageKey>& KvStore::AllKeys(KvContentId id) {
  keys_.clear();
  for (int64_t l = 0; l < layout_.num_layers; ++l) keys_.push_back(LayerKey(id, l));
  keys_.push_back(IdentityKey(id));
  return keys_;
}

void KvStore::SetEvictable(KvTier* tier, KvContentId id, bool evictable) {
  tier->SetEvictable(AllKeys(id), evictable);
}

void KvStore::Pin(KvTier* tier, KvContentId id) {
  if (pins_[{TierIndex(tier), id.lo, id.hi}]++ == 0) SetEvictable(tier, id, false);
}

void KvStore::Unpin(KvTier* tier, KvContentId id) {
  auto it = pins_.find({TierIndex(tier), id.lo, id.hi});
  KVL_CHECK_MSG(it != pins_.end(), "unpinning a page nobody pinned");
  if (--it->second > 0) return;
  pins_.erase(it);
  SetEvictable(tier, id, true);
}

Status KvStore::Save(KvTier* tier, KvContentId id, std::span<const int32_t> tokens,
                     const std::function<std::span<const uint8_t>(int64_t)>& layer, bool pinned) {
  KVL_CHECK(id.valid());
  const int64_t t = TierIndex(tier);
  KVL_CHECK(t >= 0);
  if (HoldsWhole(tier, std::span(&id, 1))[0]) {
    if (pinned && pins_[{t, id.lo, id.hi}]++ == 0) SetEvictable(tier, id, false);
    return Status::Ok();
  }
  FillIdentity(id, tokens, identity_);
  writes_.clear();
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    const std::span<const uint8_t> bytes = layer(l);
    KVL_CHECK(static_cast<int64_t>(bytes.size()) == layer_bytes_);
    writes_.push_back({LayerKey(id, l), bytes, /*evictable=*/!pinned});
  }
  // The identity page last in the batch: a tier that stores a batch in order never holds an
  // identity whose layers are missing.
  writes_.push_back({IdentityKey(id), identity_, /*evictable=*/!pinned});
  const Status status = tier->Put(writes_);
  if (!status.ok()) {
    ++stats_[static_cast<size_t>(t)].errors;
    return Status(status.code(), fmt::format("the {} tier: {}", tier->name(), status.message()));
  }
  ++stats_[static_cast<size_t>(t)].blocks_saved;
  if (pinned) ++pins_[{t, id.lo, id.hi}];
  return Status::Ok();
}

Status KvStore::Load(KvTier* tier, KvContentId id,
                     const std::function<std::span<uint8_t>(int64_t)>& layer) {
  reads_.clear();
  for (int64_t l = 0; l < layout_.num_layers; ++l) reads_.push_back({LayerKey(id, l), layer(l)});
  for (const Status& status : tier->Get(reads_)) {
    if (!status.ok()) {
      // A layer evicted since the lookup is a miss; anything else is the tier failing.
      const int64_t t = TierIndex(tier);
      if (t >= 0 && status.code() != StatusCode::kNotFound) ++stats_[static_cast<size_t>(t)].errors;
      return status;
    }
  }
  return Status::Ok();
}

void KvStore::Forget(KvTier* tier, KvContentId id) { tier->Erase(AllKeys(id)); }

void KvStore::CountInPlace(KvTier* tier, int64_t blocks) {
  const int64_t t = TierIndex(tier);
  if (t >= 0) stats_[static_cast<size_t>(t)].blocks_in_place += blocks;
}

void KvStore::CountPromoted(KvTier* tier, int64_t blocks, double predicted_ms, double measured_ms) {
  const int64_t t = TierIndex(tier);
  if (t < 0) return;
  KvStoreTierStats& s = stats_[static_cast<size_t>(t)];
  s.blocks_promoted += blocks;
  s.promote_ms_predicted += predicted_ms;
  s.promote_ms_measured += measured_ms;
}

}  // namespace kvl
