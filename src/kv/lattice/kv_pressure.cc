#include "kvl/kv_pressure.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>

namespace kvl {
namespace {

// The recent window never takes more than this fraction of the pool, so a small pool still has
// pages to act on.
constexpr int64_t kMaxRecentFractionOfPool = 4;  // 1/4

constexpr uint32_t Bit(KvAction action) { return 1u << static_cast<int>(action); }
constexpr uint32_t FateBit(KvPageFate fate) { return 1u << static_cast<int>(fate); }

// The memory price where no way of freeing a page has a measured time (no profile was loaded: an
// engine with no tier prices nothing). A named default, not a measurement: a page asked to leave
// has to, so keeping bytes resident is priced high.
constexpr double kUnpricedMemoryMsPerMib = 1e3;

}  // namespace

bool KeepsResidualCheckpoints(const KvPolicyChoice& policy, bool has_ram_tier, int64_t dim,
                              int64_t kv_dim) {
  if (!policy.automatic) return policy.fixed == KvAction::kRecomputeResidual;
  return has_ram_tier && dim <= 2 * kv_dim;
}

bool ResidualRebuildBeatsDemotion(const PageCostProfile& prices,
                                  const BringBackFeedback* feedback) {
  PageCostProfile p = prices;
  p.has_ram_tier = true;
  p.available_actions = Bit(KvAction::kDemoteRam) | Bit(KvAction::kRecomputeResidual);
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.phase = Phase::kDecode;
  o.feedback = feedback;
  const KvDecision d = ChooseKvAction(PageHistory{}, p, o);
  const double rebuild_ms = d.costs[static_cast<size_t>(KvAction::kRecomputeResidual)].total_ms;
  const double demote_ms = d.costs[static_cast<size_t>(KvAction::kDemoteRam)].total_ms;
  if (!std::isfinite(rebuild_ms) && !std::isfinite(demote_ms)) return true;
  return rebuild_ms < demote_ms;
}

StatusOr<KvPagingRules> MakeKvPagingRules(const KvPagingSetup& setup,
                                          const PageCostProfile& prices) {
  KvPagingRules r;
  r.policy = setup.policy;
  r.quality = setup.quality;
  r.block_tokens = setup.block_tokens;
  r.sink_tokens = std::max<int64_t>(0, setup.sink_tokens);
  r.recent_tokens = std::max<int64_t>(0, setup.recent_tokens);
  r.explain = setup.explain;
  KVL_RETURN_IF_ERROR(setup.quality_prices.Validate());
  r.quality_prices = setup.quality_prices;
  const KvPolicyChoice& policy = setup.policy;
  if (!policy.automatic && !IsLossless(policy.fixed) && r.quality == KvQuality::kLossless) {
    // A fixed lossy policy says what it wants; the quality preset only steers `auto`. (An
    // explicit --kv-quality lossless beside a lossy policy is refused before this, by
    // ValidateEngineOptions; here lossless is only the default.)
    r.quality = KvQuality::kAggressive;
  }
  if (!policy.automatic) {
    if (policy.fixed == KvAction::kDemoteRam && !setup.has_ram_tier) {
      return InvalidArgumentError("--kv-policy demote needs a RAM tier: --kv-tier ram:SIZE");
    }
    if (policy.fixed == KvAction::kDemoteDisk && !setup.has_disk_tier) {
      return InvalidArgumentError("--kv-policy demote-disk needs --kv-tier disk:PATH:SIZE");
    }
    if (policy.fixed == KvAction::kDemoteRedis && !setup.has_redis_tier) {
      return InvalidArgumentError(
          "--kv-policy demote-redis needs --kv-tier redis://HOST[:PORT] (scripts/redis-netns.sh "
          "makes one behind a shaped link)");
    }
    if (policy.fixed == KvAction::kRecomputeResidual && !setup.has_ram_tier) {
      return InvalidArgumentError(
          "--kv-policy recompute-residual keeps the checkpoints in a RAM tier: --kv-tier ram:SIZE");
    }
    if ((policy.fixed == KvAction::kCompressInt8 && !setup.int8_fits) ||
        (policy.fixed == KvAction::kCompressInt4 && !setup.int4_fits)) {
      return InvalidArgumentError(fmt::format(
          "--kv-policy {}: a compressed page of this model does not fit the slabs of one block",
          KvActionName(policy.fixed)));
    }
  }
  r.prices = prices;
  r.prices.has_ram_tier = setup.has_ram_tier;
  r.prices.has_disk_tier = setup.has_disk_tier;
  r.prices.has_redis_tier = setup.has_redis_tier;
  const bool checkpoints = setup.has_checkpoints && setup.has_ram_tier;
  r.prices.available_actions =
      Bit(KvAction::kKeep) | Bit(KvAction::kEvict) | Bit(KvAction::kRecomputeTokens) |
      (setup.int8_fits ? Bit(KvAction::kCompressInt8) : 0u) |
      (setup.int4_fits ? Bit(KvAction::kCompressInt4) : 0u) |
      (setup.has_ram_tier ? Bit(KvAction::kDemoteRam) : 0u) |
      (setup.has_disk_tier ? Bit(KvAction::kDemoteDisk) : 0u) |
      (setup.has_redis_tier ? Bit(KvAction::kDemoteRedis) : 0u) |
      (checkpoints ? Bit(KvAction::kRecomputeResidual) : 0u);
  // Running sequences' pages can be acted on unless the policy is only about preemption (keep,
  // recompute from tokens) or nothing is allowed (auto, lossless, with no tier to demote to).
  if (policy.automatic) {
    r.pages_running_sequences = setup.has_ram_tier || setup.has_disk_tier ||
                                setup.has_redis_tier || r.quality != KvQuality::kLossless;
  } else {
    r.pages_running_sequences =
        policy.fixed != KvAction::kKeep && policy.fixed != KvAction::kRecomputeTokens;
  }
  return r;
}

KvPressurePlanner::KvPressurePlanner(const KvPagingRules& rules, const KvManager& manager,
                                     const KvPager& pager)
    : rules_(rules), manager_(manager), pager_(pager) {}

double KvPressurePlanner::MemoryPriceMsPerMib(int64_t blocks_short, double pages_per_step) const {
  // The bring-back times of a page, every way one can leave losslessly here.
  KvPolicyOptions o;
  o.quality = KvQuality::kLossless;
  o.phase = Phase::kPrefill;
  o.feedback = feedback_;
  const KvDecision d = ChooseKvAction(PageHistory{}, rules_.prices, o);
  // A time of 0 is an unmeasured one (no profile), not a free way out.
  double departure_ms = std::numeric_limits<double>::infinity();
  for (KvAction a : {KvAction::kDemoteRam, KvAction::kDemoteDisk, KvAction::kDemoteRedis,
                     KvAction::kRecomputeResidual, KvAction::kRecomputeTokens}) {
    const KvActionCost& c = d.costs[static_cast<size_t>(a)];
    if (c.allowed && c.bring_back_ms > 0) departure_ms = std::min(departure_ms, c.bring_back_ms);
  }
  if (!std::isfinite(departure_ms)) return kUnpricedMemoryMsPerMib;
  const double page_mib = static_cast<double>(std::max<int64_t>(1, rules_.prices.kv_bytes)) /
                          (1024.0 * 1024.0);
  const double demand = 1.0 + (static_cast<double>(std::max<int64_t>(0, blocks_short)) +
                               std::max(0.0, pages_per_step)) /
                                  static_cast<double>(std::max<int64_t>(1, manager_.num_blocks()));
  return departure_ms / page_mib * demand;
}

KvPageAction KvPressurePlanner::Decide(const KvPlannedSeq& seq, int64_t block_index,
                                       bool running, Phase phase, bool staging_room,
                                       double memory_price_ms_per_mib) const {
  KvPolicyOptions o;
  o.quality = QualityOf(seq);
  o.quality_prices = rules_.quality_prices;
  o.phase = phase;
  o.memory_price_ms_per_mib = memory_price_ms_per_mib;
  o.feedback = feedback_;
  // The step that reads the page again attends over the whole sequence: decode's idle share of
  // it is evaluated there.
  o.step_context = manager_.num_tokens(seq.slot);
  PageHistory page;
  page.first_position = block_index * rules_.block_tokens;
  page.is_sink = page.first_position < rules_.sink_tokens;
  PageCostProfile costs = rules_.prices;
  // The page is asked to leave: keeping it is no answer (a cost model that prices keep below a
  // slow tier would otherwise leave the pool full with the tier free), nor is an action that
  // already failed in this step.
  costs.available_actions &= ~(Bit(KvAction::kKeep) | failed_actions_);
  // When the page is read next and how often: the reuse forecast, from the schedule. Its
  // probability of another read prices every bring-back (kv_policy.h).
  KvReuseInput reuse;
  reuse.reads_left = seq.steps_left;
  if (running) {
    // A running sequence attends over every page at each step it still takes (the next one
    // included); how much weight it gives this page (the attention mass it received) prices
    // what losing the page costs.
    reuse.running_reader = true;
    reuse.steps_to_read = 0;
    page.attention_mass = pager_.PageMass(seq.slot, block_index);
    // A running page is rebuilt from its checkpoints at every step that reads it; from tokens it
    // cannot be (that would rerun the whole prefix each step).
    costs.available_actions &= ~Bit(KvAction::kRecomputeTokens);
    // Every step stages a streamed or checkpointed page: only as many as the staging holds. A
    // RAM tier that attention reads in place needs no staging for demoted pages.
    if (!staging_room) {
      uint32_t staged = Bit(KvAction::kDemoteDisk) | Bit(KvAction::kDemoteRedis) |
                        Bit(KvAction::kRecomputeResidual);
      const KvTier* ram = pager_.TierFor(KvAction::kDemoteRam);
      if (ram == nullptr || !ram->reads_in_place()) staged |= Bit(KvAction::kDemoteRam);
      costs.available_actions &= ~staged;
    }
  } else {
    // The sequence resumes as soon as blocks free up: every one of its pages will be read again
    // (at the resume), however cold it was.
    reuse.waiting_reader = true;
    reuse.steps_to_resume = 1;
    costs.available_actions &=
        ~(Bit(KvAction::kCompressInt8) | Bit(KvAction::kCompressInt4) | Bit(KvAction::kEvict));
  }
  // Only the running pages' and waiting pages' forecast is asked here: no idle history.
  static const KvIdleReuseHistory kNoIdlePages;
  page.reuse = ForecastReuse(reuse, kNoIdlePages);
  if (pager_.CheckpointMissing(seq.slot, block_index)) {
    costs.available_actions &= ~Bit(KvAction::kRecomputeResidual);
  }
  const KvDecision d = ChooseKvAction(page, costs, o);
  KvAction action = rules_.policy.fixed;
  if (rules_.policy.automatic || !d.costs[static_cast<size_t>(action)].allowed) action = d.action;
  if (rules_.explain) {
    fmt::print(stderr, "kvl: explain: request {} {} page {} (tokens {}-{}) -> {}\n{}",
               seq.request_id, running ? "running" : "preempted", block_index,
               page.first_position, page.first_position + rules_.block_tokens - 1,
               KvActionName(action), d.Explain());
  }
  KvPageAction a;
  a.seq = seq.slot;
  a.block_index = block_index;
  a.action = action;
  a.predicted_ms = d.costs[static_cast<size_t>(action)].bring_back_ms;
  a.model_ms = d.costs[static_cast<size_t>(action)].model_bring_back_ms;
  return a;
}

// Full pages of the running sequences, other than the last block, whose fate is one of `fates`
// (resident pages only where this sequence alone holds the block: a page that requests share
// through the prefix cache never leaves the pool while more than one holds it, so where their
// kv_quality differs the strictest holder wins); where `movable_only`, only
// those outside the attention sinks and the recent window (the pages that may leave the pool).
void KvPressurePlanner::CollectCandidates(std::span<const KvPlannedSeq> running, uint32_t fates,
                                          bool movable_only) {
  // Relief acts on running pages only; their forecast never asks the idle pages' history.
  static const KvIdleReuseHistory kNoIdlePages;
  candidates_.clear();
  const int64_t bt = rules_.block_tokens;
  const int64_t recent_blocks = std::min((rules_.recent_tokens + bt - 1) / bt,
                                         manager_.num_blocks() / kMaxRecentFractionOfPool);
  const int64_t sink_blocks = movable_only ? (rules_.sink_tokens + bt - 1) / bt : 0;
  for (const KvPlannedSeq& seq : running) {
    if (!manager_.Contains(seq.slot)) continue;
    const std::vector<BlockId>& table = manager_.block_table(seq.slot);
    const int64_t full_blocks = manager_.num_tokens(seq.slot) / bt;
    // The last block (written next) and the recent window stay.
    const int64_t end = std::min<int64_t>(full_blocks, static_cast<int64_t>(table.size()) - 1) -
                        (movable_only ? recent_blocks : 0);
    for (int64_t b = sink_blocks; b < end; ++b) {
      const BlockId block = table[static_cast<size_t>(b)];
      const bool match =
          block != kNoBlock
              ? (fates & FateBit(KvPageFate::kResident)) != 0 && manager_.refcount(block) == 1
              : (fates & FateBit(pager_.FateOf(seq.slot, b))) != 0;
      if (!match) continue;
      // Read at the step about to run and at each one after it that its sequence takes. Where in
      // the step is no matter here: a page that leaves is read from its tier at each of them.
      KvReuseInput in;
      in.running_reader = true;
      in.steps_to_read = 0;
      in.reads_left = seq.steps_left;
      candidates_.push_back(
          {seq, b, pager_.PageMass(seq.slot, b), ForecastReuse(in, kNoIdlePages)});
    }
  }
}

// In the order the reuse forecast says they leave, then coldest first (least attention mass;
// then oldest).
void KvPressurePlanner::SortLeavingFirst() {
  std::stable_sort(candidates_.begin(), candidates_.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (KvPageLeavesFirst(a.forecast, b.forecast)) return true;
                     if (KvPageLeavesFirst(b.forecast, a.forecast)) return false;
                     return a.mass < b.mass;
                   });
}

