#include "step_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "constrained_sampling.h"  // SampleNextToken

namespace kvl {
namespace {

// Discarded steps (a KV page that could not be read) a sequence may take in a row before it
// ends with an error: the first retry recomputes it from its tokens, which reads nothing back.
constexpr int32_t kMaxFailedReadsInARow = 4;

// The token's log-probability and the k most likely tokens (ties: the lower id first) under the
// log-softmax of the raw logits, in double: log p(i) = l_i - (m + log sum_j exp(l_j - m)), m the
// largest logit. Only requests that ask for log-probabilities come here; the selection runs in a
// stack array, and the event's vector is the one allocation.
void FillLogprobs(const float* logits, int32_t vocab, int32_t token, int32_t k, TokenEvent* event) {
  double max = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < vocab; ++i) max = std::max(max, static_cast<double>(logits[i]));
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  event->logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);
  std::array<int32_t, kMaxTopLogprobs> top;  // ids, most likely first
  int32_t n = 0;
  for (int32_t id = 0; id < vocab && k > 0; ++id) {
    if (n == k && !(logits[id] > logits[top[size_t(n - 1)]])) continue;
    int32_t at = n < k ? n++ : n - 1;
    for (; at > 0 && logits[id] > logits[top[size_t(at - 1)]]; --at) {
      top[size_t(at)] = top[size_t(at - 1)];
    }
    top[size_t(at)] = id;
  }
  event->top_logprobs.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = top[size_t(i)];
    const double logprob = static_cast<double>(logits[id]) - log_z;
    event->top_logprobs[size_t(i)] = {id, static_cast<float>(logprob)};
  }
}

}  // namespace

StepRunner::StepRunner(const StepRunnerParts& parts)
    : p_(parts), memory_(*parts.memory), block_tokens_(parts.memory->layout().block_tokens) {
  const size_t max_tokens = static_cast<size_t>(p_.forward->options().max_batch_tokens);
  for (TokenBatch* b : {&batch_, &part_}) {
    b->tokens.reserve(max_tokens);
    b->positions.reserve(max_tokens);
    b->seq_ids.reserve(max_tokens);
    b->want_logits.reserve(max_tokens);
    b->window_rebuild.reserve(max_tokens);
  }
  run_seqs_.reserve(max_tokens);
  verified_tokens_.reserve(kMaxDraftTokens + 1);
  verified_logits_.reserve(kMaxDraftTokens + 1);
  full_blocks_before_.reserve(max_tokens);
  computed_.reserve(max_tokens);
  kv_seqs_.reserve(max_tokens);
  plan_.steps.reserve(static_cast<size_t>(p_.max_seqs));
  plan_.seqs.reserve(static_cast<size_t>(p_.max_seqs));
  if (p_.draft_max > 0) {
    // Speculative decoding: a decode may carry 1 + draft_max tokens over new blocks; the reused
    // plan has room for that from the start, so a longer draft than before allocates nothing.
    const int64_t step_tokens = p_.draft_max + 1;
    plan_.kv.seqs.resize(static_cast<size_t>(p_.max_seqs));
    for (KvPlan::SeqPlan& sp : plan_.kv.seqs) {
      sp.tokens.reserve(static_cast<size_t>(step_tokens));
      sp.allocated.reserve(static_cast<size_t>(memory_.BlocksFor(step_tokens) + 1));
    }
  }
}

bool StepRunner::Step() {
  if (!p_.scheduler->Schedule(&plan_)) return false;
  Run(plan_);
  p_.scheduler->ReleaseFinished();
  // Between steps: pages that left the pool come back while it has blocks to spare.
  p_.scheduler->PlanPromotions(&promotion_);
  PromoteBack(promotion_);
  return true;
}

