// The KV store: full pages kept across requests, restarts and processes, filed in every tier under
// their content id (KvContentId: a hash chain over the model identity and every token up to the
// page's end), so that the next turn of a conversation, the same system prompt in another
// request, a restarted process or a second process on the same Redis finds them again.
//
// A stored page is one tier page per layer (K rows then V rows, as KvPager streams them) and an
// identity page: magic, format version, the content id, and the page's tokens. A lookup reads the
// identity page and compares all of it, so a 64-bit key collision, a page written by another
// version or a damaged entry reads as a miss, never as another prefix's K/V. Stored pages are
// evictable: each tier drops the coldest when it needs room (its own LRU, or Redis's maxmemory
// policy or TTL).
//
// Thread-safety: owned by the engine's step loop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <span>
#include <string>
#include <vector>

#include "kvl/kv_manager.h"
#include "kvl/kv_tier.h"
#include "kvl/status.h"

namespace kvl {

// One tier as the store uses it.
struct KvStoreTier {
  KvTier* tier = nullptr;
  // Outlives this process (a persistent disk file, Redis): finished requests' pages are written
  // through to it, so that a restart or another process finds them.
  bool durable = false;
  // The cost model's price of bringing one page back from this tier (ms), against which a hit is
  // promoted or recomputed from its tokens.
  double promote_ms = 0;
};

// What the store did with one tier.
struct KvStoreTierStats {
  int64_t lookups = 0;          // lookups that asked this tier
  int64_t hit_blocks = 0;       // pages found in it
  int64_t blocks_saved = 0;     // pages written to it
  int64_t blocks_promoted = 0;  // pages read back from it into the pool
  int64_t blocks_in_place = 0;  // pages a sequence took where the tier holds them (no copy)
  double promote_ms_predicted = 0;
  double promote_ms_measured = 0;
  int64_t errors = 0;           // saves or reads the tier refused (full, I/O, connection)
  int64_t identity_mismatches = 0;  // identity pages that did not match what was looked up
};

class KvStore {
 public:
  // `tiers` fastest first. Every tier page is `layer_bytes` (one layer's K and V rows).
  KvStore(const KvBlockLayout& layout, int64_t layer_bytes, std::vector<KvStoreTier> tiers);

  // The tier keys of a stored page.
  static PageKey LayerKey(KvContentId id, int64_t layer);
  static PageKey IdentityKey(KvContentId id);

  const std::vector<KvStoreTier>& tiers() const { return tiers_; }
  // A tier's price, measured again while the engine runs (KvMemory::Reprice).
  void set_promote_ms(size_t tier_index, double ms) { tiers_.at(tier_index).promote_ms = ms; }
  bool empty() const { return tiers_.empty(); }
  // Whether the identity page fits a tier page (at most block_tokens * 4 + 64 bytes): when it
  // does not, the store stays empty.
  static bool Fits(const KvBlockLayout& layout, int64_t layer_bytes);

  // For pages ids[0..n) (block b's tokens at tokens[b * block_tokens ...]): the fastest tier
  // holding each, in order, stopping at the first page no tier holds. Returns how many were
  // found; (*where)[b] is the tier of page b.
  int64_t Lookup(std::span<const KvContentId> ids, std::span<const int32_t> tokens,
                 std::vector<KvTier*>* where);

  // For each page, whether `tier` holds all of it: every layer and the identity, asked in one
  // batch. A tier evicts key by key, coldest first, and a lookup reads only the identity (which
  // stays hot), so under pressure a page's layers go while its identity stays: such a page is
  // not held, and finding it by its identity alone made a sequence read it in place, fail, be
  // recomputed, find it again, forever.
  std::vector<bool> HoldsWhole(KvTier* tier, std::span<const KvContentId> ids);

  // Stores a page in `tier` unless the tier holds it whole already (a partial one is rewritten). `layer(l)` gives layer l's bytes.
  // `pinned`: a running or preempted sequence keeps the page there, so the tier must not evict
  // it until Unpin (a page already stored is pinned in place); else it is cached, evictable.
  Status Save(KvTier* tier, KvContentId id, std::span<const int32_t> tokens,
              const std::function<std::span<const uint8_t>(int64_t)>& layer, bool pinned = false);
  // Pins a page Lookup found, until the sequence that will promote it lets it go (Unpin).
  void Pin(KvTier* tier, KvContentId id);
  // A sequence that pinned the page lets it go; once no sequence holds a pin it stays cached,
  // evictable.
  void Unpin(KvTier* tier, KvContentId id);
  // Reads a page's layers from `tier` into `layer(l)`; the identity was checked by Lookup.
  Status Load(KvTier* tier, KvContentId id,
              const std::function<std::span<uint8_t>(int64_t)>& layer);

  // Erases a page from `tier` (all its tier pages) after a read of it failed (its checksum, I/O,
  // or a layer no longer there), so that no lookup finds it and the next Save writes it afresh.
  void Forget(KvTier* tier, KvContentId id);

  // Counts a promotion from `tier` (the cost model's time beside the measured one).
  void CountPromoted(KvTier* tier, int64_t blocks, double predicted_ms, double measured_ms);
  void CountInPlace(KvTier* tier, int64_t blocks);
  const KvStoreTierStats& stats(size_t tier_index) const { return stats_[tier_index]; }
  int64_t TierIndex(const KvTier* tier) const;

 private:
  void FillIdentity(KvContentId id, std::span<const int32_t> tokens, std::span<uint8_t> out) const;
  void SetEvictable(KvTier* tier, KvContentId id, bool evictable);
  // Every tier key of a page: its layers, then its identity (into keys_).
  const std::vector<PageKey>& AllKeys(KvContentId id);

  KvBlockLayout layout_;
  int64_t layer_bytes_;
  std::vector<KvStoreTier> tiers_;
  std::vector<KvStoreTierStats> stats_;
  // Reused buffers: identity pages written and read, and one transfer's page lists.
  std::vector<uint8_t> identity_;
  std::vector<uint8_t> identity_read_;
  std::vector<PageWrite> writes_;
  std::vector<PageRead> reads_;
  std::vector<PageKey> keys_;
  // Pins per (tier index, content id): a page is evictable again when its last pin goes.
  std::map<std::tuple<int64_t, uint64_t, uint64_t>, int64_t> pins_;
};

}  // namespace kvl
