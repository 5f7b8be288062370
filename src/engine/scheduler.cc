#include "scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace kvl {
namespace {

// Promotion back (PlanPromotions). The steps after relief or a preemption promote nothing: the
// pool was short a moment ago, and blocks a finishing request frees then are likely the next
// shortfall's.
constexpr int64_t kPromoteQuietSteps = 4;
// Free blocks kept beyond what the running sequences take in the next block_tokens steps: a
// share of the pool, for a copy-on-write block or an admission arriving meanwhile.
constexpr int64_t kPromoteMarginPoolFraction = 16;  // 1/16, at least one block
// A promotion reads a whole page once, as one step that streams it does: four at most add about
// four pages' reads to the time between two steps.
constexpr int64_t kMaxPromotionsPerStep = 4;

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, KvMemory& memory, MetricsRecorder& metrics)
    : options_(options),
      memory_(memory),
      kv_(memory.manager()),
      pager_(memory.pager()),
      planner_(memory.planner()),
      metrics_(metrics),
      trace_(memory.trace()),
      block_tokens_(memory.layout().block_tokens) {
  for (SeqId s = options.max_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
  running_.reserve(static_cast<size_t>(options.max_seqs));
  planned_running_.reserve(static_cast<size_t>(options.max_seqs));
}

void Scheduler::Enqueue(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

void Scheduler::Cancel(const std::unordered_set<RequestId>& ids) {
  for (auto& seq : running_) {
    if (ids.count(seq->id)) Finish(*seq, "cancelled");
  }
  for (auto& seq : waiting_) {
    if (ids.count(seq->id)) Finish(*seq, "cancelled");
  }
}

int64_t Scheduler::InPlaceBlocks(const Sequence& seq, int64_t from) const {
  if (from % block_tokens_ != 0) return 0;
  const int64_t len = static_cast<int64_t>(seq.tokens.size());
  const std::vector<KvPage>& pages = seq.kv_pages.pages;
  int64_t blocks = 0;
  for (size_t b = static_cast<size_t>(from / block_tokens_); b < pages.size(); ++b) {
    const KvPage& page = pages[b];
    if (!page.awaiting_restore || !page.content.valid() || !page.store_pin ||
        page.fate != KvPageFate::kInTier || !page.tier->reads_in_place() ||
        from + (blocks + 1) * block_tokens_ > len - 1) {
      break;
    }
    ++blocks;
  }
  return blocks;
}

bool Scheduler::RestoresAhead(const Sequence& seq, int64_t from) const {
  return RestorableTokens(seq, from, std::numeric_limits<int64_t>::max()) > 0;
}

int64_t Scheduler::RestorableTokens(const Sequence& seq, int64_t from, int64_t cap) const {
  if (from % block_tokens_ != 0) return 0;
  const int64_t len = static_cast<int64_t>(seq.tokens.size());
  const std::vector<KvPage>& pages = seq.kv_pages.pages;
  int64_t restore = 0;
  for (size_t b = static_cast<size_t>(from / block_tokens_); b < pages.size(); ++b) {
    if (!pages[b].awaiting_restore || from + restore + block_tokens_ > len - 1 ||
        restore + block_tokens_ > cap) {
      break;
    }
    restore += block_tokens_;
  }
  return restore;
}

size_t Scheduler::FillSteps(size_t max_admissions, int64_t prefill_cap, int64_t restore_cap,
                            StepPlan* plan) {
  plan->steps.clear();
  plan->seqs.clear();
  int64_t budget = options_.max_batch_tokens;
  for (bool decode_pass : {true, false}) {
    for (auto& seq : running_) {
      const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->num_computed;
      if (remaining <= 0 || (remaining == 1) != decode_pass || budget == 0) continue;
      // A prefill chunk promotes the pages the store or a preemption kept (a restore larger
      // than the pool goes in chunks, the pool paging older pages out as it fills).
      const int64_t restore =
          decode_pass ? 0 : RestorableTokens(*seq, seq->num_computed, restore_cap);
      const int64_t n = RestoresAhead(*seq, seq->num_computed + restore)
                            ? 0
                            : std::min({remaining - restore, budget,
                                        decode_pass ? remaining : prefill_cap});
      seq->restore_tokens = restore;
      // --- speculative decoding (issue 26): a decode carries its draft as unverified rows ---
      seq->spec.in_step = 0;
      const auto draft = static_cast<int64_t>(seq->spec.draft.size());
      if (decode_pass && n == 1 && draft > 0 && budget >= 1 + draft) {
        seq->spec.in_step = draft;
        plan->steps.push_back({seq->slot, seq->spec.step_tokens, 0, draft});
        plan->seqs.push_back(seq.get());
        budget -= 1 + draft;
        continue;
      }
      // --- end speculative decoding ---
      plan->steps.push_back({seq->slot, std::span<const int32_t>(seq->tokens).subspan(
                                            static_cast<size_t>(seq->num_computed),
                                            static_cast<size_t>(restore + n))});
      plan->seqs.push_back(seq.get());
      budget -= n;
    }
  }
  size_t admissions = 0;
  for (auto& seq : waiting_) {
    if (budget == 0 || admissions == max_admissions) break;
    if (running_.size() + admissions >= static_cast<size_t>(options_.max_seqs)) break;
    if (admissions >= free_slots_.size()) break;  // the other slots hold parked sessions
    const int64_t len = static_cast<int64_t>(seq->tokens.size());
    const int64_t cached = kv_.MatchPrefix(seq->tokens);
    if (!seq->store_checked) {
      seq->store_checked = true;
      memory_.FindInStore(seq->tokens, cached, &seq->kv_pages);
    }
    // Pages kept at a preemption or found in the store right after the cached prefix are
    // promoted instead of computed.
    // Store pages in a RAM tier are read where they lie; the rest are promoted.
    const int64_t attach = InPlaceBlocks(*seq, cached);
    const int64_t attached = cached + attach * block_tokens_;
    const int64_t restore = RestorableTokens(*seq, attached, restore_cap);
    seq->restore_tokens = restore;
    seq->spec.in_step = 0;  // speculative decoding: an admission carries no draft
    const int64_t n = RestoresAhead(*seq, attached + restore)
                          ? 0
                          : std::min({len - attached - restore, budget, prefill_cap});
    const SeqId slot = free_slots_[free_slots_.size() - 1 - admissions];
    plan->steps.push_back({slot,
                           std::span<const int32_t>(seq->tokens).first(
                               static_cast<size_t>(attached + restore + n)),
                           attach});
    plan->seqs.push_back(seq.get());
    budget -= n;
    ++admissions;
  }
  return admissions;
}

int64_t Scheduler::ContinuableTokens(const Sequence& session, const Sequence& seq) const {
  const auto computed = static_cast<size_t>(session.num_computed);
  // The new request computes at least its last prompt token (its logits are needed).
  const size_t limit = std::min(computed, seq.tokens.size() - 1);
  const auto agree = static_cast<size_t>(
      std::mismatch(session.tokens.begin(), session.tokens.begin() + static_cast<ptrdiff_t>(limit),
                    seq.tokens.begin())
          .first -
      session.tokens.begin());
  if (agree == computed) return session.num_computed;  // all of it, the partial page too
  // Where they part (a client that re-tokenized the reply, edited the history): whole pages up
  // to there; the session is cut back to them.
  return static_cast<int64_t>(agree) / block_tokens_ * block_tokens_;
}

void Scheduler::AdoptParkedSessions() {
  for (auto it = waiting_.begin(); it != waiting_.end() && !parked_.empty();) {
    Sequence& seq = **it;
    // Only a new request: a preempted one has its own pages to come back to. A lossless one
    // never continues a session: its pages are approximate.
    if (seq.slot >= 0 || seq.preemptions > 0 || seq.cached_prompt_tokens >= 0 ||
        seq.tokens.size() < 2 || seq.kv_quality == KvQuality::kLossless) {
      ++it;
      continue;
    }
    size_t best = 0;
    int64_t best_tokens = 0;
    for (size_t i = 0; i < parked_.size(); ++i) {
      const int64_t n = ContinuableTokens(*parked_[i], seq);
      if (n > best_tokens) {
        best = i;
        best_tokens = n;
      }
    }
    // Exact pages the prefix cache holds win over as many approximate ones.
    if (best_tokens == 0 || best_tokens <= kv_.MatchPrefix(seq.tokens)) {
      ++it;
      continue;
    }
    Sequence& session = *parked_[best];
    if (best_tokens < session.num_computed) {
      kv_.Truncate(session.slot, best_tokens);
      pager_.Truncate(session.slot, best_tokens / block_tokens_);
    }
    seq.slot = session.slot;
    seq.kv_pages = std::move(session.kv_pages);
    pager_.Rebind(seq.slot, &seq.kv_pages);
    seq.num_computed = best_tokens;
    seq.cached_prompt_tokens = best_tokens;
    seq.store_checked = true;
    parked_.erase(parked_.begin() + static_cast<ptrdiff_t>(best));
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
  while (!parked_.empty() && waiting_.size() > free_slots_.size()) Unpark(0);
}

void Scheduler::ReleaseParkedSessions() {
  while (!parked_.empty()) Unpark(0);
}

void Scheduler::Unpark(size_t parked_index) {
  KVL_CHECK(parked_index < parked_.size());
  ReleaseSlot(*parked_[parked_index]);
  parked_.erase(parked_.begin() + static_cast<ptrdiff_t>(parked_index));
}

bool Scheduler::Schedule(StepPlan* plan) {
  ++steps_since_pressure_;
  AdoptParkedSessions();
  size_t max_admissions = waiting_.size();
  planner_.ClearFailedActions();
  // Prefill chunks shrink when a sequence pages through a pool smaller than one chunk.
  int64_t prefill_cap = options_.max_batch_tokens;
  int64_t restore_cap = std::numeric_limits<int64_t>::max();
  for (;;) {
    const size_t admissions = FillSteps(max_admissions, prefill_cap, restore_cap, plan);
    if (plan->steps.empty()) return false;
    // Recompute is priced against the step's own arithmetic: busy in prefill, idle in decode.
    phase_ = Phase::kDecode;
    for (const KvSeqStep& step : plan->steps) {
      // (A decode carrying a draft is still a decode: speculative decoding, issue 26.)
      if (static_cast<int64_t>(step.tokens.size()) - step.unverified > 1) phase_ = Phase::kPrefill;
    }
    plan->phase = phase_;
    kv_.Plan(plan->steps, &plan->kv);  // reuses the plan's vectors: no allocation per step
    if (plan->kv.fits) {
      // Admissions become running sequences, in order, with the slots the plan used.
      for (size_t a = 0; a < admissions; ++a) {
        std::unique_ptr<Sequence> seq = std::move(waiting_.front());
        waiting_.pop_front();
        seq->slot = free_slots_.back();
        free_slots_.pop_back();
        running_.push_back(std::move(seq));
      }
      return true;
    }
    const KvPlan& kv = plan->kv;
    const int64_t blocks_short = kv.blocks_needed + kv.blocks_reused_free - kv.blocks_free;
    // Parked sessions are a cache: they go before an admission waits or any running sequence's
    // page has to move.
    if (!parked_.empty()) {
      Unpark(0);
      continue;
    }
    if (admissions > 0 && !running_.empty()) {
      max_admissions = admissions - 1;  // the newest admission waits for a later step
      continue;
    }
    // Running sequences' coldest pages leave the pool (the lattice) before anything is
    // preempted.
    // A full RAM tier sends running sequences' pages to slower tiers, through the few staging
    // buffers: pages waiting sequences hold there give way first (they are recomputed, or found
    // in the store again, at their admission).
    if (admissions == 0 && RamTierFull() && ReleaseWaitingTierPages(/*ram_only=*/true)) continue;
    if (RelievePressure(blocks_short, phase_)) continue;
    if (planner_.rules().pages_running_sequences && prefill_cap > block_tokens_) {
      prefill_cap = std::max<int64_t>(block_tokens_, prefill_cap / 2);
      continue;
    }
    // Restores larger than the pool go in chunks (computing nothing until the last one, so no
    // page the store holds is computed instead), the pool paging older pages out in between.
    int64_t largest_restore = 0;
    for (const Sequence* seq : plan->seqs) {
      largest_restore = std::max(largest_restore, seq->restore_tokens);
    }
    if (largest_restore > block_tokens_) {
      restore_cap = largest_restore / 2 / block_tokens_ * block_tokens_;
      continue;
    }
    // Before a sequence is stopped as too big, the tier pages waiting sequences hold give way:
    // pinned, they filled the RAM tier, so a running sequence's pages had to go to slower tiers
    // and through the few staging buffers, and a sequence the budget holds alone was stopped.
    if ((admissions == 1 && running_.empty()) || (admissions == 0 && running_.size() == 1)) {
      if (ReleaseWaitingTierPages(/*ram_only=*/false)) continue;
    }
    if (admissions == 1 && running_.empty()) {
      // Alone in an empty pool and still too big: it can never run.
      FinishTooBig(*waiting_.front(), /*prompt_only=*/true);
      ReleaseFinished();
      max_admissions = waiting_.size();
      continue;
    }
    if (admissions > 0) {
      max_admissions = admissions - 1;
      continue;
    }
    if (running_.size() > 1) {
      PreemptAt(running_.size() - 1);
      max_admissions = 0;
      continue;
    }
    // One sequence alone does not fit the whole pool: it can never run.
    FinishTooBig(*running_.front(), /*prompt_only=*/false);
    ReleaseFinished();
    max_admissions = waiting_.size();
  }
}

bool Scheduler::RamTierFull() const {
  for (const KvTier* tier : memory_.tiers()) {
    if (tier->kind() != TierKind::kRam) continue;
    const TierStats stats = tier->stats();
    return stats.bytes_used + kv_.options().layout.kv_bytes() > stats.capacity_bytes;
  }
  return false;
}

bool Scheduler::ReleaseWaitingTierPages(bool ram_only) {
  bool released = false;
  for (const std::unique_ptr<Sequence>& seq : waiting_) {
    const bool holds = std::any_of(
        seq->kv_pages.pages.begin(), seq->kv_pages.pages.end(), [ram_only](const KvPage& page) {
          return (page.fate == KvPageFate::kInTier || page.fate == KvPageFate::kCheckpointed) &&
                 (!ram_only || page.tier->kind() == TierKind::kRam);
        });
    if (!holds) continue;
    pager_.ForgetPreemptedPages(seq->kv_pages);
    // Asking the store again at once would pin the same RAM pages again, step after step: the
    // sequence computes what the prefix cache lacks instead. The last resort (a sequence about
    // to be stopped) lets it ask again.
    seq->store_checked = ram_only;
    released = true;
  }
  return released;
}

void Scheduler::FinishTooBig(Sequence& seq, bool prompt_only) {
  // What the budget holds, and why the pages that could have left the pool did not.
  std::string holds = fmt::format("{} blocks of {} tokens", kv_.num_blocks(), block_tokens_);
  const int64_t staging_bytes = pager_.stats().staging_bytes;
  if (staging_bytes > 0) {
    holds += fmt::format(" in the pool, and {:.1f} KiB of buffers for pages leaving it",
                         static_cast<double>(staging_bytes) / 1024.0);
    if (pager_.staging_capacity_pages() > 0) {
      holds += fmt::format(" ({} pages streamed from tiers at once)",
                           pager_.staging_capacity_pages());
    }
  }
  std::string hint;
  if (!prompt_only && !planner_.rules().pages_running_sequences) {
    hint = ", or let its pages move: --kv-policy auto with --kv-tier ram:SIZE (lossless) or "
           "with --kv-quality balanced";
  } else if (!prompt_only && pager_.staging_capacity_pages() > 0 &&
             pager_.staged_pages_held() >= pager_.staging_capacity_pages()) {
    hint = fmt::format(
        "; its {} pages streamed from tiers fill the staging reserved for them (raise "
        "--kv-stream-reserve, or let pages be compressed: --kv-quality balanced)",
        pager_.staged_pages_held());
  } else if (!prompt_only) {
    hint = "; the attention sinks, the recent window and the page being written stay in the "
           "pool (--kv-sink, --kv-recent)";
  }
  if (!pager_.last_tier_error().ok()) {
    hint += "; the last page that could not go to a tier: " + pager_.last_tier_error().message();
  }
  const std::string why =
      fmt::format("the KV budget ({}) cannot hold {} of {} tokens; raise --kv-budget{}", holds,
                  prompt_only ? "a prompt" : "a sequence", seq.tokens.size(), hint);
  if (!prompt_only && seq.num_generated > 0) {
    // It ran as far as the budget goes: the text so far is the answer, cut as max_tokens would
    // cut it, never thrown away as a late error.
    fmt::print(stderr, "kvl: request {} stopped at {} tokens (finish reason length): {}\n", seq.id,
               seq.tokens.size(), why);
    Finish(seq, "length");
    return;
  }
  Finish(seq, "error", ResourceExhaustedError(why));
}

void Scheduler::CountAppliedActions(const KvPagePlan& plan) {
  const int64_t bytes = kv_.options().layout.kv_bytes();
  for (const KvPageAction& a : plan.actions) {
    if (!a.applied) continue;
    metrics_.CountPageAction(a.action, bytes);
    if (IsLossless(a.action)) continue;
    // Per request too, so a caller can see whose pages lost precision (TokenEvent).
    for (const auto& seq : running_) {
      if (seq->slot == a.seq) ++seq->kv_lossy_pages;
    }
  }
}

void Scheduler::TraceLeaving(const KvPagePlan& plan, KvTraceCause cause, RequestId request) {
  for (const KvPageAction& a : plan.actions) {
    if (cause == KvTraceCause::kRelief && !a.applied) continue;
    RequestId owner = request;
    if (owner < 0) {
      for (const KvPlannedSeq& s : planned_running_) {
        if (s.slot == a.seq) owner = s.request_id;
      }
    }
    // A preempted page another sequence shares stays in the pool for that one.
    const std::vector<BlockId>& table = kv_.block_table(a.seq);
    const size_t b = static_cast<size_t>(a.block_index);
    if (b < table.size() && table[b] != kNoBlock && kv_.refcount(table[b]) > 1) continue;
    trace_->Leave(owner, a.block_index,
                  static_cast<int>(a.applied ? a.action : KvAction::kRecomputeTokens), cause,
                  a.predicted_ms);
  }
}

int64_t Scheduler::StepsLeft(const Sequence& seq) const {
  return options_.context_length > 0 ? seq.MaxStepsLeft(options_.context_length) : -1;
}

bool Scheduler::RelievePressure(int64_t blocks_short, Phase phase) {
  planned_running_.clear();
  for (auto& seq : running_) {
    if (seq->slot >= 0 && kv_.Contains(seq->slot)) {
      planned_running_.push_back({seq->slot, seq->id, StepsLeft(*seq), seq->kv_quality});
    }
  }
  steps_since_pressure_ = 0;
  planner_.PlanRelief(planned_running_, blocks_short, phase, &page_plan_);
  const int64_t applied = pager_.Apply(page_plan_);
  planner_.NoteFailedActions(page_plan_);  // planned again, a failed page takes another action
  if (applied > 0 || std::any_of(page_plan_.actions.begin(), page_plan_.actions.end(),
                                 [](const KvPageAction& a) { return a.failed; })) {
    CountAppliedActions(page_plan_);
    if (trace_ != nullptr) TraceLeaving(page_plan_, KvTraceCause::kRelief, -1);
    return true;
  }
  // Nothing resident could go: compressed pages are evicted, the last resort.
  planner_.PlanCompressedEviction(planned_running_, blocks_short, &page_plan_);
  if (pager_.Apply(page_plan_) == 0) return false;
  CountAppliedActions(page_plan_);
  if (trace_ != nullptr) TraceLeaving(page_plan_, KvTraceCause::kRelief, -1);
  if (planner_.rules().explain) {
    for (const KvPageAction& a : page_plan_.actions) {
      if (!a.applied) continue;
      const auto owner = std::find_if(planned_running_.begin(), planned_running_.end(),
                                      [&a](const KvPlannedSeq& s) { return s.slot == a.seq; });
      fmt::print(stderr,
                 "kvl: explain: request {} compressed page {} -> evict (the pool holds only "
                 "compressed pages)\n",
                 owner->request_id, a.block_index);
    }
  }
  return true;
}

void Scheduler::PlanPromotions(PromotionPlan* plan) {
  plan->pages.actions.clear();
  plan->requests.clear();
  const KvPagerStats pages = pager_.stats();
  if (!options_.promote_back || pages.streamed_pages + pages.rebuilt_pages == 0 ||
      !waiting_.empty() || steps_since_pressure_ <= kPromoteQuietSteps) {
    return;
  }
  planned_running_.clear();
  int64_t blocks_needed = 0;
  for (const auto& seq : running_) {
    if (seq->finished || seq->slot < 0 || !kv_.Contains(seq->slot)) continue;
    const int64_t steps_left = StepsLeft(*seq);
    planned_running_.push_back({seq->slot, seq->id, steps_left, seq->kv_quality});
    // What it adds within the next block_tokens steps: the tokens not in the pool yet (a
    // prompt's rest, the token just sampled), then one a step while it runs.
    const int64_t in_pool = kv_.num_tokens(seq->slot);
    const int64_t steps = steps_left >= 0 ? std::min(steps_left, block_tokens_) : block_tokens_;
    const int64_t to_add = static_cast<int64_t>(seq->tokens.size()) - in_pool + steps;
    blocks_needed += kv_.BlocksFor(in_pool + to_add) - kv_.BlocksFor(in_pool);
  }
  const int64_t margin = std::max<int64_t>(1, kv_.num_blocks() / kPromoteMarginPoolFraction);
  const int64_t spare = kv_.stats().blocks_free - blocks_needed - margin;
  planner_.PlanPromotion(planned_running_, spare, kMaxPromotionsPerStep, &plan->pages);
  for (const KvPageAction& a : plan->pages.actions) {
    for (const KvPlannedSeq& s : planned_running_) {
      if (s.slot == a.seq) plan->requests.push_back(s.request_id);
    }
  }
}

void Scheduler::PreemptAt(size_t running_index) {
  steps_since_pressure_ = 0;
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  planner_.PlanPreemption({seq->slot, seq->id, -1, seq->kv_quality}, seq->num_computed, phase_,
                          &page_plan_);
  pager_.Preempt(seq->slot, page_plan_);
  planner_.NoteFailedActions(page_plan_);
  const int64_t bytes = kv_.options().layout.kv_bytes();
  for (const KvPageAction& a : page_plan_.actions) {
    metrics_.CountPageAction(a.applied ? a.action : KvAction::kRecomputeTokens, bytes);
  }
  if (trace_ != nullptr) TraceLeaving(page_plan_, KvTraceCause::kPreempt, seq->id);
  kv_.Free(seq->slot);
  free_slots_.push_back(seq->slot);
  seq->slot = -1;
  seq->num_computed = 0;
  seq->restore_tokens = 0;
  seq->store_checked = false;
  ++seq->preemptions;
  waiting_.push_front(std::move(seq));
  metrics_.CountPreemption();
}

void Scheduler::Preempt(Sequence& seq) {
  for (size_t i = 0; i < running_.size(); ++i) {
    if (running_[i].get() == &seq) return PreemptAt(i);
  }
  KVL_CHECK_MSG(false, "preempting a sequence that is not running");
}

void Scheduler::ReleaseSlot(Sequence& seq) {
  memory_.Release(seq.slot);
  free_slots_.push_back(seq.slot);
  seq.slot = -1;
}

void Scheduler::Finish(Sequence& seq, const std::string& reason, Status error) {
  if (seq.finished) return;
  const bool completed =
      error.ok() && (reason == "eos" || reason == "stop" || reason == "length");
  const TokenEvent event = seq.FinishEvent(reason, std::move(error));
  if (seq.slot >= 0) {
    seq.parked = options_.keep_lossy_sessions && completed && kv_.Contains(seq.slot) &&
                 kv_.IsLossy(seq.slot);
    if (!seq.parked) ReleaseSlot(seq);
  } else {
    pager_.ForgetPreemptedPages(seq.kv_pages);  // a preempted request cancelled while waiting
  }
  if (seq.on_event) seq.on_event(event);
  metrics_.CountFinished();
}

void Scheduler::ReleaseFinished() {
  for (std::unique_ptr<Sequence>& seq : running_) {
    if (!seq->finished || !seq->parked) continue;
    seq->on_event = nullptr;  // its request is over: nothing is ever sent for it again
    parked_.push_back(std::move(seq));
  }
  auto done = [](const std::unique_ptr<Sequence>& s) { return s == nullptr || s->finished; };
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
}

}  // namespace kvl