void StepRunner::CountApplied() {
  for (int64_t pages : applied_.read_failures) p_.metrics->CountReadFailure(pages);
  for (const KvBroughtBack& page : applied_.brought_back) {
    p_.metrics->CountRestored(page.action, page.predicted_ms, page.measured_ms);
    // A store page found by the admission's lookup: one of the tier's hits, promoted. (A running
    // sequence's page promoted back is no hit of a KV store lookup.)
    if (page.store_tier >= 0) {
      p_.metrics->CountPromoted(page.store_tier, page.predicted_ms, page.measured_ms);
    }
  }
}

void StepRunner::PromoteBack(KvPagePlan& plan) {
  if (plan.actions.empty()) return;
  memory_.Apply(plan, &applied_);
  CountApplied();
}

int64_t StepRunner::FillBatch(const StepPlan& plan) {
  batch_.Clear();
  computed_.clear();
  kv_seqs_.clear();
  for (Sequence* seq : plan.seqs) {
    kv_seqs_.push_back({&seq->kv_pages, seq->id, seq->MaxStepsLeft(p_.context_length) - 1});
  }
  memory_.Apply(plan.kv, kv_seqs_, &applied_);
  CountApplied();
  for (const KvRecomputedPage& page : applied_.recomputed) {
    pending_recompute_.push_back(
        {page.request, page.block, page.price.predicted_ms, page.price.model_ms});
  }
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence& seq = *plan.seqs[i];
    const KvPlan::SeqPlan& sp = plan.kv.seqs[i];
    const int64_t step_tokens = static_cast<int64_t>(plan.steps[i].tokens.size());
    const int64_t end = sp.admit ? step_tokens : seq.num_computed + step_tokens;
    // The step's own tokens: a speculative decode's draft is past seq.tokens (issue 26).
    const std::span<const int32_t> tokens = plan.steps[i].tokens;
    const int64_t tokens_from = sp.admit ? 0 : seq.num_computed;
    seq.num_computed = applied_.computed_from[i];
    const int64_t restored = applied_.restored_tokens[i];
    // A prompt promoted in chunks: the later chunks count as cached too (first pass only).
    if (restored > 0 && !sp.admit && seq.preemptions == 0 && seq.cached_prompt_tokens >= 0) {
      seq.cached_prompt_tokens += restored;
    }
    // The prompt's cached part, as usage reports it: the pool's prefix and the pages promoted
    // from the KV store at the first admission.
    if (sp.admit && seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = seq.num_computed;
    RebuildWindow(seq);
    const int64_t last = static_cast<int64_t>(seq.tokens.size()) - 1;
    for (int64_t pos = seq.num_computed; pos < end; ++pos) {
      // Every row of a draft asks for logits: each is verified (pos > last only for drafts).
      batch_.Add(tokens[static_cast<size_t>(pos - tokens_from)], pos, seq.slot, pos >= last);
    }
    computed_.push_back({seq.id, seq.num_computed, end});
    // (A decode's draft rows are no prefill: speculative decoding.)
    if (end - seq.num_computed - seq.spec.in_step > 1 || seq.num_computed < seq.num_prompt) {
      prefill_tokens += end - seq.num_computed;
    }
    seq.num_computed = end;
  }
  return prefill_tokens;
}