KvQuality KvPressurePlanner::QualityOf(const KvPlannedSeq& seq) const {
  return seq.quality.value_or(rules_.quality);
}

void KvPressurePlanner::NoteFailedActions(const KvPagePlan& plan) {
  for (const KvPageAction& a : plan.actions) {
    if (a.failed) failed_actions_ |= Bit(a.action);
  }
}

void KvPressurePlanner::StartPlan(int64_t blocks_to_free, KvPagePlan* plan) const {
  plan->actions.clear();
  plan->blocks_to_free = blocks_to_free;
  plan->state_version = manager_.state_version();
}

void KvPressurePlanner::PlanRelief(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                                   Phase phase, KvPagePlan* plan) {
  StartPlan(blocks_short, plan);
  if (!rules_.pages_running_sequences) return;
  CollectCandidates(running, FateBit(KvPageFate::kResident), /*movable_only=*/true);
  SortLeavingFirst();
  // Each page that leaves frees its block (a compressed one may take a slab block first; the
  // scheduler plans again if the pool is still short).
  int64_t leaving = 0;
  int64_t staging_left = pager_.staging_capacity_pages() - pager_.staged_pages_held();
  // Decoding sequences take a block every block_tokens steps each; a prefill's need is the
  // shortfall itself.
  const double pages_per_step =
      phase == Phase::kDecode
          ? static_cast<double>(running.size()) / static_cast<double>(rules_.block_tokens)
          : 0.0;
  const double memory_price = MemoryPriceMsPerMib(blocks_short, pages_per_step);
  for (const Candidate& c : candidates_) {
    if (leaving >= blocks_short) break;
    const KvPageAction a = Decide(c.seq, c.block_index, /*running=*/true, phase,
                                  /*staging_room=*/staging_left > 0, memory_price);
    if (a.action == KvAction::kKeep) continue;
    const KvTier* tier = pager_.TierFor(a.action);
    // Checkpoints go to the RAM tier too, but are staged to be rebuilt from.
    const bool in_place = a.action == KvAction::kDemoteRam && tier->reads_in_place();
    if (tier != nullptr && !in_place) --staging_left;
    plan->actions.push_back(a);
    ++leaving;
  }
}

