// KvMemory at run time: what the engine asks of it each step, through the door (kvl/kv_memory.h):
// a prompt's pages found in the store and planned for admission, the step's page plan applied
// (restores, relief, preemption, promotion), the window's rows, the forward run's staging, the
// tail truncated after a rejected draft, prices for the scheduler and the step meter, and the
// store's statistics. Its creation is kv_memory.cc.
#include "kvl/kv_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvl/kv_block_observer.h"
#include "tiers/disk_tier.h"  // DiskTier is a KvTier (tiers())

namespace kvl {
namespace {

// Promotion back (Promote). The steps after relief or a preemption promote nothing: the pool was
// short a moment ago, and blocks a finishing request frees then are likely the next shortfall's.
constexpr int64_t kPromoteQuietSteps = 4;
// Free blocks kept beyond what the running sequences take in the next block_tokens steps: a
// share of the pool, for a copy-on-write block or an admission arriving meanwhile.
constexpr int64_t kPromoteMarginPoolFraction = 16;  // 1/16, at least one block
// A promotion reads a whole page once, as one step that streams it does: four at most add about
// four pages' reads to the time between two steps.
constexpr int64_t kMaxPromotionsPerStep = 4;

}  // namespace

std::vector<const KvTier*> KvMemory::tiers() const {
  std::vector<const KvTier*> out;
  for (const KvTier* tier : {ram_tier_.get(), disk_tier_.get(), redis_tier_.get()}) {
    if (tier != nullptr) out.push_back(tier);
  }
  return out;
}

void KvMemory::FindInStore(std::span<const int32_t> tokens, int64_t cached_tokens,
                           KvSequencePages* sequence_pages) {
  if (!store_) return;
  const int64_t block_tokens = layout().block_tokens;
  std::vector<KvPage>& pages = sequence_pages->pages;
  const int64_t len = static_cast<int64_t>(tokens.size());
  const int64_t first = cached_tokens / block_tokens;
  int64_t last = (len - 1) / block_tokens;  // the page with the last token is computed
  // A resumed sequence brings back what its preemption kept; the store is asked for the pages
  // before the first of those.
  for (int64_t b = first; b < last && static_cast<size_t>(b) < pages.size(); ++b) {
    if (pages[static_cast<size_t>(b)].awaiting_restore) {
      last = b;
      break;
    }
  }
  if (first >= last) return;
  manager_->ContentChain(tokens, last, &content_ids_);
  // Pages still in the pool but out of the prefix index's reach (an earlier page of the chain
  // went to a tier) join the store first, so the walk through the tiers finds them.
  for (int64_t b = first; b < last; ++b) {
    const BlockId block = manager_->FindContent(content_ids_[static_cast<size_t>(b)]);
    if (block != kNoBlock) pager_->SaveBlockToStore(block, content_ids_[static_cast<size_t>(b)]);
  }
  const int64_t found =
      store_->Lookup(std::span(content_ids_).subspan(static_cast<size_t>(first)),
                     tokens.subspan(static_cast<size_t>(first * block_tokens)), &found_in_);
  const BringBackFeedback* corrections = feedback();
  for (int64_t i = 0; i < found; ++i) {
    KvTier* tier = found_in_[static_cast<size_t>(i)];
    const int64_t tier_index = store_->TierIndex(tier);
    // Named by where the page is (a zstd RAM tier is RAM too).
    const KvAction action = tier->kind() == TierKind::kRam    ? KvAction::kDemoteRam
                            : tier->kind() == TierKind::kDisk ? KvAction::kDemoteDisk
                                                              : KvAction::kDemoteRedis;
    const BringBackPrice promote =
        CorrectedPrice(corrections, FeedbackKey(action, tier),
                       store_->tiers()[static_cast<size_t>(tier_index)].promote_ms);
    const BringBackPrice recompute =
        CorrectedPrice(corrections, static_cast<size_t>(KvAction::kRecomputeTokens),
                       RecomputeTokensMs(rules().prices, (first + i) * block_tokens));
    // The cheapest way back: a tier slower than recomputing the page from its tokens is not used
    // (nor anything after it: the pages after a recomputed one are computed with it).
    if (promote.predicted_ms >= recompute.predicted_ms) break;
    const size_t b = static_cast<size_t>(first + i);
    if (pages.size() <= b) pages.resize(b + 1);
    KvPage& page = pages[b];
    page.fate = KvPageFate::kInTier;
    page.action = action;
    page.predicted_ms = promote.predicted_ms;
    page.model_ms = promote.model_ms;
    page.tier = tier;
    page.content = content_ids_[b];
    page.awaiting_restore = true;
    // Held until it is promoted: the tier must not evict it for another page meanwhile.
    store_->Pin(tier, page.content);
    page.store_pin = true;
  }
}

void KvMemory::CommitStep(const KvPlan& plan) {
  for (const KvPlan::SeqPlan& sp : plan.seqs) {
    for (BlockId block : sp.allocated) {
      if (trace_) trace_->LeaveReused(manager_->FreeBlockContent(block));
      pager_->SpillFreeBlock(block);
    }
    if (sp.cow_dst != kNoBlock) {
      if (trace_) trace_->LeaveReused(manager_->FreeBlockContent(sp.cow_dst));
      pager_->SpillFreeBlock(sp.cow_dst);
    }
  }
  manager_->Commit(plan);
  for (const KvBlockCopy& copy : plan.copies) storage_->CopyBlock(copy.src, copy.dst);
}

int64_t KvMemory::InPlaceBlocks(const KvSequencePages& sequence_pages, int64_t len,
                                int64_t from, int64_t* streamed) const {
  *streamed = 0;
  const int64_t block_tokens = layout().block_tokens;
  if (from % block_tokens != 0) return 0;
  const std::vector<KvPage>& pages = sequence_pages.pages;
  // A prompt the pool cannot hold: its store pages on a disk tier stay where they lie and are
  // streamed like a demoted page, each layer's reads in flight on the tier's worker while the
  // layer before computes, from the prefill's first step on. Promoted instead, they would all be
  // read before the prefill starts and most of them demoted again, written back, as it fills
  // the pool. The staging for streamed pages bounds how many.
  const int64_t prompt_blocks = (len - from + block_tokens - 1) / block_tokens;
  const int64_t pool_blocks = manager_->stats().blocks_free - from / block_tokens;
  int64_t stream_room = 0;
  if (prompt_blocks > pool_blocks) {
    stream_room = pager_->staging_capacity_pages() - pager_->staged_pages_held() -
                  stream_pages_promised_;
  }
  int64_t blocks = 0;
  for (size_t b = static_cast<size_t>(from / block_tokens); b < pages.size(); ++b) {
    const KvPage& page = pages[b];
    if (!page.awaiting_restore || !page.content.valid() || !page.store_pin ||
        page.fate != KvPageFate::kInTier || from + (blocks + 1) * block_tokens > len - 1) {
      break;
    }
    if (!page.tier->reads_in_place()) {
      if (page.tier->kind() != TierKind::kDisk || *streamed >= stream_room) break;
      ++*streamed;
    }
    ++blocks;
  }
  return blocks;
}

int64_t KvMemory::RestorableTokens(const KvSequencePages& sequence_pages, int64_t len, int64_t from,
                                   int64_t cap) const {
  const int64_t block_tokens = layout().block_tokens;
  if (from % block_tokens != 0) return 0;
  const std::vector<KvPage>& pages = sequence_pages.pages;
  int64_t restore = 0;
  for (size_t b = static_cast<size_t>(from / block_tokens); b < pages.size(); ++b) {
    if (!pages[b].awaiting_restore || from + restore + block_tokens > len - 1 ||
        restore + block_tokens > cap) {
      break;
    }
    restore += block_tokens;
  }
  return restore;
}

bool KvMemory::HoldsPagesOutsidePool() const {
  const KvPagerStats pages = pager_->stats();
  return pages.streamed_pages + pages.rebuilt_pages > 0;
}

KvAdmission KvMemory::PlanAdmission(std::span<const int32_t> tokens, KvSequencePages* pages,
                                    bool ask_store, int64_t restore_cap) {
  KvAdmission a;
  const int64_t len = static_cast<int64_t>(tokens.size());
  a.cached_tokens = manager_->MatchPrefix(tokens);
  if (ask_store) FindInStore(tokens, a.cached_tokens, pages);
  int64_t streamed = 0;
  a.in_place_blocks = InPlaceBlocks(*pages, len, a.cached_tokens, &streamed);
  stream_pages_promised_ += streamed;
  a.restore_tokens = RestorableTokens(
      *pages, len, a.cached_tokens + a.in_place_blocks * layout().block_tokens, restore_cap);
  return a;
}

void KvMemory::Apply(const KvPlan& plan, std::span<const KvStepRequest> seqs, KvApplied* out) {
  KVL_CHECK_MSG(seqs.size() == plan.seqs.size(), "one KvStepRequest per sequence of the plan");
  CommitStep(plan);
  out->Clear();
  const int64_t block_tokens = layout().block_tokens;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const KvPlan::SeqPlan& sp = plan.seqs[i];
    const KvStepRequest& seq = seqs[i];
    int64_t computed = sp.admit ? sp.num_cached_tokens : sp.first_new_pos;
    if (sp.admit) {
      pager_->StartSequence(sp.seq, seq.pages);
      if (window_) window_->StartSequence(sp.seq);  // the slot's new occupant holds no rows yet
      // Pages dropped at the preemption are recomputed from their tokens, by this step and the
      // prefill chunks after it: each priced as the step that computes it will be measured.
      for (size_t b = 0; b < seq.pages->pages.size(); ++b) {
        const KvPage& page = seq.pages->pages[b];
        if (page.fate != KvPageFate::kDropped) continue;
        out->recomputed.push_back(
            {seq.request, static_cast<int64_t>(b),
             CorrectedPrice(feedback(), static_cast<size_t>(KvAction::kRecomputeTokens),
                            page.model_ms)});
      }
      if (sp.in_place_blocks > 0) {
        // Store pages read where the RAM tier holds them, or streamed from the disk tier where
        // they lie: part of the sequence, never copied into the pool.
        const int64_t first = computed / block_tokens;
        pager_->ReadInPlace(sp.seq, first, sp.in_place_blocks);
        computed += sp.in_place_blocks * block_tokens;
        // Counted per tier: a RAM tier's pages, then a disk tier's.
        for (int64_t b = first; store_ && b < first + sp.in_place_blocks; ++b) {
          store_->CountInPlace(seq.pages->pages[static_cast<size_t>(b)].tier, 1);
        }
      }
    }
    int64_t restored = 0;
    if (sp.restore_tokens > 0) {
      restored = RestorePages(sp.seq, seq, computed / block_tokens,
                              sp.restore_tokens / block_tokens, out) *
                 block_tokens;
      computed += restored;
    }
    // Pages restored, or computed where a restore stopped or the prefix cache held them, are let
    // go from their tier at once: a page awaiting restore is never also in the pool.
    pager_->SettleRestoredPages(sp.seq);
    out->computed_from.push_back(computed);
    out->restored_tokens.push_back(restored);
  }
  if (trace_) TraceReads(plan, seqs, *out);
}