// A failed promotion can leave more tokens than one forward takes: they run in chunks. Each
// sequence samples from the chunk that holds its last token; samplers are independent, so the
// order does not matter.
void StepRunner::RunBatch(const StepPlan& plan) {
  const int64_t chunk = p_.forward->options().max_batch_tokens;
  size_t next_seq = 0;
  for (int64_t begin = 0; begin < batch_.size(); begin += chunk) {
    const int64_t end = std::min(batch_.size(), begin + chunk);
    const TokenBatch* run = &batch_;
    if (begin > 0 || end < batch_.size()) {
      part_.Clear();
      for (int64_t t = begin; t < end; ++t) {
        const size_t k = static_cast<size_t>(t);
        if (batch_.rebuilds_window(t)) {
          part_.AddWindowRebuild(batch_.tokens[k], batch_.positions[k], batch_.seq_ids[k]);
        } else {
          part_.Add(batch_.tokens[k], batch_.positions[k], batch_.seq_ids[k],
                    batch_.want_logits[k]);
        }
      }
      run = &part_;
    }
    run_seqs_.clear();
    for (int32_t id : run->seq_ids) {
      if (run_seqs_.empty() || run_seqs_.back() != id) run_seqs_.push_back(id);
    }
    ClaimWindowRows(*run);
    const Clock::time_point run_start = Clock::now();
    memory_.BeginForward(run_seqs_);
    p_.forward->Run(*run, memory_.forward_cache());
    const std::span<const SeqId> failed_streams = memory_.EndForward();
    last_run_ms_ = MillisecondsBetween(run_start, Clock::now());
    // Priced now, while every sequence of the run still holds its slot (sampling may finish one).
    last_run_rebuilds_ = memory_.InStepRebuilds();
    for (SeqId failed : failed_streams) {
      for (size_t i = 0; i < plan.seqs.size(); ++i) {
        Sequence* seq = plan.seqs[i];
        if (seq->slot == failed && !seq->stream_failed) {
          seq->stream_failed = true;
          // What this step wrote is wrong: never findable by prefix or in the store.
          memory_.DiscardWrites(seq->slot, full_blocks_before_[i]);
          to_recompute_.push_back(seq);
        }
      }
    }
    int64_t row = 0;
    for (int64_t t = begin; t < end; ++t) {
      if (!batch_.want_logits[static_cast<size_t>(t)]) continue;
      // The sequence whose last token this is: the next one in step order that samples.
      while (!SamplesThisStep(*plan.seqs[next_seq])) ++next_seq;
      Sequence* seq = plan.seqs[next_seq++];
      if (seq->spec.in_step > 0) {  // speculative decoding: its draft's rows follow
        const int64_t draft_rows = seq->spec.in_step;
        row = VerifyDraft(*seq, row);
        t += draft_rows;  // verified with the first
        continue;
      }
      if (seq->stream_failed) {
        // A streamed page did not come back intact: this step's output is thrown away and the
        // sequence's KV recomputed from its tokens (the engine never samples from wrong bytes).
        ++row;
        continue;
      }
      if (seq->request.max_new_tokens == 0) {
        // Nothing to generate: the prompt is in the cache (a later request can reuse it).
        ++row;
        p_.scheduler->Finish(*seq, FinishReason::kLength);
        continue;
      }
      const float* logits = p_.forward->logits(row++);
      p_.metrics->CountSpecStep(0, 0);
      AppendToken(*seq, SampleNextToken(*seq, logits), logits);
    }
  }
}

void StepRunner::RebuildWindow(const Sequence& seq) {
  const int64_t n = seq.num_computed;
  const int64_t from = memory_.RestoreWindow(seq.slot, n);
  for (int64_t pos = from; pos < n; ++pos) {
    batch_.AddWindowRebuild(seq.tokens[static_cast<size_t>(pos)], pos, seq.slot);
  }
}

void StepRunner::ClaimWindowRows(const TokenBatch& run) {
  for (int64_t t = 0; t < run.size();) {
    const SeqId seq = run.seq_ids[static_cast<size_t>(t)];
    int64_t end = t + 1;
    while (end < run.size() && run.seq_ids[static_cast<size_t>(end)] == seq) ++end;
    memory_.ClaimWindowRows(seq, run.positions[static_cast<size_t>(t)],
                            run.positions[static_cast<size_t>(end - 1)] + 1);
    t = end;
  }
}

