// The deciding half of the KV action lattice: which pages leave the pool, and how, when it is
// short of blocks. Everything the lattice may do is fixed here once (KvPagingRules: the actions
// allowed, the tier each goes to, the prices), and KvPressurePlanner turns the pool's state into
// page actions without changing anything; KvPager applies them.
//
//   running sequences short of blocks -> PlanRelief: the pages the reuse forecast
//       (kv_reuse_forecast.h) says leave first (every running page is read at its sequence's next
//       step; a page that leaves is read from its tier at each step its sequence still takes, so
//       the fewest reads left go first), then the coldest (least attention mass); never the
//       attention sinks, the recent window or the page being written; each priced by the cost
//       model (kv_policy.h) -> compress / demote / checkpoint / evict, or keep. When no resident
//       page could go, PlanCompressedEviction evicts compressed pages, the last resort.
//   the pool has blocks to spare again (between steps) -> PlanPromotion: running pages held in
//       a tier or as checkpoints come back into the pool (lossless ones only: a compressed or
//       evicted page's exact bytes are gone), those read at the most steps still to come first.
//   a sequence preempted -> PlanPreemption: each full page demoted, kept as checkpoints, or
//       dropped to be recomputed from its tokens (a paged sequence is recomputed whole: that
//       gives back exact KV whatever happened to its pages while it ran).
//
// Thread-safety: the planner reads the manager and the pager; use it on the step loop.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "kvl/kv_manager.h"
#include "kvl/kv_pager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_reuse_forecast.h"
#include "kvl/status.h"

namespace kvl {

// What the lattice is set up with: the engine's options and what this pool and these tiers can
// do. Validated once by MakeKvPagingRules.
struct KvPagingSetup {
  KvPolicyChoice policy;
  KvQuality quality = KvQuality::kLossless;
  bool has_ram_tier = false;
  bool has_disk_tier = false;
  bool has_redis_tier = false;   // a Redis server the pages may be demoted to (demote-redis)
  bool has_checkpoints = false;  // the pool's blocks keep residual checkpoints
  bool int8_fits = false;        // a compressed page's layers fit the slabs of one block
  bool int4_fits = false;
  int64_t block_tokens = 16;
  int64_t sink_tokens = 4;       // never acted on (attention sinks)
  int64_t recent_tokens = 64;    // the newest tokens stay resident at full precision
  bool explain = false;          // print every decision with its cost terms to stderr
  KvQualityPrices quality_prices;  // what a loss costs (--kv-price-*)
};

struct KvPagingRules {
  KvPolicyChoice policy;
  KvQuality quality = KvQuality::kLossless;
  // The page's prices (bytes, measured times); available_actions says what can be carried out.
  PageCostProfile prices;
  int64_t block_tokens = 16;
  int64_t sink_tokens = 4;
  int64_t recent_tokens = 64;
  bool explain = false;
  KvQualityPrices quality_prices;
  // The policy can act on running sequences' pages (compress, stream, checkpoint, evict); else
  // only preemption moves pages.
  bool pages_running_sequences = false;
};

// Checks that the fixed policy can be carried out (its tier exists, its pages fit) and fills the
// rules; `prices` are the per-page prices (bytes and measured times) without available_actions.
StatusOr<KvPagingRules> MakeKvPagingRules(const KvPagingSetup& setup,
                                          const PageCostProfile& prices);

// Residual checkpoints cost memory in every block (d_model per token per layer), so the pool
// keeps them only where recompute-from-residual can be chosen: asked for, or (auto, with a RAM
// tier to hold them) where they are no larger than the K+V they stand for (MHA; not GQA).
bool KeepsResidualCheckpoints(const KvPolicyChoice& policy, bool has_ram_tier, int64_t dim,
                              int64_t kv_dim);

// Whether `auto` would ever rebuild a page from its checkpoints: a running page that can leave
// both ways is priced (ChooseKvAction, lossless, in decode, read again) rebuilt from checkpoints
// cheaper than demoted to the RAM tier. Where demotion always wins, checkpoints the shape allows
// would only shrink the pool (a third of each block on an MHA model) for an action never taken,
// so KvMemory keeps them under `auto` only where this holds. `prices` needs kv_bytes and
// residual_bytes; its tier flags and available actions are set here. Prices that give no finite
// time for either way say nothing: then true (the shape rule stands). `feedback`: the engine's
// measured corrections (a profile's written-back ones, seeded), which weigh both ways as
// ChooseKvAction will weigh them once the pool runs; a RAM tier measured at 2.5x its profile
// can turn the choice round. Null: the profile's prices as they are.
bool ResidualRebuildBeatsDemotion(const PageCostProfile& prices,
                                  const BringBackFeedback* feedback = nullptr);

// One admitted sequence as the planner sees it.
struct KvPlannedSeq {
  SeqId slot = 0;
  int64_t request_id = 0;  // for --explain
  // The most steps it may still take, the next one included (its max_tokens, its context); each
  // reads all its pages. -1: unknown.
  int64_t steps_left = -1;
  // Its request's tolerance for loss (Request::kv_quality); unset: the rules' (the engine's).
  // Relief prices this sequence's pages with it, so a lossless request's pages are never
  // compressed or evicted whatever runs beside it.
  std::optional<KvQuality> quality;
  // The tokens it has (prompt and generated so far), some maybe not in the pool yet: promotion
  // keeps the blocks they take within the next block_tokens steps free (KvMemory::Promote).
  int64_t known_tokens = 0;
};

class KvPressurePlanner {
 public:
  KvPressurePlanner(const KvPagingRules& rules, const KvManager& manager, const KvPager& pager);

