#include "speculator.h"

#include <algorithm>

namespace kvl {
namespace {

// Per-sequence and engine-wide counts decay by this per compared token: the rate follows the
// text (a quoted passage ends, prose begins) within a few dozen tokens.
constexpr double kAcceptDecay = 0.97;
// The engine-wide rate weighs as this many compared tokens of a sequence's own.
constexpr double kPriorTokens = 4;
// Before anything was compared at all: optimistic, so that drafts are tried and measured.
constexpr double kFirstPrior = 0.6;
// A costly drafter (a draft model) that the cost model keeps off drafts a probe of this many
// tokens, as a shadow, kProbeEvery steps after its last draft, then twice as far apart each time
// (up to kMaxProbeEvery) while the cost model keeps sending nothing: the acceptance stays
// measured, so drafting comes back where the text turns predictable, and a draft model that does
// not pay costs a probe's passes (its catch-up and one token) every few hundred steps.
constexpr int64_t kProbeEvery = 16;
constexpr int64_t kMaxProbeEvery = 512;
constexpr int64_t kProbeTokens = 2;
// Every this many steps, and while the step's rows without drafts were not measured, a step goes
// without drafts: the cost of a draft's rows is only known against the step without them (a
// sequence whose drafts are always taken would otherwise never measure it again).
constexpr int64_t kMeasureEvery = 32;

// The gate: a sequence's sent drafts are weighed by what they returned (tokens) against what
// their steps cost (in plain steps), each decayed by this per verified draft, so the last few
// drafts decide. While they return less than plain decoding would have, the sequence sends
// nothing for a hold of 1, 2, 4, ... steps (up to kMaxHold); a paying draft ends the doubling.
// A lookup's shadow drafts go on being scored meanwhile, so a hold costs no measurement.
constexpr double kPaidDecay = 0.8;
constexpr int64_t kMaxHold = 256;
// A sequence held by the gate, or whose last draft the cost model declined, drafts a shadow (for
// its acceptance, and to find a draft worth sending) once in this many steps, and none while the
// last one is still being scored: on a model whose step is a fraction of a millisecond (open
// prose on stories260K) a lookup every step would show in what a held-back run costs.
constexpr int64_t kHeldShadowEvery = 4;

// A lookup's draft that the cost model declines although its acceptance is at least this, and
// whose step's row count was measured fewer than kProbeMeasurements times, is sent anyway, as a
// probe: a step's cost measured once, on a stalled step, would otherwise price every such draft
// out for good (what is never sent is never measured again); near-certain drafts lose little if
// the curve was right.
constexpr double kProbeAcceptance = 0.9;
constexpr double kProbeMeasurements = 3;

std::unique_ptr<Drafter> MakeLookupDrafter(SpecMode mode) {
  if (mode == SpecMode::kSuffix || mode == SpecMode::kAuto) {
    return std::make_unique<SuffixDrafter>();
  }
  return std::make_unique<NgramDrafter>();
}

}  // namespace

Speculator::Speculator(const SpecOptions& options, std::unique_ptr<Drafter> drafter)
    : options_(options),
      drafter_(drafter != nullptr ? std::move(drafter) : MakeLookupDrafter(options.mode)),
      curve_(options.max_batch_tokens) {
  candidates_.reserve(static_cast<size_t>(options.max_seqs));
  order_.reserve(static_cast<size_t>(options.max_seqs));
  drafting_.reserve(static_cast<size_t>(options.max_seqs));
  requests_.reserve(static_cast<size_t>(options.max_seqs));
  held_.reserve(static_cast<size_t>(options.max_seqs));
  asked_.reserve(static_cast<size_t>(options.max_seqs));
  perfect_.reserve(1);
}

double Speculator::DraftCostRelative() const {
  const double reference = curve_.reference_ms();
  return reference > 0 ? drafter_->pass_ms() / reference : 0.0;
}

bool Speculator::CouldPay(int64_t base_rows, int64_t base_tokens, int64_t room) {
  if (drafter_->pass_ms() <= 0) return true;  // its cost is not known yet
  perfect_.assign(1, SpecCandidate{options_.draft_max, 1.0, 0});
  ChooseDraftLengths(curve_, base_rows, base_tokens, room, perfect_, &order_,
                     DraftCostRelative());
  return perfect_[0].chosen > 0;
}

void Speculator::PlanCostlyDrafts(int64_t base_rows, int64_t base_tokens, int64_t room) {
  if (options_.force) {
    for (SpecCandidate& c : candidates_) c.chosen = c.offered;
    return;
  }
  ChooseDraftLengths(curve_, base_rows, base_tokens, room, candidates_, &order_,
                     DraftCostRelative());
}

int64_t Speculator::max_draft_rows() const {
  return options_.mode == SpecMode::kOff ? 0 : int64_t{options_.max_seqs} * options_.draft_max;
}

void Speculator::Prepare(Sequence& seq) const {
  if (options_.mode == SpecMode::kOff) return;
  const size_t n = static_cast<size_t>(options_.draft_max) + 1;
  seq.spec.draft.reserve(n);
  seq.spec.step_tokens.reserve(n);
  seq.spec.shadow.reserve(n);
  seq.spec.pending.reserve(n);
}

void Speculator::ScoreShadow(Sequence& seq) {
  SpecSequenceState& s = seq.spec;
  // The draft being scored stays until each of its tokens is known or one missed: a plain step
  // makes one token known, and scoring only that would measure the first token's acceptance,
  // above a long draft's (the tokens further on follow less often).
  if (s.pending.empty() && s.shadow_at >= 0 && !s.shadow.empty()) {
    s.pending.swap(s.shadow);
    s.pending_at = s.shadow_at;
    s.pending_scored = 0;
    s.pending_kind = s.shadow_kind;
  }
  s.shadow.clear();
  s.shadow_at = -1;
  if (s.pending.empty()) return;
  const int64_t known = std::min(static_cast<int64_t>(seq.tokens.size()) - s.pending_at,
                                 static_cast<int64_t>(s.pending.size()));
  bool resolved = known == static_cast<int64_t>(s.pending.size());
  for (int64_t i = s.pending_scored; i < known; ++i) {
    const bool hit =
        seq.tokens[static_cast<size_t>(s.pending_at + i)] == s.pending[static_cast<size_t>(i)];
    s.matched = s.matched * kAcceptDecay + (hit ? 1.0 : 0.0);
    s.compared = s.compared * kAcceptDecay + 1;
    matched_ = matched_ * kAcceptDecay + (hit ? 1.0 : 0.0);
    compared_ = compared_ * kAcceptDecay + 1;
    const auto k = static_cast<size_t>(s.pending_kind);
    kind_matched_[k] = kind_matched_[k] * kAcceptDecay + (hit ? 1.0 : 0.0);
    kind_compared_[k] = kind_compared_[k] * kAcceptDecay + 1;
    if (!hit) {
      resolved = true;
      break;
    }
  }
  s.pending_scored = known;
  if (resolved) {
    s.pending.clear();
    s.pending_at = -1;
  }
}

void Speculator::ProbeUnmeasuredRows(int64_t base_rows, int64_t room) {
  for (SpecCandidate& c : candidates_) {
    if (c.chosen > 0 || c.offered == 0 || c.offered > room || c.acceptance < kProbeAcceptance) {
      continue;
    }
    if (curve_.measurements(base_rows + c.offered) >= kProbeMeasurements) continue;
    c.chosen = c.offered;
    return;  // one probe a step
  }
}

bool Speculator::ShadowDue(SpecSequenceState& s, bool idle) {
  // The shadow drafted while an earlier one is still being scored would be thrown away
  // (ScoreShadow scores one draft at a time, whole).
  if (!s.pending.empty()) return false;
  if (!idle) return true;
  if (++s.steps_since_shadow < kHeldShadowEvery) return false;
  s.steps_since_shadow = 0;
  return true;
}

bool Speculator::Held(SpecSequenceState& s) {
  if (s.verified_drafted > 0) {
    s.paid_tokens = s.paid_tokens * kPaidDecay + 1.0 + static_cast<double>(s.verified_accepted);
    s.paid_cost = s.paid_cost * kPaidDecay + s.sent_cost;
    s.verified_drafted = 0;
    if (s.paid_tokens < s.paid_cost) {
      s.hold = s.backoff;
      s.backoff = std::min(2 * s.backoff, kMaxHold);
    } else {
      s.backoff = 1;
    }
  }
  if (s.hold == 0) return false;
  --s.hold;
  return true;
}

double Speculator::SentCost(int64_t base_rows, int64_t base_tokens, int64_t k,
                            double draft_cost) const {
  // This sequence's token in a plain step costs R(base) / base_tokens; its draft adds its rows'
  // share of the step and the drafting.
  const double base = curve_.Relative(base_rows);
  const double extra = std::max(0.0, curve_.Relative(base_rows + k) - base) +
                       draft_cost * static_cast<double>(k);
  return 1.0 + static_cast<double>(std::max<int64_t>(base_tokens, 1)) * extra / base;
}

double Speculator::AcceptanceOf(const Sequence& seq, int32_t kind) const {
  const double engine = compared_ > 0 ? matched_ / compared_ : kFirstPrior;
  const auto k = static_cast<size_t>(kind);
  const double of_kind =
      (kind_matched_[k] + kPriorTokens * engine) / (kind_compared_[k] + kPriorTokens);
  const double own =
      (seq.spec.matched + kPriorTokens * of_kind) / (seq.spec.compared + kPriorTokens);
  // The sequence's own rate says how well its text is predicted now (a quote ends, prose
  // begins); the kind's says how far this draft's match is to be trusted.
  return 0.5 * (own + of_kind);
}

void Speculator::Propose(std::span<const std::unique_ptr<Sequence>> running) {
  if (options_.mode == SpecMode::kOff) return;
  candidates_.clear();
  drafting_.clear();
  held_.clear();
  asked_.clear();
  int64_t base_rows = 0, base_tokens = 0;
  bool prefill = false;
  for (const std::unique_ptr<Sequence>& ptr : running) {
    Sequence& seq = *ptr;
    seq.spec.draft.clear();
    const int64_t len = static_cast<int64_t>(seq.tokens.size());
    const int64_t remaining = len - seq.num_computed;
    if (remaining > 1) {
      base_rows += remaining;  // a prefill chunk shares the step (at most the budget)
      prefill = true;
      continue;
    }
    if (remaining != 1 || seq.finished) continue;
    ++base_rows;
    ++base_tokens;
    ScoreShadow(seq);
    // No draft past the context or the tokens the request may still generate.
    int64_t limit = std::min<int64_t>(options_.draft_max, options_.context_length - len - 1);
    if (seq.request.max_new_tokens >= 0) {
      limit = std::min<int64_t>(limit, seq.request.max_new_tokens - seq.num_generated - 1);
    }
    if (limit <= 0) continue;
    // (The candidate offers the limit for now: a costly drafter is asked for what the cost
    // model would send of it; a lookup offers what it finds. A sequence the gate holds offers
    // nothing, yet drafts a shadow now and then, so that its acceptance stays measured.)
    const bool held = !options_.force && Held(seq.spec);
    held_.push_back(held);
    candidates_.push_back({held ? 0 : limit, held ? 0.0 : AcceptanceOf(seq, 0), 0});
    asked_.push_back(limit);
    drafting_.push_back(&seq);
  }
  planned_rows_ = prefill ? -1 : base_rows;  // the drafts sent are added below
  if (candidates_.empty()) return;
  base_rows = std::min(base_rows, options_.max_batch_tokens);
  const int64_t room = std::min(max_draft_rows(), options_.max_batch_tokens - base_rows);
  const bool costly = drafter_->costly();
  // A measuring step sends no drafts (a lookup's shadow draft still scores the acceptance).
  const bool measuring =
      !options_.force && (++steps_ % kMeasureEvery == 0 || !curve_.measured(base_rows));
  if (measuring && costly) return;  // (and the draft model does not run)
  if (costly) PlanCostlyDrafts(base_rows, base_tokens, room);

  requests_.clear();
  for (size_t i = 0; i < drafting_.size(); ++i) {
    Sequence& seq = *drafting_[i];
    int64_t ask = asked_[i];
    if (costly) {
      SpecSequenceState& s = seq.spec;
      ask = candidates_[i].chosen;
      if (ask > 0) {
        s.probe_every = kProbeEvery;
      } else if (++s.steps_since_draft >= s.probe_every &&
                 CouldPay(base_rows, base_tokens, room)) {
        ask = std::min(kProbeTokens, asked_[i]);
        s.probe_every = std::min(2 * s.probe_every, kMaxProbeEvery);
      }
      if (ask > 0) s.steps_since_draft = 0;
    } else if ((held_[i] || measuring || seq.spec.declined) &&
               !ShadowDue(seq.spec, held_[i] || seq.spec.declined)) {
      ask = 0;  // nothing to send, and no shadow wanted: the step does no drafter work
    }
    if (ask > 0) {
      requests_.push_back({seq.slot, seq.tokens, static_cast<int32_t>(ask), &seq.spec.shadow,
                           &seq.spec.shadow_kind});
    }
  }
  if (requests_.empty()) return;
  drafter_->DraftAll(requests_);

  for (size_t i = 0; i < drafting_.size(); ++i) {
    Sequence& seq = *drafting_[i];
    SpecCandidate& c = candidates_[i];
    const auto offered = static_cast<int64_t>(seq.spec.shadow.size());
    if (offered > 0) seq.spec.shadow_at = static_cast<int64_t>(seq.tokens.size());
    c.offered = held_[i] ? 0 : offered;
    c.chosen = std::min(c.chosen, c.offered);  // a costly drafter's plan (a probe sends nothing)
    if (!costly && offered > 0) c.acceptance = AcceptanceOf(seq, seq.spec.shadow_kind);
  }
  if (std::all_of(candidates_.begin(), candidates_.end(),
                  [](const SpecCandidate& c) { return c.offered == 0; })) {
    return;  // shadows only: nothing for the cost model to weigh
  }
  if (options_.force) {
    int64_t left = room;
    for (SpecCandidate& c : candidates_) {
      c.chosen = std::min(c.offered, left);
      left -= c.chosen;
    }
  } else if (measuring) {
    for (SpecCandidate& c : candidates_) c.chosen = 0;
  } else if (!costly) {
    ChooseDraftLengths(curve_, base_rows, base_tokens, room, candidates_, &order_);
    ProbeUnmeasuredRows(base_rows, room);
  }
  const double draft_cost = costly ? DraftCostRelative() : 0.0;
  for (size_t i = 0; i < drafting_.size(); ++i) {
    SpecSequenceState& s = drafting_[i]->spec;
    const auto k = static_cast<ptrdiff_t>(candidates_[i].chosen);
    // A draft the cost model would not send: the next ones are drafted as shadows only, now
    // and then, until one is worth sending (prose pays for no lookup at every step).
    if (!costly && !measuring && candidates_[i].offered > 0) s.declined = k == 0;
    if (k == 0) continue;
    if (planned_rows_ > 0) planned_rows_ += k;
    s.sent_cost = SentCost(base_rows, base_tokens, k, draft_cost);
    s.draft.assign(s.shadow.begin(), s.shadow.begin() + k);
    s.step_tokens.clear();
    s.step_tokens.push_back(drafting_[i]->tokens.back());
    s.step_tokens.insert(s.step_tokens.end(), s.draft.begin(), s.draft.end());
  }
}

}  // namespace kvl