// Progress is checked, not assumed: a sequence whose step was thrown away for a page that could
// not be read is recomputed from its tokens, and its next admission asks the KV store nothing
// (a page the store still names could fail the same way again). A sequence that still cannot
// get one token through after kMaxFailedReadsInARow tries ends with an error that says so,
// never a retry loop that holds the engine.
void StepRunner::RecomputeFailedStreams() {
  for (Sequence* seq : to_recompute_) {
    // The sequence is recomputed whole: every computed full page.
    p_.metrics->CountReadFailure(seq->num_computed / block_tokens_);
    seq->stream_failed = false;
    if (seq->finished) continue;
    if (++seq->failed_reads_in_a_row >= kMaxFailedReadsInARow) {
      p_.scheduler->Finish(
          *seq, FinishReason::kError,
          InternalError(fmt::format(
              "request {}: its KV pages outside the pool could not be read back {} times in a "
              "row, also after recomputing them from its tokens; stopped rather than retried "
              "forever",
              seq->id, seq->failed_reads_in_a_row)));
      continue;
    }
    p_.scheduler->Preempt(*seq);  // a paged sequence: recomputed whole
    seq->store_checked = true;    // from its tokens, not from the store that just failed
  }
  to_recompute_.clear();
}

void StepRunner::Run(const StepPlan& plan) {
  full_blocks_before_.clear();
  for (const Sequence* seq : plan.seqs) full_blocks_before_.push_back(seq->num_computed / block_tokens_);
  const int64_t prefill_tokens = FillBatch(plan);
  // The forward run alone is what a page recomputed from its tokens is a share of (the restores
  // and store writes around it are timed and checked on their own).
  const Clock::time_point start = Clock::now();
  if (batch_.size() > 0) RunBatch(plan);  // a step may only promote pages
  const double forward_ms = MillisecondsBetween(start, Clock::now());
  // (Before a preemption below can let a sequence's blocks go.)
  if (prefill_tokens == 0 && batch_.size() > 0) MeasureRebuildsInStep();
  if (p_.speculator != nullptr) {
    // A request that ended is what a drafter across requests drafts from (--spec suffix).
    for (const Sequence* seq : plan.seqs) {
      if (seq->finished) p_.speculator->Remember(*seq);
    }
  }
  SaveUnreachablePages(plan);
  RecomputeFailedStreams();
  if (!pending_recompute_.empty() && batch_.size() > 0) CountRecomputedPages(forward_ms);
  p_.metrics->CountStep(batch_.size(), static_cast<int64_t>(plan.seqs.size()), prefill_tokens);
}

// What one token at `position` weighs in a forward run: the cost model's time for it, or 1
// without prices (a split by tokens).
double StepRunner::TokenWeight(int64_t position) const {
  const double ms = memory_.TokenRecomputeMs(position);
  return ms > 0 ? ms : 1.0;
}

void StepRunner::CountRecomputedPages(double forward_ms) {
  // The step also computes other sequences' tokens (decode tokens deep in their context, other
  // prefills), so a page's measured time is its share of the forward run by the cost model's
  // weight of each token: its own tokens' weight over the weight of every token of the step.
  // A split by token count alone would charge a page's shallow tokens for the attention of the
  // deep decode tokens beside it.
  double step_weight = 0;
  for (int64_t pos : batch_.positions) step_weight += TokenWeight(pos);
  // A page recomputed from its tokens is a prefill chunk of the step: rows of the same forward
  // run as the other sequences' decode tokens, never a run of its own.
  bool beside_decode = false;
  for (const ComputedRange& r : computed_) beside_decode |= r.to - r.from == 1;
  size_t kept = 0;
  for (const PendingRecompute& page : pending_recompute_) {
    const int64_t first = page.block * block_tokens_;
    bool done = false;  // measured, or no longer measurable as one page
    bool seen = false;
    for (const ComputedRange& r : computed_) {
      if (r.request != page.request) continue;
      seen = true;
      if (first >= r.from && first + block_tokens_ <= r.to) {
        double page_weight = 0;
        for (int64_t pos = first; pos < first + block_tokens_; ++pos) page_weight += TokenWeight(pos);
        const double page_ms = forward_ms * page_weight / step_weight;
        p_.metrics->CountRestored(KvAction::kRecomputeTokens, page.predicted_ms, page_ms);
        recomputed_.Add(static_cast<size_t>(KvAction::kRecomputeTokens), page.model_ms, page_ms);
        if (beside_decode) p_.metrics->CountRecomputedBesideDecode();
        done = true;
      } else if (r.from > first) {
        done = true;  // split across two steps: its time is not one step's share
      }
    }
    // A sequence that sat this step out (preempted again, finished) is not followed further.
    if (!done && seen) pending_recompute_[kept++] = page;
  }
  pending_recompute_.resize(kept);
  memory_.FeedBack(recomputed_);
}

