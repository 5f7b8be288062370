// The one door to the KV layer: the pool, its storage, the tiers, the KV store, the page-fate
// table (KvPager), the planner that decides under pressure, the measured corrections of its
// prices and the --kv-trace file, created together from the engine's KV options and the machine's
// prices, and every decision about them that used to sit in the engine: how the budget splits
// between the pool and the pages staged outside it, how far apart residual checkpoints are, when
// `auto` gives checkpoints up for a small budget, which tiers are durable, how a Redis tier is
// priced when it cannot be measured, and which pages a prompt takes from the KV store rather than
// recomputing them.
//
// The kv layer cannot measure the machine (that is calibrate's, above it): the engine hands in a
// KvPriceSource that answers with the cost profile's prices.
//
// Thread-safety: owned by the step loop, except StoreStats, which any thread may call.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_pager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_pressure.h"
#include "kvl/kv_price_feedback.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"
#include "kvl/kv_trace.h"
#include "kvl/kv_window_release.h"
#include "kvl/status.h"

namespace kvl {

// --kv-stream-reserve auto: this share of the budget stages pages where a RAM tier holds pages
// attention reads in place; without one, enough for one full-context sequence, up to the max.
inline constexpr double kDefaultStreamReserve = 0.25;
inline constexpr double kMaxAutoStreamReserve = 0.5;

// What the pool holds and how pages may move, in the engine's terms (EngineOptions).
struct KvMemoryOptions {
  // The model's shape and the pool's element types.
  int32_t block_tokens = 16;
  int64_t num_layers = 0;
  int64_t kv_dim = 0;
  int64_t dim = 0;  // the residual width (checkpoints)
  DType k_type = DType::kF32;
  DType v_type = DType::kF32;
  uint64_t model_identity = 0;  // seeds content ids and names persistent tier pages

  int64_t context_length = 0;
  int32_t max_seqs = 16;
  // Tables reserved at admission (a longer sequence grows them by doubling).
  int64_t max_seq_tokens = 0;
  int64_t budget_bytes = 0;     // 0: every sequence's context, up to kDefaultKvBudgetBytes
  // > 0: the pool has exactly this many blocks and `staged_pages` pages are staged beside it,
  // instead of both being cut from budget_bytes (a pool sized by hand: tests, replays).
  int64_t pool_blocks = 0;
  int64_t staged_pages = 0;
  double stream_reserve = 0;    // share of the budget staging pages outside the pool; 0: auto
  int64_t checkpoint_every = 1;  // 0: auto (the cost model's cheapest)
  bool prefix_cache = true;      // the KV store needs it (pages are filed by prefix)
  // Sliding-window layers (kvl/kv_window_release.h): where the model has a window and local
  // layers and `window_release` is on, the blocks hold the global layers' K/V only and each slot
  // keeps its local layers' last window in a ring (released as it turns: lossless). Off where
  // partial-depth checkpoints are kept (rebuilding the layers between two checkpoints runs the
  // local layers over their old windows).
  KvWindowShape window;
  bool window_release = true;

  KvPolicyChoice policy;
  KvQuality quality = KvQuality::kLossless;
  std::vector<TierSpec> tiers;
  int64_t sink_tokens = 4;
  int64_t recent_tokens = 64;
  bool feedback = true;  // correct bring-back prices by measured times (--kv-feedback)
  bool explain = false;
  std::string trace_path;  // --kv-trace; empty: none
};

// The default KV budget when none is given: every sequence's context, up to this.
inline constexpr int64_t kDefaultKvBudgetBytes = 1ll << 30;

// The machine's prices, as the calibrate layer knows them.
class KvPriceSource {
 public:
  // What a page costs depends on where it goes and on the pool beside it.
  struct Query {
    int64_t block_tokens = 16;
    bool disk_direct = false;     // the disk tier bypasses the page cache
    bool ram_compressed = false;  // the RAM tier keeps pages zstd-compressed
    // The pool's bytes (its working set beside the weights); before the pool exists, the budget.
    int64_t pool_bytes = 0;
    // Where a disk tier's file lives (measured there); empty: the temp dir.
    std::string disk_dir;
  };

  virtual ~KvPriceSource() = default;
  // The per-page prices of this model on this machine (time fields; bytes are KvMemory's).
  virtual Status PagePrices(const Query& query, PageCostProfile* prices) = 0;
  // One page (`layers` tier pages of `layer_page_bytes`) read from a remote tier, measured now
  // through a scratch tier of `spec`'s server; an error where it cannot be.
  virtual StatusOr<double> MeasureRemoteReadMs(const TierSpec& spec, int64_t layer_page_bytes,
                                               int64_t layers) = 0;
};

class KvMemory {
 public:
  // Sizes and creates everything; `prices` is asked only where a decision needs the machine's
  // prices (tiers, auto checkpoint spacing, recompute-tokens), and may be null where none does.
  static StatusOr<std::unique_ptr<KvMemory>> Create(const KvMemoryOptions& options,
                                                    KvPriceSource* prices);
  ~KvMemory();

