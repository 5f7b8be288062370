// The one door to the KV layer: the pool, its storage, the tiers, the KV store, the page-fate
// table (KvPager), the planner that decides under pressure, the measured corrections of its
// prices and the --kv-trace recorder, created together from the engine's KV options and the
// machine's prices, and every decision about them that used to sit in the engine: how the budget splits
// between the pool and the pages staged outside it, how far apart residual checkpoints are, when
// `auto` gives checkpoints up for a small budget, which tiers are durable, how a Redis tier is
// priced when it cannot be measured, and which pages a prompt takes from the KV store rather than
// recomputing them.
//
// The kv layer cannot measure the machine (that is calibrate's, above it): the engine hands in a
// KvPriceSource that answers with the cost profile's prices.
//
// Thread-safety: owned by the step loop, except view().StoreStats(), which any thread may call.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvl/kv_budget.h"
#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_pager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_pressure.h"
#include "kvl/kv_price_feedback.h"
#include "kvl/kv_step.h"
#include "kvl/kv_store.h"
#include "kvl/kv_tier.h"
#include "kvl/kv_trace_recorder.h"
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
  // The one budget (kvl/kv_budget.h): the pool, its staging and rings, a RAM tier, the tiers'
  // index and draft_pool_bytes together. 0: every sequence's context, up to
  // kDefaultKvBudgetBytes, which a RAM tier, an index or a draft pool then comes out of.
  int64_t budget_bytes = 0;
  int64_t draft_pool_bytes = 0;  // the draft model's pool, carved from the budget
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
  KvQualityPrices quality_prices;  // what a loss costs (--kv-price-*)
  std::vector<TierSpec> tiers;
  int64_t sink_tokens = 4;
  int64_t recent_tokens = 64;
  bool feedback = true;  // correct bring-back prices by measured times (--kv-feedback)
  bool explain = false;
  std::string trace_path;  // --kv-trace; empty: none
  // What opens the trace's recorder (the trace library's OpenKvTraceFile); needed with a path.
  KvTraceOpener trace_opener;
  // Told of every prefix-index change and, after each step that changed it, of the whole index
  // (kvl/kv_block_observer.h: `kvl serve --kv-events`); not owned. nullptr: no one.
  KvBlockObserver* block_observer = nullptr;
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
  // A remote tier's prices for one page (`layers` tier pages of `layer_page_bytes`): its
  // bandwidths, latencies and read p99 (PageCostProfile's redis_* fields), measured now through
  // a scratch tier of `spec`'s server, over whatever link reaches it; an error where it cannot be.
  virtual Status PriceRemoteTier(const TierSpec& spec, int64_t layer_page_bytes, int64_t layers,
                                 PageCostProfile* prices) = 0;
};

// Where a waiting prompt's pages come from when it is admitted (KvMemory::PlanAdmission), in the
// order a step takes them: the pool's cached prefix, then store pages read in place where a RAM
// tier holds them, then pages promoted into fresh blocks, then the tokens it computes.
struct KvAdmission {
  int64_t cached_tokens = 0;
  int64_t in_place_blocks = 0;  // KvSeqStep::in_place_blocks
  int64_t restore_tokens = 0;   // KvSeqStep::restore_tokens
};

// Both sides of the pool's gauges.
struct KvMemoryStats {
  KvStats pool;
  KvPagerStats pages;
  // The sliding-window rings' counters (kvl/kv_window_release.h); null where the pool keeps
  // every layer in its blocks.
  const KvWindowStats* window = nullptr;
};

// The most tokens one sequence can ever hold (KvMemoryView::MaxSequenceTokens).
struct KvSequenceCapacity {
  // Nothing bounds it: a lossy quality may evict pages of a running sequence.
  bool unbounded = false;
  int64_t tokens = 0;
  // Where pages of running sequences move losslessly, what counts beside the pool's blocks: the
  // pages the staging streams from tiers at once, and those an uncompressed RAM tier holds where
  // attention reads them.
  int64_t staged_pages = 0;
  int64_t in_place_pages = 0;
};

