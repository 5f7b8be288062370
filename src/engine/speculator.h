// Speculative decoding (issue 26): before each step the speculator asks the drafter what may
// follow each decoding sequence and lets the cost model (spec_cost.h) choose how many of those
// tokens the step carries as extra rows (Sequence::spec.draft); the scheduler plans them as
// unverified tokens and the step runner verifies them (step_runner_spec.cc). After each forward
// run it measures the step's cost by its rows.
//
// Where it lives: Engine::Impl owns it; Engine::Impl::StepImpl calls Propose before
// Scheduler::Schedule, StepRunner calls ObserveStep and Remember.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "request.h"
#include "spec_cost.h"
#include "spec_drafter.h"

namespace kvl {

struct SpecOptions {
  SpecMode mode = SpecMode::kNgram;
  int32_t draft_max = 8;          // draft tokens one sequence's step may carry
  int64_t context_length = 0;
  int64_t max_batch_tokens = 512;
  int32_t max_seqs = 16;
  bool force = false;             // every offered draft is sent (EngineOptions::spec_force)
};

class Speculator {
 public:
  // `drafter`: the draft-model drafter for SpecMode::kDraftModel (the engine loads it); the
  // other modes build their own (null).
  explicit Speculator(const SpecOptions& options, std::unique_ptr<Drafter> drafter = nullptr);

  // A new sequence's buffers, reserved once (the steps then allocate nothing).
  void Prepare(Sequence& seq) const;
  // Drafts for the running sequences that decode next step: seq.spec.draft, empty where the
  // drafter has nothing or the cost model says it does not pay.
  void Propose(std::span<const std::unique_ptr<Sequence>> running);
  // A step of `rows` rows took `ms`, drafting aside (from the schedule to its events: the
  // engine's own work per step is what speculation saves on a small model). Only a step of the
  // decoding sequences and their drafts, as the last Propose planned it, is measured: a step
  // that also admits a request or runs a prefill chunk costs what a draft's rows do not (an
  // admission's lookups, a prompt's attention), and one such step taken for a 2-row step's cost
  // would make every draft look too dear to send again (nothing sent, nothing measured).
  void ObserveStep(int64_t rows, double ms) {
    if (rows == planned_rows_) curve_.Observe(rows, ms);
  }
  // A request ended: its tokens are remembered by a drafter that drafts across requests, and
  // what a drafter keeps for its slot goes.
  void Remember(const Sequence& seq) {
    drafter_->Remember(seq.tokens);
    drafter_->Forget(seq.slot);
  }

  const SpecOptions& options() const { return options_; }
  const StepCostCurve& curve() const { return curve_; }
  // The rows a step's logits may need beyond one per sequence.
  int64_t max_draft_rows() const;

 private:
  // Compares the last shadow draft with the tokens that followed it: the acceptance rate.
  void ScoreShadow(Sequence& seq);
  // The gate: weighs the last draft the sequence sent by what it returned, and says whether
  // the sequence sends nothing this step (its drafts lost to plain decoding of late).
  bool Held(SpecSequenceState& s);
  // Whether a sequence that sends nothing this step (held by the gate, its last draft declined
  // by the cost model: `idle`; or a measuring step) drafts a shadow for its acceptance: not while
  // its last one is being scored, and while idle only every few steps.
  static bool ShadowDue(SpecSequenceState& s, bool idle);
  // What a draft of k tokens costs, in the sequence's plain steps, in a step of `base_rows`
  // rows that yields `base_tokens` tokens without drafts (the gate's yardstick).
  double SentCost(int64_t base_rows, int64_t base_tokens, int64_t k, double draft_cost) const;
  // The per-token acceptance expected of a draft of `kind` for this sequence: its own rate,
  // with the kind's engine-wide rate as the prior and beside it.
  double AcceptanceOf(const Sequence& seq, int32_t kind) const;
  // A costly drafter (a draft model): the tokens to ask it for per candidate, from the cost
  // model with the drafting's own cost, or a short probe now and then where it sends none (so
  // that the acceptance keeps being measured).
  void PlanCostlyDrafts(int64_t base_rows, int64_t base_tokens, int64_t room);
  // A lookup's likely draft that the cost model declined goes as a probe where its step's row
  // count is barely measured (speculator.cc: kProbeAcceptance).
  void ProbeUnmeasuredRows(int64_t base_rows, int64_t room);
  // A costly drafter's time per draft token relative to the curve's reference step (0 until
  // measured).
  double DraftCostRelative() const;
  // Whether a costly drafter's draft could pay at all (every token accepted) at its measured
  // cost: where it could not, no probe is worth its passes.
  bool CouldPay(int64_t base_rows, int64_t base_tokens, int64_t room);

  SpecOptions options_;
  std::unique_ptr<Drafter> drafter_;
  StepCostCurve curve_;
  // Engine-wide acceptance, decayed: the prior of a sequence with few drafts of its own.
  double matched_ = 0, compared_ = 0;
  // The same per draft kind (a long match is followed more often than a short one).
  double kind_matched_[kDraftKinds] = {};
  double kind_compared_[kDraftKinds] = {};
  int64_t steps_ = 0;  // Propose calls that had drafting candidates
  // The rows of the step the last Propose planned: one per decoding sequence and the drafts
  // sent; -1 where a prefill chunk shares it (ObserveStep).
  int64_t planned_rows_ = -1;
  std::vector<SpecCandidate> perfect_;   // CouldPay's one candidate, reused
  std::vector<SpecCandidate> candidates_;  // reused
  std::vector<SpecCandidate*> order_;      // reused
  std::vector<Sequence*> drafting_;        // reused
  std::vector<uint8_t> held_;              // reused: per drafting_, held by the gate
  std::vector<int64_t> asked_;             // reused: per drafting_, the tokens it may draft
  std::vector<DraftRequest> requests_;     // reused
};

}  // namespace kvl
