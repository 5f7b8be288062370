#include "scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace kvl {

Scheduler::Scheduler(const SchedulerOptions& options, KvMemory& memory, MetricsRecorder& metrics)
    : options_(options),
      memory_(memory),
      kv_(memory.view()),
      metrics_(metrics),
      block_tokens_(memory.view().layout().block_tokens) {
  for (SeqId s = options.max_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
  running_.reserve(static_cast<size_t>(options.max_seqs));
  planned_running_.reserve(static_cast<size_t>(options.max_seqs));
}

void Scheduler::Enqueue(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

void Scheduler::Cancel(const std::unordered_set<RequestId>& ids) {
  for (auto& seq : running_) {
    if (ids.count(seq->id)) Finish(*seq, FinishReason::kCancelled);
  }
  for (auto& seq : waiting_) {
    if (ids.count(seq->id)) Finish(*seq, FinishReason::kCancelled);
  }
}

bool Scheduler::RestoresAhead(const Sequence& seq, int64_t from) const {
  return RestorableTokens(seq, from, std::numeric_limits<int64_t>::max()) > 0;
}

int64_t Scheduler::RestorableTokens(const Sequence& seq, int64_t from, int64_t cap) const {
  return kv_.RestorableTokens(seq.kv_pages, static_cast<int64_t>(seq.tokens.size()), from, cap);
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
      // (A decode has no whole page ahead of its one token: nothing can be restored there.)
      const int64_t n =
          !decode_pass && RestoresAhead(*seq, seq->num_computed + restore)
              ? 0
              : std::min({remaining - restore, budget, decode_pass ? remaining : prefill_cap});
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
      plan->steps.push_back(
          {seq->slot,
           std::span<const int32_t>(seq->tokens)
               .subspan(static_cast<size_t>(seq->num_computed), static_cast<size_t>(restore + n)),
           0, 0, restore});
      plan->seqs.push_back(seq.get());
      budget -= n;
    }
  }
  size_t admissions = 0;
  const size_t first_admission = plan->steps.size();
  for (auto& seq : waiting_) {
    if (budget == 0 || admissions == max_admissions) break;
    if (running_.size() + admissions >= static_cast<size_t>(options_.max_seqs)) break;
    if (admissions >= free_slots_.size()) break;  // the other slots hold parked sessions
    // A request that shares pages with one admitted in this step beyond what the pool holds
    // waits a step: it then finds them cached, where admitted now it would compute them again
    // in blocks of its own (three requests on a lost opening computed it three times).
    if (kv_.SharesPagesComputedInStep(seq->tokens,
                                          std::span(plan->steps).subspan(first_admission))) {
      break;
    }
    const int64_t len = static_cast<int64_t>(seq->tokens.size());
    // The pool's prefix, the store's pages read in place, then pages kept at a preemption or
    // found in the store, promoted instead of computed (the store is asked once per admission).
    const KvAdmission a =
        memory_.PlanAdmission(seq->tokens, &seq->kv_pages, !seq->store_checked, restore_cap);
    seq->store_checked = true;
    const int64_t attached = a.cached_tokens + a.in_place_blocks * block_tokens_;
    const int64_t restore = a.restore_tokens;
    seq->spec.in_step = 0;  // speculative decoding: an admission carries no draft
    const int64_t n = RestoresAhead(*seq, attached + restore)
                          ? 0
                          : std::min({len - attached - restore, budget, prefill_cap});
    const SeqId slot = free_slots_[free_slots_.size() - 1 - admissions];
    plan->steps.push_back(
        {slot,
         std::span<const int32_t>(seq->tokens).first(static_cast<size_t>(attached + restore + n)),
         a.in_place_blocks, 0, restore});
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
    seq.slot = session.slot;
    seq.kv_pages = std::move(session.kv_pages);
    memory_.HandOverSession(seq.slot, best_tokens, &seq.kv_pages);
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
  memory_.StartStep();
  AdoptParkedSessions();
  size_t max_admissions = waiting_.size();
  // Prefill chunks shrink when a sequence pages through a pool smaller than one chunk.
  int64_t prefill_cap = options_.max_batch_tokens;
  int64_t restore_cap = std::numeric_limits<int64_t>::max();
  // Waiting sequences' tier pages are let go as a last resort before a sequence is stopped as
  // too big at most twice a call: first they may ask the store again (pages freed elsewhere may
  // let them in), then they compute instead. Letting them ask again without a bound pinned the
  // same store pages on every pass, and one Schedule call never returned (issue 37).
  int last_resort_releases = 0;
  last_schedule_passes_ = 0;
  for (;;) {
    ++last_schedule_passes_;
    if (Interrupted()) {
      // A cancellation or a stop is waiting: the step loop takes it before planning again.
      plan->steps.clear();
      plan->seqs.clear();
      return false;
    }
    const size_t admissions = FillSteps(max_admissions, prefill_cap, restore_cap, plan);
    if (plan->steps.empty()) return false;
    // Recompute is priced against the step's own arithmetic: busy in prefill, idle in decode.
    phase_ = Phase::kDecode;
    for (const KvSeqStep& step : plan->steps) {
      // (A decode carrying a draft is still a decode: speculative decoding, issue 26.)
      if (static_cast<int64_t>(step.tokens.size()) - step.unverified > 1) phase_ = Phase::kPrefill;
    }
    plan->phase = phase_;
    memory_.PlanStep(plan->steps, &plan->kv);  // reuses the plan's vectors: no allocation per step
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
    if (admissions == 0 && RamTierFull() &&
        ReleaseWaitingTierPages(/*ram_only=*/true, /*ask_store_again=*/false) > 0) {
      continue;
    }
    if (RelievePressure(blocks_short, phase_)) continue;
    if (kv_.pages_running_sequences() && prefill_cap > block_tokens_) {
      prefill_cap = std::max<int64_t>(block_tokens_, prefill_cap / 2);
      continue;
    }
    // Restores larger than the pool go in chunks (computing nothing until the last one, so no
    // page the store holds is computed instead), the pool paging older pages out in between.
    int64_t largest_restore = 0;
    for (const KvSeqStep& step : plan->steps) {
      largest_restore = std::max(largest_restore, step.restore_tokens);
    }
    if (largest_restore > block_tokens_) {
      restore_cap = largest_restore / 2 / block_tokens_ * block_tokens_;
      continue;
    }
    // Before a sequence is stopped as too big, the tier pages waiting sequences hold give way:
    // pinned, they filled the RAM tier, so a running sequence's pages had to go to slower tiers
    // and through the few staging buffers, and a sequence the budget holds alone was stopped.
    if (last_resort_releases < 2 &&
        ((admissions == 1 && running_.empty()) || (admissions == 0 && running_.size() == 1))) {
      const bool ask_store_again = last_resort_releases == 0;
      if (ReleaseWaitingTierPages(/*ram_only=*/false, ask_store_again) > 0) {
        ++last_resort_releases;
        continue;
      }
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
  for (const KvTier* tier : kv_.tiers()) {
    if (tier->kind() != TierKind::kRam) continue;
    const TierStats stats = tier->stats();
    return stats.bytes_used + kv_.layout().kv_bytes() > stats.capacity_bytes;
  }
  return false;
}

int64_t Scheduler::ReleaseWaitingTierPages(bool ram_only, bool ask_store_again) {
  int64_t released = 0;
  for (const std::unique_ptr<Sequence>& seq : waiting_) {
    int64_t held = 0;
    bool holds_wanted = false;
    for (const KvPage& page : seq->kv_pages.pages) {
      if (page.fate != KvPageFate::kInTier && page.fate != KvPageFate::kCheckpointed) continue;
      ++held;
      holds_wanted = holds_wanted || !ram_only || page.tier->kind() == TierKind::kRam;
    }
    if (!holds_wanted) continue;
    memory_.ReleaseWaiting(seq->kv_pages);
    // Asking the store again at once would pin the same RAM pages again, step after step: the
    // sequence computes what the prefix cache lacks instead, unless the caller lets it ask.
    seq->store_checked = !ask_store_again;
    released += held;
  }
  return released;
}

void Scheduler::FinishTooBig(Sequence& seq, bool prompt_only) {
  const std::string why = kv_.WhyTooBig(prompt_only, static_cast<int64_t>(seq.tokens.size()));
  if (!prompt_only && seq.num_generated > 0) {
    // It ran as far as the budget goes: the text so far is the answer, never thrown away as a
    // late error; its finish reason says the KV budget cut it, not max_tokens.
    fmt::print(stderr, "kvl: request {} stopped at {} tokens (finish reason kv_pressure): {}\n",
               seq.id, seq.tokens.size(), why);
    Finish(seq, FinishReason::kKvPressure);
    return;
  }
  Finish(seq, FinishReason::kError, ResourceExhaustedError(why));
}

void Scheduler::CountAppliedActions(const KvPagePlan& plan) {
  const int64_t bytes = kv_.layout().kv_bytes();
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
  const KvPagePlan* relief = memory_.Relieve(planned_running_, blocks_short, phase);
  if (relief == nullptr) return false;
  CountAppliedActions(*relief);
  return true;
}

bool Scheduler::PromoteBack(KvApplied* out) {
  // Not while requests wait: the blocks are theirs first.
  if (!options_.promote_back || !waiting_.empty()) return false;
  planned_running_.clear();
  for (const auto& seq : running_) {
    if (seq->finished || seq->slot < 0) continue;
    KvPlannedSeq planned{seq->slot, seq->id, StepsLeft(*seq), seq->kv_quality};
    planned.known_tokens = static_cast<int64_t>(seq->tokens.size());
    planned_running_.push_back(planned);
  }
  return memory_.Promote(planned_running_, out) > 0;
}

void Scheduler::PreemptAt(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  const KvPagePlan& plan =
      memory_.Preempt({seq->slot, seq->id, -1, seq->kv_quality}, seq->num_computed, phase_);
  const int64_t bytes = kv_.layout().kv_bytes();
  for (const KvPageAction& a : plan.actions) {
    metrics_.CountPageAction(a.applied ? a.action : KvAction::kRecomputeTokens, bytes);
  }
  free_slots_.push_back(seq->slot);
  seq->slot = -1;
  seq->num_computed = 0;
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

void Scheduler::Finish(Sequence& seq, FinishReason reason, Status error) {
  if (seq.finished) return;
  const bool completed = error.ok() && Completed(reason);
  const TokenEvent event = seq.FinishEvent(reason, std::move(error));
  if (seq.slot >= 0) {
    seq.parked = options_.keep_lossy_sessions && completed && kv_.Contains(seq.slot) &&
                 kv_.IsLossy(seq.slot);
    if (!seq.parked) ReleaseSlot(seq);
  } else {
    memory_.ReleaseWaiting(seq.kv_pages);  // a preempted request cancelled while waiting
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