class KvMemory;
class KvMemoryView;

// The door. Read-only questions go through view() (KvMemoryView, below); everything that changes
// the KV layer is one of these. A step is opened, run and closed as one object (kvl/kv_step.h).
class KvMemory {
 public:
  // Sizes and creates everything; `prices` is asked only where a decision needs the machine's
  // prices (tiers, auto checkpoint spacing, recompute-tokens), and may be null where none does.
  static StatusOr<std::unique_ptr<KvMemory>> Create(const KvMemoryOptions& options,
                                                    KvPriceSource* prices);
  ~KvMemory();

  // The forward pass, which rebuilds K/V from checkpoints (set before the first step).
  void set_rebuilder(KvRebuilder* rebuilder) {
    rebuilder_ = rebuilder;
    pager_->set_rebuilder(rebuilder, cache_.get());
  }
  // What the pool holds, its prices and its counters, read only.
  KvMemoryView view() const;

  // --- Planning a step (changes no page, except PlanAdmission's store pages) ---
  // A new step is planned: --kv-trace counts it, actions that failed while planning the last one
  // may be tried again, and one more step has passed since the pool was last short.
  void StartStep();
  // Admission: where a waiting prompt's pages come from. With `ask_store`, the KV store is asked
  // first for the pages past the pool's cached prefix (FindInStore: they become awaiting restore
  // in `pages`, pinned in their tier). Then the store pages at the prefix that a RAM tier holds
  // are read in place (and, for a prompt the pool cannot hold, those a disk tier holds are
  // streamed where they lie: InPlaceBlocks), and the pages awaiting restore after them (at most
  // `restore_cap` tokens) are promoted.
  KvAdmission PlanAdmission(std::span<const int32_t> tokens, KvSequencePages* pages,
                            bool ask_store, int64_t restore_cap);
  // The step's blocks (KvManager::Plan): reuses the plan's vectors; plan->fits says whether the
  // pool has them. Changes nothing.
  // Admissions planned before it are planned again before the next PlanStep, so the staging
  // they were promised is free again.
  void PlanStep(std::span<const KvSeqStep> steps, KvPlan* plan) {
    stream_pages_promised_ = 0;
    manager_->Plan(steps, plan);
  }

  // --- One step: open, forward runs, close (kvl/kv_step.h) ---
  // Carries out a step's plan before its forward pass: cached blocks the plan gives new contents
  // go to the KV store first (and to the trace as leaving), the plan is committed (refused if made
  // against an older state), shared blocks are copied for copy-on-write; then per sequence (in
  // `seqs`, one per plan.seqs): an admission binds its page table (and empties its slot's window
  // ring), attaches its store pages read in place, and every sequence restoring pages promotes
  // them into its fresh blocks (a failed read stops: the rest is computed); pages now in the pool
  // are let go from their tier; the step's reads go to --kv-trace; then each sequence gets back
  // its sliding window's rows where it does not hold them (RestoreWindow). The step lives until
  // the next Open; it must be closed before then.
  KvStep& Open(const KvPlan& plan, std::span<const KvStepRequest> seqs) {
    step_.Open(plan, seqs);
    return step_;
  }

