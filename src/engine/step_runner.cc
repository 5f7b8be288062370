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
    : p_(parts), memory_(*parts.memory), block_tokens_(parts.memory->view().layout().block_tokens) {
  const size_t max_tokens = static_cast<size_t>(p_.forward->options().max_batch_tokens);
  for (TokenBatch* b : {&batch_, &part_}) {
    b->tokens.reserve(max_tokens);
    b->positions.reserve(max_tokens);
    b->seq_ids.reserve(max_tokens);
    b->want_logits.reserve(max_tokens);
    b->window_rebuild.reserve(max_tokens);
  }
  verified_tokens_.reserve(kMaxDraftTokens + 1);
  verified_logits_.reserve(kMaxDraftTokens + 1);
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
      sp.allocated.reserve(static_cast<size_t>(memory_.view().BlocksFor(step_tokens) + 1));
    }
  }
}

bool StepRunner::Step() {
  if (!p_.scheduler->Schedule(&plan_)) return false;
  Run(plan_);
  p_.scheduler->ReleaseFinished();
  // Between steps: pages that left the pool come back while it has blocks to spare.
  if (p_.scheduler->PromoteBack(&promoted_)) CountApplied(promoted_);
  return true;
}

void StepRunner::CountApplied(const KvApplied& applied) {
  for (int64_t pages : applied.read_failures) p_.metrics->CountReadFailure(pages);
  for (const KvBroughtBack& page : applied.brought_back) {
    p_.metrics->CountRestored(page.action, page.predicted_ms, page.measured_ms);
    // A store page found by the admission's lookup: one of the tier's hits, promoted. (A running
    // sequence's page promoted back is no hit of a KV store lookup.)
    if (page.store_tier >= 0) {
      p_.metrics->CountPromoted(page.store_tier, page.predicted_ms, page.measured_ms);
    }
  }
}

int64_t StepRunner::FillBatch(const StepPlan& plan) {
  batch_.Clear();
  kv_seqs_.clear();
  for (Sequence* seq : plan.seqs) {
    kv_seqs_.push_back({&seq->kv_pages, seq->id, seq->MaxStepsLeft(p_.context_length) - 1,
                        seq->num_computed, &seq->finished});
  }
  step_ = &memory_.Open(plan.kv, kv_seqs_);
  CountApplied(step_->applied());
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence& seq = *plan.seqs[i];
    const KvPlan::SeqPlan& sp = plan.kv.seqs[i];
    const int64_t end = step_->computed_to(i);
    // The step's own tokens: a speculative decode's draft is past seq.tokens (issue 26).
    const std::span<const int32_t> tokens = plan.steps[i].tokens;
    const int64_t tokens_from = sp.admit ? 0 : seq.num_computed;
    seq.num_computed = step_->computed_from(i);
    const int64_t restored = step_->restored_tokens(i);
    // A prompt promoted in chunks: the later chunks count as cached too (first pass only).
    if (restored > 0 && !sp.admit && seq.preemptions == 0 && seq.cached_prompt_tokens >= 0) {
      seq.cached_prompt_tokens += restored;
    }
    // The prompt's cached part, as usage reports it: the pool's prefix and the pages promoted
    // from the KV store at the first admission.
    if (sp.admit && seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = seq.num_computed;
    // Sliding-window layers: the window's rows the sequence does not hold run ahead of its own.
    for (int64_t pos = step_->window_from(i); pos < seq.num_computed; ++pos) {
      batch_.AddWindowRebuild(seq.tokens[static_cast<size_t>(pos)], pos, seq.slot);
    }
    const int64_t last = static_cast<int64_t>(seq.tokens.size()) - 1;
    for (int64_t pos = seq.num_computed; pos < end; ++pos) {
      // Every row of a draft asks for logits: each is verified (pos > last only for drafts).
      batch_.Add(tokens[static_cast<size_t>(pos - tokens_from)], pos, seq.slot, pos >= last);
    }
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
    const std::span<const SeqId> failed_streams =
        step_->Forward(run->seq_ids, run->positions,
                       [this, run](KvCache& cache) { p_.forward->Run(*run, cache); });
    for (SeqId failed : failed_streams) {
      for (Sequence* seq : plan.seqs) {
        if (seq->slot == failed && !seq->stream_failed) {
          seq->stream_failed = true;  // (the step threw what it wrote for it away)
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
  const int64_t prefill_tokens = FillBatch(plan);
  // The forward run alone is what a page recomputed from its tokens is a share of (the restores
  // and store writes around it are timed and checked on their own).
  const Clock::time_point start = Clock::now();
  if (batch_.size() > 0) RunBatch(plan);  // a step may only promote pages
  const double forward_ms = MillisecondsBetween(start, Clock::now());
  if (p_.speculator != nullptr) {
    // A request that ended is what a drafter across requests drafts from (--spec suffix).
    for (const Sequence* seq : plan.seqs) {
      if (seq->finished) p_.speculator->Remember(*seq);
    }
  }
  // (Before a preemption below can let a sequence's blocks go.)
  const KvStepReport& report =
      step_->Close({forward_ms, p_.forward->last_logits_ms(), prefill_tokens > 0});
  step_ = nullptr;
  if (const auto& m = report.rebuilt_in_step) {
    p_.metrics->CountRebuiltInStep(m->pages, m->predicted_page_ms, m->measured_page_ms);
  }
  for (const KvStepReport::Recomputed& page : report.recomputed) {
    p_.metrics->CountRestored(KvAction::kRecomputeTokens, page.predicted_ms, page.measured_ms);
    if (page.beside_decode) p_.metrics->CountRecomputedBesideDecode();
  }
  RecomputeFailedStreams();
  p_.metrics->CountStep(batch_.size(), static_cast<int64_t>(plan.seqs.size()), prefill_tokens);
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