int64_t KvMemory::RestorePages(SeqId slot, const KvStepRequest& seq, int64_t first_block, int64_t count,
                               KvApplied* out) {
  // The bring-back time checked is the one expected as the page comes back: the price the model
  // gave when the page left, corrected by what restores measured since (a sequence preempted
  // early was priced before anything had been measured).
  for (int64_t b = first_block; b < first_block + count; ++b) {
    KvPage& page = seq.pages->pages[static_cast<size_t>(b)];
    page.predicted_ms =
        CorrectedPrice(feedback(), FeedbackKey(page.action, page.tier), page.model_ms).predicted_ms;
  }
  // Each page is timed on its own: one restore may read pages of several tiers.
  const int64_t restored = pager_->RestorePages(slot, first_block, count, &restore_page_ms_);
  if (restored < count) out->read_failures.push_back(count - restored);
  for (int64_t b = first_block; b < first_block + restored; ++b) {
    const KvPage& page = seq.pages->pages[static_cast<size_t>(b)];
    const double page_ms = restore_page_ms_[static_cast<size_t>(b - first_block)];
    // A store page found by the admission's lookup: one of the tier's hits, promoted.
    int64_t store_tier = -1;
    if (page.content.valid() && store_) {
      store_->CountPromoted(page.tier, 1, page.predicted_ms, page_ms);
      store_tier = store_->TierIndex(page.tier);
    }
    CountBroughtBack(seq.request, b, page, page_ms, store_tier, out);
  }
  restored_.FeedTo(feedback());
  return restored;
}