  // --- Page fates under pressure, and between steps: planned and carried out at once ---
  // Running sequences' pages leave the pool to free `blocks_short` blocks, coldest first
  // (KvPressurePlanner::PlanRelief); where none can, the last resort: compressed pages are
  // evicted. A failed action is not planned again this step. Returns the plan carried out (each
  // action marked applied or failed), or null where nothing could leave the pool.
  const KvPagePlan* Relieve(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                            Phase phase);
  // `seq` is preempted: one action per full page of its first `num_computed` tokens (to a tier,
  // to checkpoints, or dropped), then its blocks are let go (its slot is free after). Returns
  // the plan carried out.
  const KvPagePlan& Preempt(const KvPlannedSeq& seq, int64_t num_computed, Phase phase);
  // Between steps: pages of `running` sequences held in a tier or as checkpoints come back into
  // the pool (the most reads left first), while it has blocks to spare beyond what the running
  // sequences take in their next block_tokens steps and a margin, and not in the quiet steps
  // right after the pool was short. Each page is timed against its predicted price, into *out
  // (cleared first where anything is promoted). Returns the pages planned (0: *out untouched).
  int64_t Promote(std::span<const KvPlannedSeq> running, KvApplied* out);

  // --- Sequences leaving ---
  // A parked lossy session is handed to a new request that continues it: `slot` is cut back to
  // its first `tokens` tokens and its pages are bound to the new request's page table `pages`
  // (moved from the session's).
  void HandOverSession(SeqId slot, int64_t tokens, KvSequencePages* pages);
  // A finished sequence (or a parked session giving its slot back) leaves the pool: its pages
  // are written through to the store's durable tiers, so a restart or another process finds
  // them, and its blocks and pages outside the pool are let go.
  void Release(SeqId slot);
  // A preempted request that ends while waiting (cancelled), or one giving way under pressure:
  // the pages it kept outside the pool are let go.
  void ReleaseWaiting(KvSequencePages& pages);

  // --- Prices ---
  // Starts `key`'s correction from one an earlier run measured (kvl/kv_price_feedback.h).
  void SeedCorrection(size_t key, double scale) {
    if (options_.feedback) feedback_.Seed(key, scale);
  }
  // The machine was measured again while the engine runs: the planner's and the store's prices
  // are asked of `source` anew, and the corrections start over (they were measured against the
  // old prices). The checkpoint spacing and the pool's size stay as created; a page already out
  // keeps the prediction it left with (checked against it when it comes back).
  Status Reprice(KvPriceSource* source);

  // Closes the trace: its first write error, if any.
  Status CloseTrace();

 private:
  friend class KvMemoryView;
  friend class KvStep;
  KvMemory() = default;

  // --- What the view reads ---
  const KvMemoryOptions& options() const { return options_; }
  const KvBlockLayout& layout() const { return storage_->layout(); }
  const KvPagingRules& rules() const { return planner_->rules(); }
  int64_t num_blocks() const { return manager_->num_blocks(); }
  std::vector<const KvTier*> tiers() const;
  KvMemoryStats stats() const {
    return {manager_->stats(), pager_->stats(), window_ ? &window_->stats() : nullptr};
  }
  std::string WhyTooBig(bool prompt_only, int64_t tokens) const;
  KvSequenceCapacity MaxSequenceTokens() const;
  int64_t RestorableTokens(const KvSequencePages& pages, int64_t len, int64_t from,
                           int64_t cap) const;
  bool HoldsPagesOutsidePool() const;
  const BringBackFeedback* corrections() const {
    return options_.feedback ? &feedback_ : nullptr;
  }
  std::vector<KvStoreTierStats> StoreStats() const;
  int64_t StoreTierIndex(const KvTier* tier) const;

