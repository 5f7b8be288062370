// Speculative decoding (issue 26): what one sequence carries between the speculator, which drafts
// before a step, the scheduler, which puts the draft into the step as extra rows, and the step
// runner, which verifies it. Kept apart from request.h so that the sequence gains one member.
#pragma once

#include <cstdint>
#include <vector>

namespace kvl {

struct SpecSequenceState {
  // The draft the speculator chose for the next step (tokens after the sequence's last one).
  std::vector<int32_t> draft;
  // The step's tokens when it carries the draft: the last token, then the draft (the span the
  // KV plan appends; reserved once, so a step allocates nothing).
  std::vector<int32_t> step_tokens;
  // Draft rows in the step being run (0: a plain step). Set by the scheduler as it plans the
  // step, cleared by the step runner once the draft is verified.
  int64_t in_step = 0;
  // Shadow drafting, for the acceptance rate: what the drafter proposed at the last step (all of
  // it, also where the cost model sent none) and where it starts in the sequence's tokens. The
  // tokens that really follow are compared with it at the next proposal, so the rate is known
  // whether or not speculation is on.
  std::vector<int32_t> shadow;
  int64_t shadow_at = -1;
  int32_t shadow_kind = 0;  // what it came from (kDraftKinds in spec_drafter.h)
  // The shadow draft being scored, until each of its tokens is known or one missed (a later
  // shadow waits: one draft at a time is scored, whole), and how many of its tokens were.
  std::vector<int32_t> pending;
  int64_t pending_at = -1;
  int64_t pending_scored = 0;
  int32_t pending_kind = 0;
  // Per-token acceptance of this sequence's drafts: draft tokens that matched / compared, decayed
  // so that the rate follows the text (a quoted passage ends, prose begins).
  double matched = 0;
  double compared = 0;
  // The last draft verified (StepRunner::VerifyDraft sets it, the next Propose reads it): its
  // length and how many of its tokens were accepted; and what the step's draft rows were
  // expected to cost, in this sequence's one-token steps (the speculator sets it as it sends).
  int64_t verified_drafted = 0;
  int64_t verified_accepted = 0;
  double sent_cost = 1;
  // The gate (speculator.cc): the tokens the sequence's sent drafts returned against what their
  // steps cost, in plain steps, decayed; while the drafts lose to plain decoding the sequence
  // sends nothing for `hold` steps, a hold that doubles at each loss in a row.
  double paid_tokens = 0;
  double paid_cost = 0;
  int64_t hold = 0;
  int64_t backoff = 1;
  // Whether the cost model declined the last draft it weighed, and the steps since the last
  // shadow draft while held or declined (speculator.cc: kHeldShadowEvery).
  bool declined = false;
  int64_t steps_since_shadow = 0;
  // A draft model's steps since it last drafted for this sequence, and how many steps apart its
  // probes are while the cost model sends nothing (speculator.cc: kProbeEvery, doubling).
  int64_t steps_since_draft = 0;
  int64_t probe_every = 16;
};

}  // namespace kvl