void KvMemory::CountBroughtBack(int64_t request, int64_t block, const KvPage& page,
                                double measured_ms, int64_t store_tier, KvApplied* out) {
  if (trace_) {
    trace_->Back(request, block, static_cast<int>(page.action), page.predicted_ms, measured_ms);
  }
  restored_.Add(FeedbackKey(page.action, page.tier), page.model_ms, measured_ms);
  out->brought_back.push_back({page.action, page.predicted_ms, measured_ms, store_tier});
}

void KvMemory::TraceReads(const KvPlan& plan, std::span<const KvStepRequest> seqs,
                          const KvApplied& applied) {
  const int64_t block_tokens = layout().block_tokens;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqId slot = plan.seqs[i].seq;
    if (!manager_->Contains(slot)) continue;
    const int64_t full_blocks = manager_->num_tokens(slot) / block_tokens;
    trace_contents_.clear();
    trace_outside_.clear();
    trace_evicted_.clear();
    for (int64_t b = 0; b < full_blocks; ++b) {
      trace_contents_.push_back(manager_->ContentOf(slot, b));
      switch (pager_->FateOf(slot, b)) {
        case KvPageFate::kInTier:
        case KvPageFate::kCheckpointed:
          trace_outside_.push_back(b);  // streamed, read in place, or rebuilt
          break;
        case KvPageFate::kEvicted:
          trace_evicted_.push_back(b);
          break;
        default:
          break;  // in the pool, compressed or not
      }
    }
    trace_->Read(seqs[i].request, trace_contents_, applied.computed_from[i] / block_tokens,
                 trace_outside_, trace_evicted_, seqs[i].steps_left);
  }
}