  // --- What the open step does (KvStep) ---
  void Apply(const KvPlan& plan, std::span<const KvStepRequest> seqs, KvApplied* out);
  // Sliding-window layers (kvl/kv_window_release.h), after Apply: `slot`, about to compute from
  // position `n`, gets back the local layers' rows of the window before n where it does not hold
  // them (a cached prefix, a restore, a resume), by the cheaper exact way. From the pool's
  // checkpoints it is done here (through the rebuilder); from tokens, the returned first position
  // says which tokens the step runs ahead of its own as window-rebuild rows
  // (TokenBatch::AddWindowRebuild) for [returned, n). Returns n where nothing is to run.
  int64_t RestoreWindow(SeqId slot, int64_t n);
  // Before each forward run, per sequence in it: positions [begin, end) of `slot` become its
  // window ring's rows (the rows they replace are released). Nothing without window release.
  void ClaimWindowRows(SeqId slot, int64_t begin, int64_t end);
  // What the forward pass reads and writes K/V through.
  KvCache& forward_cache() { return *cache_; }
  // Around each forward run of the step: the sequences in the run (their pages outside the pool
  // are staged layer by layer), then those whose streamed reads failed. The span lives until the
  // next BeginForward.
  void BeginForward(std::span<const SeqId> slots);
  std::span<const SeqId> EndForward();
  // The step wrote wrong K/V for `slot` (a failed streamed read): its blocks from `first_block`
  // on are never findable by prefix or in the store.
  void DiscardWrites(SeqId slot, int64_t first_block);
  // After the forward pass: pages `slot` filled from block `first_block` on that the pool's
  // prefix index cannot reach (a page before them is in a tier) go to the KV store too, so the
  // next turn finds the whole chain.
  void FileUnreachablePages(SeqId slot, int64_t first_block);
  void TruncateTail(SeqId slot, int64_t tokens);
  // What one token at `position` costs to compute, as the cost model prices it (0: no prices).
  double TokenRecomputeMs(int64_t position) const;
  // The last forward run's rebuilds inside it, priced (until the next BeginForward); no pages
  // priced where the profile did not measure a step with rebuilt rows.
  KvInStepRebuilds InStepRebuilds() const;
  // What the profile measured a decode step to take with one row per sequence, the sequences'
  // contexts `contexts` and no rebuilt rows: the step at the deepest context, and each other row
  // at its context's per-token batch time (DecodeIdleCurve). 0 where it has no step times.
  double PlainDecodeStepMs(std::span<const int64_t> contexts) const;
  // Measured bring-back times fed back to the prices (nothing with --no-kv-feedback).
  void FeedBack(BringBackBatch& batch);
  // The store's counters copied for StoreStats (step thread, once per step); and the prefix
  // index handed to the block observer where the step changed it.
  void PublishStoreStats();

  // --- Page plans: planned, then carried out ---
  void PlanRelief(std::span<const KvPlannedSeq> running, int64_t blocks_short, Phase phase,
                  KvPagePlan* plan);
  void PlanCompressedEviction(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                              KvPagePlan* plan);
  // Carries out a page plan (refused if made against an older state) as its kind says, marks each
  // action applied or failed, and traces what left or came back; a failed action is not planned
  // again this step. A preemption also lets the sequence's blocks go (its slot is free after).
  // A promotion times each page against its predicted price, into *out (may be null otherwise).
  // Returns the actions applied.
  int64_t Apply(KvPagePlan& plan, KvApplied* out = nullptr);

  Status CreatePool(KvPriceSource* prices);
  Status CreateLattice(KvPriceSource* prices);
  void CreateStore(const PageCostProfile& prices);
  void PriceRedisTier(KvPriceSource* source, PageCostProfile* prices);
  Status OpenTrace();
  // The store's pages of `tokens` past the pool's cached prefix, marked awaiting restore where
  // promoting them is cheaper than recomputing them.
  void FindInStore(std::span<const int32_t> tokens, int64_t cached_tokens,
                   KvSequencePages* pages);
  // Store pages from `from` on in a tier attention reads in place, then (a prompt the pool
  // cannot hold) on a disk tier, streamed as they lie while the staging has room; *streamed: how
  // many of them are streamed.
  int64_t InPlaceBlocks(const KvSequencePages& pages, int64_t len, int64_t from,
                        int64_t* streamed) const;
  void CommitStep(const KvPlan& plan);
  // Pages [first_block, first_block + count) of `slot` promoted into their fresh blocks, each
  // checked against its corrected price; returns the pages restored.
  int64_t RestorePages(SeqId slot, const KvStepRequest& seq, int64_t first_block, int64_t count,
                       KvApplied* out);
  void CountBroughtBack(int64_t request, int64_t block, const KvPage& page, double measured_ms,
                        int64_t store_tier, KvApplied* out);
  void TraceReads(const KvPlan& plan, std::span<const KvStepRequest> seqs, const KvApplied& applied);
  void TraceLeaving(const KvPagePlan& plan);
  // Each action's request, from the sequences it was planned for.
  static void NameOwners(std::span<const KvPlannedSeq> seqs, KvPagePlan* plan);
  BringBackFeedback* feedback() { return options_.feedback ? &feedback_ : nullptr; }
  bool has_tier(TierKind kind) const;
  std::string TierIdentity() const;
  // Prices for pages of this pool (pool_bytes: 0 before the pool exists, the budget then).
  Status LoadPrices(KvPriceSource* source, const std::string& disk_dir, PageCostProfile* prices);
  StatusOr<int64_t> ChooseCheckpointEvery(KvPriceSource* source, const KvBlockLayout& layout);