void StepRunner::MeasureRebuildsInStep() {
  // One row per sequence (no draft, no window rows) in one forward run: the calibrated decode
  // step applies, and the run's time is the step's.
  if (batch_.size() != static_cast<int64_t>(run_seqs_.size()) ||
      batch_.size() > p_.forward->options().max_batch_tokens) {
    return;
  }
  InStepRebuildMeter::Step step;
  step.measured_ms = last_run_ms_;
  const double plain_ms = memory_.PlainDecodeStepMs(batch_.positions);
  step.plain_model_ms = plain_ms > 0 ? plain_ms + p_.forward->last_logits_ms() : 0;
  step.rebuilds = last_run_rebuilds_;
  const std::optional<InStepRebuildMeter::Measured> m = in_step_meter_.Observe(step);
  if (!m) return;
  p_.metrics->CountRebuiltInStep(m->pages, m->predicted_page_ms, m->measured_page_ms);
  // One event per step, whatever its page count (kvl/kv_price_feedback.h).
  in_step_rebuilt_.Add(kInStepRebuildFeedbackKey, m->model_ms, m->measured_ms);
  memory_.FeedBack(in_step_rebuilt_);
}

void StepRunner::SaveUnreachablePages(const StepPlan& plan) {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const Sequence& seq = *plan.seqs[i];
    if (!seq.finished && seq.slot >= 0)
      memory_.FileUnreachablePages(seq.slot, full_blocks_before_[i]);
  }
}

void StepRunner::AppendToken(Sequence& seq, int32_t token, const float* logits) {
  // A grammar that allows no token ends the request with an error, never a hang.
  if (token < 0) return p_.scheduler->Finish(seq, FinishReason::kError, GrammarDeadEnd(seq));
  const Clock::time_point now = Clock::now();
  p_.metrics->CountTokenLatency(seq, now);
  if (seq.num_generated == 0) seq.first_token = now;
  seq.last_token = now;
  const Request& r = seq.request;
  // EOS, and every end-of-turn token of the vocabulary (<|eot_id|>, <|im_end|>, ...).
  if (!r.ignore_eos && p_.tokenizer->IsEndOfGeneration(token)) {
    return p_.scheduler->Finish(seq, FinishReason::kEos);
  }
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) {
    return p_.scheduler->Finish(seq, FinishReason::kStop);
  }
  seq.tokens.push_back(token);
  ++seq.num_generated;
  seq.failed_reads_in_a_row = 0;
  p_.metrics->CountGenerated();
  bool stopped = false;
  TokenEvent event;
  event.request = seq.id;
  event.token = token;
  piece_.clear();
  p_.tokenizer->AppendTokenText(seq.prev_token, token, &piece_);
  event.text = seq.stop_filter.Push(piece_, &stopped);
  if (r.top_logprobs >= 0) {
    FillLogprobs(logits, p_.tokenizer->vocab_size(), token, r.top_logprobs, &event);
  }
  seq.prev_token = token;
  if (seq.on_event) seq.on_event(event);
  if (stopped) return p_.scheduler->Finish(seq, FinishReason::kStop);
  if (r.max_new_tokens >= 0 && seq.num_generated >= r.max_new_tokens) {
    return p_.scheduler->Finish(seq, FinishReason::kLength);
  }
  if (static_cast<int64_t>(seq.tokens.size()) >= p_.context_length) {
    p_.scheduler->Finish(seq, FinishReason::kContext);
  }
}

}  // namespace kvl