int64_t KvMemory::RestoreWindow(SeqId slot, int64_t n) {
  if (!window_ || window_->HoldsWindow(slot, n)) return n;
  KvWindowRebuildPrices prices;
  prices.residual_page_ms = rules().prices.recompute_residual_ms;
  prices.tokens_page_ms = rules().prices.recompute_tokens_ms;
  prices.block_tokens = layout().block_tokens;
  prices.num_layers = layout().num_layers;
  const bool residuals = rebuilder_ != nullptr &&
                         window_->ResidualsCover(*manager_, *storage_, slot, n);
  if (window_->ChooseWindowRebuild(n, residuals, prices) == KvWindowRebuild::kFromResiduals) {
    window_->RebuildFromResiduals(*manager_, *storage_, *rebuilder_, slot, n);
    return n;
  }
  const int64_t from = window_->RebuildStart(n);
  window_->CountTokenRebuild(n - from);
  return from;
}

void KvMemory::ClaimWindowRows(SeqId slot, int64_t begin, int64_t end) {
  if (window_) window_->ClaimRun(slot, begin, end);
}

void KvMemory::BeginForward(std::span<const SeqId> slots) { pager_->BeginStep(slots); }

std::span<const SeqId> KvMemory::EndForward() { return pager_->EndStep(); }

void KvMemory::DiscardWrites(SeqId slot, int64_t first_block) {
  manager_->DropIdentity(slot, first_block);
}

void KvMemory::FileUnreachablePages(SeqId slot, int64_t first_block) {
  if (!store_ || !manager_->Contains(slot) || !manager_->IsPaged(slot)) {
    return;  // a sequence with no page outside the pool is all within the index's reach
  }
  const int64_t block_tokens = layout().block_tokens;
  const int64_t full = manager_->num_tokens(slot) / block_tokens;
  if (full <= first_block) return;
  // The blocks the pool's prefix index reaches (at most all but the last token's).
  const std::vector<int32_t>& tokens = manager_->tokens(slot);
  const int64_t reachable =
      manager_->MatchPrefix(std::span(tokens).first(static_cast<size_t>(
          std::min<int64_t>(static_cast<int64_t>(tokens.size()), full * block_tokens + 1)))) /
      block_tokens;
  pager_->SaveUnreachablePages(slot, std::max(first_block, reachable), full);
}

void KvMemory::TruncateTail(SeqId slot, int64_t tokens) {
  if (manager_->Contains(slot)) manager_->TruncateTail(slot, tokens);
}