void KvPressurePlanner::PlanCompressedEviction(std::span<const KvPlannedSeq> running,
                                               int64_t blocks_short, KvPagePlan* plan) {
  StartPlan(blocks_short, plan);
  if (!rules_.pages_running_sequences) return;
  CollectCandidates(running, FateBit(KvPageFate::kCompressed), /*movable_only=*/true);
  // A lossless sequence never had a page compressed (Decide); should one ever hold a compressed
  // page, losing it for good is still not this sequence's to accept.
  std::erase_if(candidates_,
                [this](const Candidate& c) { return QualityOf(c.seq) == KvQuality::kLossless; });
  SortLeavingFirst();
  // A compressed page takes a fraction of a block, so freeing blocks_short blocks takes more
  // pages than that: all of them are planned, coldest first, and applying stops when enough
  // blocks are free.
  for (const Candidate& c : candidates_) {
    KvPageAction a;
    a.seq = c.seq.slot;
    a.block_index = c.block_index;
    a.action = KvAction::kEvict;
    plan->actions.push_back(a);
  }
}

// With checkpoints every s > 1 layers a page is rebuilt by running the layers between them over
// the earlier pages of its sequence, which must then be in the pool: already, or brought back
// earlier in this plan.
bool KvPressurePlanner::EarlierPagesInPool(const Candidate& c, const KvPagePlan& plan) const {
  if (manager_.options().layout.checkpoint_every == 1) return true;
  const std::vector<BlockId>& table = manager_.block_table(c.seq.slot);
  for (int64_t b = 0; b < c.block_index; ++b) {
    if (table[static_cast<size_t>(b)] != kNoBlock) continue;
    const bool planned = std::any_of(
        plan.actions.begin(), plan.actions.end(),
        [&](const KvPageAction& a) { return a.seq == c.seq.slot && a.block_index == b; });
    if (!planned) return false;
  }
  return true;
}