  const KvPagingRules& rules() const { return rules_; }
  // The per-page prices, measured again while the engine runs (KvMemory::Reprice).
  void set_prices(const PageCostProfile& prices) { rules_.prices = prices; }

  // Bring-back times corrected by what the engine measured (null: the profile's as they are).
  // The feedback must outlive the planner.
  void set_feedback(const BringBackFeedback* feedback) { feedback_ = feedback; }

  // An action that failed when applied (its tier is full or failing) is not planned again until
  // ClearFailedActions (the scheduler clears them when it plans a new step), so relief falls back
  // to the next cheapest action instead of retrying the same one.
  void NoteFailedActions(const KvPagePlan& plan);
  void ClearFailedActions() { failed_actions_ = 0; }

  // Page actions on running sequences expected to free `blocks_short` blocks, coldest first.
  // Replaces plan->actions (its capacity is reused). Nothing when the policy does not page
  // running sequences.
  void PlanRelief(std::span<const KvPlannedSeq> running, int64_t blocks_short, Phase phase,
                  KvPagePlan* plan);
  // The last resort: compressed pages evicted, coldest first (never a lossless sequence's: it
  // has none, and this keeps it so).
  void PlanCompressedEviction(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                              KvPagePlan* plan);
  // Between steps, with `blocks_to_spare` blocks the coming steps will not need: up to that many
  // (and `max_pages`) pages of the running sequences held in a tier or as checkpoints, to be
  // brought back into the pool (KvPager::PromoteBack), in the reverse of relief's order: the most
  // reads left first (the forecast), then the page read most (KvPager::PageReads), then the
  // earlier page. A page kept as checkpoints every s > 1 layers comes back only after every
  // earlier page of its sequence (its rebuild runs layers over them). Each action carries the
  // page's bring-back prices. Replaces plan->actions.
  void PlanPromotion(std::span<const KvPlannedSeq> running, int64_t blocks_to_spare,
                     int64_t max_pages, KvPagePlan* plan);
  // One action for each of the first `num_computed / block_tokens` pages of a sequence about to
  // be preempted.
  void PlanPreemption(const KvPlannedSeq& seq, int64_t num_computed, Phase phase,
                      KvPagePlan* plan) const;

  // What keeping one MiB resident costs while the pool is `blocks_short` blocks short and the
  // running sequences take `pages_per_step` more blocks at every step: the cheapest lossless way
  // to free that MiB otherwise (the smallest bring-back time of a page that leaves, per MiB; at
  // worst recomputing it from its tokens, as a preemption does), times the demand on the pool,
  // 1 + (blocks_short + pages_per_step) / pool blocks. Keeping bytes resident while short means
  // another page must leave for them, and the faster the budget is consumed, the sooner.
  double MemoryPriceMsPerMib(int64_t blocks_short, double pages_per_step) const;

  // The action for one page (the cost model's choice, or the fixed policy where it is allowed)
  // and its predicted bring-back time, with memory priced at `memory_price_ms_per_mib`. A running
  // page can go to a tier (streamed, or kept as checkpoints) only while the reserved staging has
  // room for one more.
  KvPageAction Decide(const KvPlannedSeq& seq, int64_t block_index, bool running, Phase phase,
                      bool staging_room, double memory_price_ms_per_mib) const;

 private:
  struct Candidate {
    KvPlannedSeq seq;
    int64_t block_index = 0;
    double mass = 0;
    KvReuseForecast forecast;
  };
  // `fates`: a bit per KvPageFate the pages may have (FateBit).
  // The sequence's request's quality, or the engine's.
  KvQuality QualityOf(const KvPlannedSeq& seq) const;
  void CollectCandidates(std::span<const KvPlannedSeq> running, uint32_t fates, bool movable_only);
  void SortLeavingFirst();
  bool EarlierPagesInPool(const Candidate& c, const KvPagePlan& plan) const;
  // An empty plan against the pool's current state.
  void StartPlan(int64_t blocks_to_free, KvPagePlan* plan) const;

  KvPagingRules rules_;
  const KvManager& manager_;
  const KvPager& pager_;
  std::vector<Candidate> candidates_;  // reused across plans
  uint32_t failed_actions_ = 0;        // bit i: KvAction i failed in this step
  const BringBackFeedback* feedback_ = nullptr;
};

}  // namespace kvl