  // KV bytes held in DRAM now: the split's reserved parts and a RAM tier's pages.
  int64_t HeldBytes() const;

  KvMemoryOptions options_;
  KvBudgetSplit budget_split_;  // decided by CreatePool (src/kv/kv_budget.cc)
  bool compresses_ = false;  // the codec's staging is reserved
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<KvPager> pager_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<KvWindowRelease> window_;  // null: the blocks keep every layer
  KvRebuilder* rebuilder_ = nullptr;          // the forward pass (set_rebuilder)
  std::unique_ptr<KvTier> ram_tier_;
  std::unique_ptr<KvTier> disk_tier_;
  std::unique_ptr<KvTier> redis_tier_;  // the KV store's, and demote-redis's
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KvPressurePlanner> planner_;
  BringBackFeedback feedback_{kNumFeedbackKeys};
  bool priced_ = false;        // CreateLattice asked the price source (needs_profile)
  std::string prices_disk_dir_;  // where the disk tier's file lives, for the price source
  std::unique_ptr<KvTraceRecorder> trace_;

  std::vector<KvContentId> content_ids_;  // FindInStore's, reused
  std::vector<KvTier*> found_in_;
  // Apply's, reused.
  std::vector<double> restore_page_ms_;  // one restore's time per page
  // Staging taken by the admissions planned since the last PlanStep (their streamed store pages
  // join the pager's held pages only when the plan is applied).
  int64_t stream_pages_promised_ = 0;
  std::vector<KvPage> promoting_;        // each promoted page as it was before it came back
  BringBackBatch restored_{kNumFeedbackKeys};
  std::vector<KvContentId> trace_contents_;
  std::vector<int64_t> trace_outside_;
  std::vector<int64_t> trace_evicted_;

  // The prefix index as last handed to options_.block_observer, and the index_changes() then.
  std::vector<uint64_t> indexed_hashes_;
  uint64_t observed_index_changes_ = 0;
  mutable std::mutex store_stats_mutex_;
  std::vector<KvStoreTierStats> store_stats_;

  // Relieve's, Preempt's and Promote's, reused.
  KvPagePlan page_plan_;
  std::vector<KvPlannedSeq> promotable_;
  // Steps planned since relief or a preemption last changed page fates (Promote waits).
  int64_t steps_since_pressure_ = 0;
  KvStep step_{*this};  // the one step, reused (Open)
};

// KvMemory read only: what the pool holds, how pages may move, its prices and counters. Any
// thread may ask StoreStats; everything else is the step loop's.
class KvMemoryView {
 public:
  explicit KvMemoryView(const KvMemory& memory) : m_(&memory) {}