void KvMemory::PlanRelief(std::span<const KvPlannedSeq> running, int64_t blocks_short, Phase phase,
                          KvPagePlan* plan) {
  planner_->PlanRelief(running, blocks_short, phase, plan);
  plan->kind = KvPagePlanKind::kRelief;
  NameOwners(running, plan);
}

void KvMemory::PlanCompressedEviction(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                                      KvPagePlan* plan) {
  planner_->PlanCompressedEviction(running, blocks_short, plan);
  plan->kind = KvPagePlanKind::kCompressedEviction;
  NameOwners(running, plan);
}

const KvPagePlan* KvMemory::Relieve(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                                    Phase phase) {
  steps_since_pressure_ = 0;
  PlanRelief(running, blocks_short, phase, &page_plan_);
  if (Apply(page_plan_) > 0 ||
      std::any_of(page_plan_.actions.begin(), page_plan_.actions.end(),
                  [](const KvPageAction& a) { return a.failed; })) {
    return &page_plan_;
  }
  // Nothing resident could go: compressed pages are evicted, the last resort.
  PlanCompressedEviction(running, blocks_short, &page_plan_);
  return Apply(page_plan_) > 0 ? &page_plan_ : nullptr;
}

const KvPagePlan& KvMemory::Preempt(const KvPlannedSeq& seq, int64_t num_computed, Phase phase) {
  steps_since_pressure_ = 0;
  planner_->PlanPreemption(seq, num_computed, phase, &page_plan_);
  page_plan_.kind = KvPagePlanKind::kPreemption;
  page_plan_.preempted = seq.slot;
  NameOwners(std::span(&seq, 1), &page_plan_);
  Apply(page_plan_);  // the pages saved or dropped, the blocks let go
  return page_plan_;
}

int64_t KvMemory::Promote(std::span<const KvPlannedSeq> running, KvApplied* out) {
  if (!HoldsPagesOutsidePool() || steps_since_pressure_ <= kPromoteQuietSteps) return 0;
  const int64_t block_tokens = layout().block_tokens;
  promotable_.clear();
  int64_t blocks_needed = 0;
  for (const KvPlannedSeq& seq : running) {
    if (!manager_->Contains(seq.slot)) continue;
    promotable_.push_back(seq);
    // What it adds within the next block_tokens steps: the tokens not in the pool yet (a
    // prompt's rest, the token just sampled), then one a step while it runs.
    const int64_t in_pool = manager_->num_tokens(seq.slot);
    const int64_t steps =
        seq.steps_left >= 0 ? std::min(seq.steps_left, block_tokens) : block_tokens;
    const int64_t to_add = seq.known_tokens - in_pool + steps;
    blocks_needed += manager_->BlocksFor(in_pool + to_add) - manager_->BlocksFor(in_pool);
  }
  const int64_t margin = std::max<int64_t>(1, num_blocks() / kPromoteMarginPoolFraction);
  const int64_t spare = manager_->stats().blocks_free - blocks_needed - margin;
  planner_->PlanPromotion(promotable_, spare, kMaxPromotionsPerStep, &page_plan_);
  page_plan_.kind = KvPagePlanKind::kPromotion;
  NameOwners(promotable_, &page_plan_);
  if (page_plan_.actions.empty()) return 0;
  Apply(page_plan_, out);
  return static_cast<int64_t>(page_plan_.actions.size());
}

void KvMemory::NameOwners(std::span<const KvPlannedSeq> seqs, KvPagePlan* plan) {
  for (KvPageAction& a : plan->actions) {
    for (const KvPlannedSeq& s : seqs) {
      if (s.slot == a.seq) a.request = s.request_id;
    }
  }
}

