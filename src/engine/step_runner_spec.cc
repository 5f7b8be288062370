// Speculative decoding (issue 26): the step runner's verification of a draft. The sequence's
// step ran its last token and its k draft tokens as rows at positions P..P+k; row i holds the
// logits of the token after position P+i. Each row is sampled in order by the sequence's own
// sampler, with the history plain decoding would have had, and the draft is followed as long as
// the sampled token is the draft's: the sampled tokens are exactly the ones plain decoding
// would have produced (the kernels are batch-invariant, so a row's logits are bit-identical to
// a one-row step's, and the sampler draws once per token in the same order).
//
// For a sampled request this is the speculative-sampling rule with a deterministic drafter
// (q one-hot on the draft token d): accept d with probability min(1, p(d) / q(d)) = p(d), and on
// rejection draw from norm(max(0, p - q)), p without d; drawing t ~ p and accepting iff t == d
// gives P(d) = p(d) and P(x) = p(x) for every other x, the same distribution, with one draw per
// emitted token, so a fixed seed even gives plain decoding's tokens.
#include <algorithm>

#include "constrained_sampling.h"
#include "step_runner.h"

namespace kvl {

int64_t StepRunner::VerifyDraft(Sequence& seq, int64_t row) {
  SpecSequenceState& spec = seq.spec;
  const int64_t drafted = spec.in_step;
  const int64_t rows = drafted + 1;
  spec.in_step = 0;
  const int64_t last_position = seq.num_computed - rows;  // the token before the draft
  if (seq.stream_failed) {
    // The step is thrown away (RecomputeFailedStreams preempts the sequence): the draft too.
    // (The last token's row stays, as a plain step's would: the sequence is recomputed whole.)
    seq.num_computed = last_position + 1;
    step_->TruncateTail(seq.slot, seq.num_computed);
    spec.draft.clear();
    return row + rows;
  }
  // Sample row by row while the rows agree with the draft; the draft's tokens stand in the
  // history meanwhile (the repetition penalty sees what plain decoding would have seen).
  verified_tokens_.clear();
  verified_logits_.clear();
  for (int64_t i = 0; i < rows; ++i) {
    const float* logits = p_.forward->logits(row + i);
    const int32_t token = SampleNextToken(seq, logits);  // -1: a grammar's dead end
    verified_tokens_.push_back(token);
    verified_logits_.push_back(logits);
    if (i == drafted || token != spec.draft[static_cast<size_t>(i)]) break;
    seq.tokens.push_back(token);
  }
  const auto accepted = static_cast<int64_t>(verified_tokens_.size()) - 1;
  seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(accepted));
  // The K/V of the last token and the accepted draft tokens is kept; the rejected rows' is cut
  // before anything can see it (a finishing sequence's pages go to the store at once).
  seq.num_computed = last_position + 1 + accepted;
  step_->TruncateTail(seq.slot, seq.num_computed);
  p_.metrics->CountSpecStep(drafted, accepted);
  spec.verified_drafted = drafted;  // what the speculator's gate weighs at the next step
  spec.verified_accepted = accepted;
  spec.draft.clear();
  for (size_t i = 0; i < verified_tokens_.size() && !seq.finished; ++i) {
    AppendToken(seq, verified_tokens_[i], verified_logits_[i]);
  }
  return row + rows;
}

}  // namespace kvl