  const KvMemoryOptions& options() const { return m_->options(); }
  const KvBlockLayout& layout() const { return m_->layout(); }
  const KvPagingRules& rules() const { return m_->rules(); }
  // The pool's bookkeeping (Engine::kv_manager, invariant checks in tests).
  const KvManager& manager() const { return *m_->manager_; }
  // The tiers that exist: RAM, disk, Redis, in that order.
  std::vector<const KvTier*> tiers() const { return m_->tiers(); }
  KvMemoryStats stats() const { return m_->stats(); }

  // Pages of running sequences the pager can stage outside the pool at once (streamed from a
  // tier or rebuilt from checkpoints within one step).
  int64_t staging_capacity_pages() const { return m_->pager_->staging_capacity_pages(); }
  // How the one budget splits (kvl/kv_budget.h), and the KV bytes held in DRAM now.
  const KvBudgetSplit& budget_split() const { return m_->budget_split_; }
  int64_t held_bytes() const { return m_->HeldBytes(); }
  // Pool blocks and the most tokens one sequence can hold in them.
  int64_t num_blocks() const { return m_->num_blocks(); }
  int64_t capacity_tokens() const { return num_blocks() * layout().block_tokens; }
  // Where no page of a running sequence may leave the pool, a request must fit it whole.
  bool pages_running_sequences() const { return rules().pages_running_sequences; }
  // The codec's buffers were reserved from the budget (the engine's quality or policy may
  // compress pages), so a request may ask for a lossy kv_quality. An engine started lossless
  // reserved none, and refuses such requests rather than take memory the budget did not count.
  bool accepts_lossy_requests() const { return m_->compresses_; }
  // Why a prompt (or a whole sequence) of `tokens` tokens can never fit: what the budget holds
  // and, for a sequence, why its pages could not leave the pool.
  std::string WhyTooBig(bool prompt_only, int64_t tokens) const {
    return m_->WhyTooBig(prompt_only, tokens);
  }
  // The most tokens one sequence can ever hold: a sequence must reach every page at each step,
  // in the pool or, where pages of running sequences move losslessly, streamed from a tier
  // through the staging buffers or read in place from an uncompressed RAM tier.
  KvSequenceCapacity MaxSequenceTokens() const { return m_->MaxSequenceTokens(); }

  // --- The pool's sequences ---
  int64_t MatchPrefix(std::span<const int32_t> tokens) const {
    return m_->manager_->MatchPrefix(tokens);
  }
  bool SharesPagesComputedInStep(std::span<const int32_t> tokens,
                                 std::span<const KvSeqStep> admitted) const {
    return m_->manager_->SharesPagesComputedInStep(tokens, admitted);
  }
  bool Contains(SeqId slot) const { return m_->manager_->Contains(slot); }
  bool IsLossy(SeqId slot) const { return m_->manager_->IsLossy(slot); }
  int64_t num_tokens(SeqId slot) const { return m_->manager_->num_tokens(slot); }
  int64_t BlocksFor(int64_t tokens) const { return m_->manager_->BlocksFor(tokens); }
  // Tokens from position `from` that pages awaiting restore cover (whole pages, never the one
  // holding the last of `len` tokens), at most `cap`.
  int64_t RestorableTokens(const KvSequencePages& pages, int64_t len, int64_t from,
                           int64_t cap) const {
    return m_->RestorableTokens(pages, len, from, cap);
  }

  // --- Prices and counters ---
  // The corrections measured so far, per FeedbackKey (null with --no-kv-feedback).
  const BringBackFeedback* corrections() const { return m_->corrections(); }
  // What the store did with each tier as of the last published step (any thread), and the
  // store's index of `tier` (-1: not the store's).
  std::vector<KvStoreTierStats> StoreStats() const { return m_->StoreStats(); }
  int64_t StoreTierIndex(const KvTier* tier) const { return m_->StoreTierIndex(tier); }

 private:
  const KvMemory* m_;
};

inline KvMemoryView KvMemory::view() const { return KvMemoryView(*this); }

}  // namespace kvl