int64_t KvMemory::Apply(KvPagePlan& plan, KvApplied* out) {
  if (out != nullptr) out->Clear();
  int64_t applied = 0;
  switch (plan.kind) {
    case KvPagePlanKind::kRelief:
    case KvPagePlanKind::kCompressedEviction:
      applied = pager_->Apply(plan);
      // Planned again, a failed page takes another action.
      if (plan.kind == KvPagePlanKind::kRelief) planner_->NoteFailedActions(plan);
      if (trace_) TraceLeaving(plan);
      if (plan.kind == KvPagePlanKind::kCompressedEviction && rules().explain) {
        for (const KvPageAction& a : plan.actions) {
          if (!a.applied) continue;
          fmt::print(stderr,
                     "kvl: explain: request {} compressed page {} -> evict (the pool holds only "
                     "compressed pages)\n",
                     a.request, a.block_index);
        }
      }
      break;
    case KvPagePlanKind::kPreemption:
      pager_->Preempt(plan.preempted, plan);
      planner_->NoteFailedActions(plan);
      for (const KvPageAction& a : plan.actions) applied += a.applied ? 1 : 0;
      if (trace_) TraceLeaving(plan);
      manager_->Free(plan.preempted, /*resumes=*/true);  // its blocks are read at its resume
      break;
    case KvPagePlanKind::kPromotion: {
      if (plan.actions.empty()) break;
      // The pager makes each page resident: what it was (its tier, its prices) is kept for the
      // count.
      promoting_.clear();
      for (const KvPageAction& a : plan.actions) {
        promoting_.push_back(pager_->pages(a.seq).pages[static_cast<size_t>(a.block_index)]);
        promoting_.back().predicted_ms = a.predicted_ms;  // corrected as it is brought back
      }
      applied = pager_->PromoteBack(plan);
      for (size_t i = 0; i < plan.actions.size(); ++i) {
        const KvPageAction& a = plan.actions[i];
        // A failed read leaves the page in its tier: nothing is recomputed.
        if (a.failed && out != nullptr) out->read_failures.push_back(0);
        if (!a.applied || out == nullptr) continue;
        CountBroughtBack(a.request, a.block_index, promoting_[i], a.measured_ms, -1, out);
      }
      restored_.FeedTo(feedback());
      break;
    }
  }
  return applied;
}

void KvMemory::TraceLeaving(const KvPagePlan& plan) {
  const bool preempted = plan.kind == KvPagePlanKind::kPreemption;
  for (const KvPageAction& a : plan.actions) {
    if (!preempted && !a.applied) continue;
    // A preempted page another sequence shares stays in the pool for that one.
    const std::vector<BlockId>& table = manager_->block_table(a.seq);
    const size_t b = static_cast<size_t>(a.block_index);
    if (b < table.size() && table[b] != kNoBlock && manager_->refcount(table[b]) > 1) continue;
    trace_->Leave(a.request, a.block_index,
                  static_cast<int>(a.applied ? a.action : KvAction::kRecomputeTokens),
                  preempted ? KvTraceCause::kPreempt : KvTraceCause::kRelief, a.predicted_ms);
  }
}

void KvMemory::HandOverSession(SeqId slot, int64_t tokens, KvSequencePages* pages) {
  if (tokens < manager_->num_tokens(slot)) {
    manager_->Truncate(slot, tokens);
    pager_->Truncate(slot, tokens / layout().block_tokens);
  }
  pager_->Rebind(slot, pages);
}

void KvMemory::ReleaseWaiting(KvSequencePages& pages) { pager_->ForgetPreemptedPages(pages); }

void KvMemory::StartStep() {
  if (trace_) trace_->Step();
  planner_->ClearFailedActions();
  ++steps_since_pressure_;
}

double KvMemory::TokenRecomputeMs(int64_t position) const {
  return RecomputeTokenMs(rules().prices, position);
}

KvInStepRebuilds KvMemory::InStepRebuilds() const {
  KvInStepRebuilds r;
  const PageCostProfile& prices = rules().prices;
  const double correction = InStepRebuildCorrection(corrections());
  for (SeqId seq : pager_->RebuiltInStep()) {
    const double model_ms = InStepRebuildMs(prices, manager_->num_tokens(seq));
    if (model_ms < 0) continue;
    ++r.pages;
    r.model_ms += model_ms;
    r.predicted_ms += model_ms * correction;
  }
  return r;
}

double KvMemory::PlainDecodeStepMs(std::span<const int64_t> contexts) const {
  const DecodeIdleCurve& curve = rules().prices.decode_idle;
  if (contexts.empty() || curve.num_points == 0) return 0;
  const int64_t deepest = *std::max_element(contexts.begin(), contexts.end());
  double ms = curve.PointAt(deepest).step_ms;
  bool deepest_counted = false;
  for (int64_t context : contexts) {
    if (context == deepest && !deepest_counted) {
      deepest_counted = true;
      continue;
    }
    ms += curve.PointAt(context).batch_ms_per_token;
  }
  return ms;
}