void KvPressurePlanner::PlanPromotion(std::span<const KvPlannedSeq> running,
                                      int64_t blocks_to_spare, int64_t max_pages,
                                      KvPagePlan* plan) {
  StartPlan(0, plan);
  if (blocks_to_spare <= 0 || max_pages <= 0) return;
  // Every page out of the pool: a resumed sequence's pages read in place may be its sinks too.
  CollectCandidates(running, FateBit(KvPageFate::kInTier) | FateBit(KvPageFate::kCheckpointed),
                    /*movable_only=*/false);
  // A total order (ties end at the slot and the block), so std::sort is deterministic and, unlike
  // stable_sort, needs no buffer.
  std::sort(candidates_.begin(), candidates_.end(), [this](const Candidate& a, const Candidate& b) {
    if (KvPageLeavesFirst(b.forecast, a.forecast)) return true;
    if (KvPageLeavesFirst(a.forecast, b.forecast)) return false;
    const int64_t reads_a = pager_.PageReads(a.seq.slot, a.block_index);
    const int64_t reads_b = pager_.PageReads(b.seq.slot, b.block_index);
    if (reads_a != reads_b) return reads_a > reads_b;
    if (a.seq.slot != b.seq.slot) return a.seq.slot < b.seq.slot;
    return a.block_index < b.block_index;
  });
  const int64_t limit = std::min(blocks_to_spare, max_pages);
  for (const Candidate& c : candidates_) {
    if (static_cast<int64_t>(plan->actions.size()) >= limit) break;
    // Brought back, a page is read once from its tier; left there, once a step: a page read at
    // one more step at most gains nothing (nor does any after it: fewer reads left).
    if (c.forecast.reads_left <= 1) break;
    const KvPage& page = pager_.pages(c.seq.slot).pages[static_cast<size_t>(c.block_index)];
    if (page.awaiting_restore) continue;  // not part of the sequence's KV yet
    if (page.fate == KvPageFate::kCheckpointed && !EarlierPagesInPool(c, *plan)) continue;
    KvPageAction a;
    a.seq = c.seq.slot;
    a.block_index = c.block_index;
    a.action = page.action;
    const BringBackPrice price =
        CorrectedPrice(feedback_, FeedbackKey(page.action, page.tier), page.model_ms);
    a.model_ms = price.model_ms;
    a.predicted_ms = price.predicted_ms;
    plan->actions.push_back(a);
  }
}