  // The forward pass, which rebuilds K/V from checkpoints (set before the first step).
  void set_rebuilder(KvRebuilder* rebuilder) { pager_->set_rebuilder(rebuilder, cache_.get()); }

  const KvMemoryOptions& options() const { return options_; }
  const KvBlockLayout& layout() const { return storage_->layout(); }

  // The parts, for the step loop.
  KvManager& manager() { return *manager_; }
  const KvManager& manager() const { return *manager_; }
  KvBlockStorage& storage() { return *storage_; }
  KvPager& pager() { return *pager_; }
  const KvPager& pager() const { return *pager_; }
  PagedKvCache& cache() { return *cache_; }
  KvPressurePlanner& planner() { return *planner_; }
  const KvPagingRules& rules() const { return planner_->rules(); }
  KvStore* store() { return store_.get(); }
  // The local layers' rings; null where the pool keeps every layer in its blocks.
  KvWindowRelease* window() { return window_.get(); }
  const KvWindowRelease* window() const { return window_.get(); }
  KvTraceWriter* trace() { return trace_.get(); }
  // The measured corrections; null with --no-kv-feedback.
  BringBackFeedback* feedback() { return options_.feedback ? &feedback_ : nullptr; }
  // The tiers that exist: RAM, disk, Redis, in that order.
  std::vector<const KvTier*> tiers() const;

  // Pool blocks and the most tokens one sequence can hold in them.
  int64_t num_blocks() const { return manager_->num_blocks(); }
  int64_t capacity_tokens() const { return num_blocks() * layout().block_tokens; }
  // Where no page of a running sequence may leave the pool, a request must fit it whole.
  bool pages_running_sequences() const { return rules().pages_running_sequences; }
  // The codec's buffers were reserved from the budget (the engine's quality or policy may
  // compress pages), so a request may ask for a lossy kv_quality. An engine started lossless
  // reserved none, and refuses such requests rather than take memory the budget did not count.
  bool accepts_lossy_requests() const { return compresses_; }

  // Admission: marks the pages of a waiting prompt (`tokens`, its page table `pages`) that the KV
  // store holds past the pool's cached prefix (`cached_tokens`) as awaiting restore, as far as
  // promoting them is cheaper than recomputing them from their tokens: each hit priced by the
  // cost model for its tier, corrected by what bring-backs measured, against the corrected price
  // of recomputing the page at its depth. Pages are pinned in their tier until promoted.
  void FindInStore(std::span<const int32_t> tokens, int64_t cached_tokens,
                   KvSequencePages* pages);
  // Applies a step's block plan before its forward pass: cached blocks the plan gives new
  // contents go to the KV store first (and to the trace as leaving), the plan is committed
  // (refused if made against an older state), and shared blocks are copied for copy-on-write.
  void CommitStep(const KvPlan& plan);

  // A finished sequence (or a parked session giving its slot back) leaves the pool: its pages
  // are written through to the store's durable tiers, so a restart or another process finds
  // them, and its blocks and pages outside the pool are let go.
  void Release(SeqId slot);

  // The store's counters copied for StoreStats (step thread, once per step).
  void PublishStoreStats();
  // What the store did with each tier as of the last PublishStoreStats (any thread), and the
  // store's index of `tier` (-1: not the store's).
  std::vector<KvStoreTierStats> StoreStats() const;
  int64_t StoreTierIndex(const KvTier* tier) const;

  // Closes the trace: its first write error, if any.
  Status CloseTrace();

 private:
  KvMemory() = default;
  Status CreatePool(KvPriceSource* prices);
  Status CreateLattice(KvPriceSource* prices);
  void CreateStore(const PageCostProfile& prices, KvPriceSource* source);
  Status OpenTrace();
  bool has_tier(TierKind kind) const;
  std::string TierIdentity() const;
  // Prices for pages of this pool (pool_bytes: 0 before the pool exists, the budget then).
  Status LoadPrices(KvPriceSource* source, const std::string& disk_dir, PageCostProfile* prices);
  StatusOr<int64_t> ChooseCheckpointEvery(KvPriceSource* source, const KvBlockLayout& layout);

  KvMemoryOptions options_;
  bool compresses_ = false;  // the codec's staging is reserved
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<KvPager> pager_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<KvWindowRelease> window_;
  std::unique_ptr<KvTier> ram_tier_;
  std::unique_ptr<KvTier> disk_tier_;
  std::unique_ptr<KvTier> redis_tier_;  // the KV store's only: running pages never go there
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KvPressurePlanner> planner_;
  BringBackFeedback feedback_{kNumFeedbackKeys};
  std::unique_ptr<KvTraceWriter> trace_;

  std::vector<KvContentId> content_ids_;  // FindInStore's, reused
  std::vector<KvTier*> found_in_;

  mutable std::mutex store_stats_mutex_;
  std::vector<KvStoreTierStats> store_stats_;
};

}  // namespace kvl