void KvMemory::FeedBack(BringBackBatch& batch) { batch.FeedTo(feedback()); }

KvSequenceCapacity KvMemory::MaxSequenceTokens() const {
  KvSequenceCapacity c;
  const int64_t block_tokens = layout().block_tokens;
  c.tokens = num_blocks() * block_tokens;
  if (!rules().pages_running_sequences) return c;
  if (rules().quality != KvQuality::kLossless) {
    c.unbounded = true;
    return c;
  }
  c.staged_pages = pager_->staging_capacity_pages();
  for (const KvTier* tier : tiers()) {
    if (tier->reads_in_place()) c.in_place_pages += tier->stats().capacity_bytes / layout().kv_bytes();
  }
  c.tokens += (c.staged_pages + c.in_place_pages) * block_tokens;
  return c;
}

std::string KvMemory::WhyTooBig(bool prompt_only, int64_t tokens) const {
  // What the budget holds, and why the pages that could have left the pool did not.
  const int64_t block_tokens = layout().block_tokens;
  std::string holds = fmt::format("{} blocks of {} tokens", num_blocks(), block_tokens);
  const KvPagerStats pages = pager_->stats();
  if (pages.staging_bytes > 0) {
    holds += fmt::format(" in the pool, and {:.1f} KiB of buffers for pages leaving it",
                         static_cast<double>(pages.staging_bytes) / 1024.0);
    if (pager_->staging_capacity_pages() > 0) {
      holds +=
          fmt::format(" ({} pages streamed from tiers at once)", pager_->staging_capacity_pages());
    }
  }
  std::string hint;
  if (!prompt_only && !rules().pages_running_sequences) {
    hint =
        ", or let its pages move: --kv-policy auto with --kv-tier ram:SIZE (lossless) or "
        "with --kv-quality balanced";
  } else if (!prompt_only && pager_->staging_capacity_pages() > 0 &&
             pager_->staged_pages_held() >= pager_->staging_capacity_pages()) {
    hint = fmt::format(
        "; its {} pages streamed from tiers fill the staging reserved for them (raise "
        "--kv-stream-reserve, or let pages be compressed: --kv-quality balanced)",
        pager_->staged_pages_held());
  } else if (!prompt_only) {
    hint =
        "; the attention sinks, the recent window and the page being written stay in the "
        "pool (--kv-sink, --kv-recent)";
  }
  if (!pager_->last_tier_error().ok()) {
    hint += "; the last page that could not go to a tier: " + pager_->last_tier_error().message();
  }
  return fmt::format("the KV budget ({}) cannot hold {} of {} tokens; raise --kv-budget{}", holds,
                     prompt_only ? "a prompt" : "a sequence", tokens, hint);
}

void KvMemory::Release(SeqId slot) {
  if (!manager_->Contains(slot)) return;
  if (store_) {
    for (const KvStoreTier& t : store_->tiers()) {
      if (t.durable) pager_->SaveToStore(slot, t.tier);
    }
  }
  pager_->DropSequence(slot);
  manager_->Free(slot);
  PublishStoreStats();  // a request cancelled between steps writes through too
}

void KvMemory::PublishStoreStats() {
  // The step's end: a listener of the index's changes gets the index itself where it changed.
  if (options_.block_observer != nullptr &&
      manager_->index_changes() != observed_index_changes_) {
    observed_index_changes_ = manager_->index_changes();
    manager_->IndexedHashes(&indexed_hashes_);
    options_.block_observer->IndexSnapshot(indexed_hashes_);
  }
  if (!store_) return;
  std::lock_guard<std::mutex> lock(store_stats_mutex_);
  store_stats_.resize(store_->tiers().size());
  for (size_t t = 0; t < store_stats_.size(); ++t) store_stats_[t] = store_->stats(t);
}

std::vector<KvStoreTierStats> KvMemory::StoreStats() const {
  std::lock_guard<std::mutex> lock(store_stats_mutex_);
  return store_stats_;
}

int64_t KvMemory::StoreTierIndex(const KvTier* tier) const {
  return store_ ? store_->TierIndex(tier) : -1;
}

}  // namespace kvl