void KvPressurePlanner::PlanPreemption(const KvPlannedSeq& seq, int64_t num_computed, Phase phase,
                                       KvPagePlan* plan) const {
  StartPlan(0, plan);
  // A sequence that lost a page's exact bytes computed its later pages against that: they are
  // all recomputed. Pages of a losslessly paged sequence held outside the pool are let go (the
  // store's stay cached in their tier, where the resume finds them); the rest are priced.
  const bool lossy = manager_.IsLossy(seq.slot);
  const std::vector<BlockId>& table = manager_.block_table(seq.slot);
  const int64_t full_blocks = num_computed / rules_.block_tokens;
  // The pages recomputed with no choice to make are still priced by the cost model (each at
  // its position), so that its prediction can be checked when they come back.
  // A preemption frees every block of the sequence: the shortfall is what it is for.
  const double memory_price = MemoryPriceMsPerMib(full_blocks, 0);
  for (int64_t b = 0; b < full_blocks; ++b) {
    KvPageAction a;
    if (lossy || table[static_cast<size_t>(b)] == kNoBlock) {
      a.seq = seq.slot;
      a.block_index = b;
      a.action = KvAction::kRecomputeTokens;
      const BringBackPrice price =
          CorrectedPrice(feedback_, static_cast<size_t>(KvAction::kRecomputeTokens),
                         RecomputeTokensMs(rules_.prices, b * rules_.block_tokens));
      a.model_ms = price.model_ms;
      a.predicted_ms = price.predicted_ms;
    } else {
      a = Decide(seq, b, /*running=*/false, phase, /*staging_room=*/false, memory_price);
    }
    plan->actions.push_back(a);
  }
}

}  // namespace kvl
