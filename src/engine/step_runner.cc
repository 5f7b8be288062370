#include "step_runner.h"

#include <algorithm>

namespace kvl {

StepRunner::StepRunner(const StepRunnerParts& parts)
    : p_(parts), block_tokens_(parts.kv->options().layout.block_tokens) {
  const size_t max_tokens = static_cast<size_t>(p_.forward->options().max_batch_tokens);
  for (TokenBatch* b : {&batch_, &part_}) {
    b->tokens.reserve(max_tokens);
    b->positions.reserve(max_tokens);
    b->seq_ids.reserve(max_tokens);
    b->want_logits.reserve(max_tokens);
  }
  run_seqs_.reserve(max_tokens);
  full_blocks_before_.reserve(max_tokens);
}

int64_t StepRunner::RestorePages(Sequence& seq) {
  const Clock::time_point start = Clock::now();
  const int64_t first_block = seq.num_computed / block_tokens_;
  const int64_t num_blocks = seq.restore_tokens / block_tokens_;
  const int64_t restored = p_.pager->RestorePages(seq.slot, first_block, num_blocks);
  if (restored < num_blocks) p_.metrics->CountReadFailure(num_blocks - restored);
  const double ms = MillisecondsBetween(start, Clock::now());
  for (int64_t b = first_block; b < first_block + restored; ++b) {
    const KvPage& page = seq.kv_pages.pages[static_cast<size_t>(b)];
    const double page_ms = ms / static_cast<double>(std::max<int64_t>(1, restored));
    p_.metrics->CountRestored(page.action, page.predicted_ms, page_ms);
    if (page.content.valid() && p_.store != nullptr) {
      p_.store->CountPromoted(page.tier, 1, page.predicted_ms, page_ms);
    }
  }
  return restored * block_tokens_;
}

int64_t StepRunner::FillBatch(const StepPlan& plan) {
  batch_.Clear();
  dropped_predicted_ms_.clear();
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence& seq = *plan.seqs[i];
    const KvPlan::SeqPlan& sp = plan.kv.seqs[i];
    const int64_t step_tokens = static_cast<int64_t>(plan.steps[i].tokens.size());
    if (sp.admit) {
      p_.pager->StartSequence(seq.slot, &seq.kv_pages);
      seq.num_computed = sp.num_cached_tokens;
      // Pages dropped at the preemption are recomputed from their tokens by this step.
      for (const KvPage& page : seq.kv_pages.pages) {
        if (page.fate == KvPageFate::kDropped) dropped_predicted_ms_.push_back(page.predicted_ms);
      }
    }
    const int64_t end = sp.admit ? step_tokens : seq.num_computed + step_tokens;
    if (sp.admit && sp.detached_blocks > 0) {
      // Store pages read where the RAM tier holds them: part of the sequence, never copied.
      p_.pager->AttachInPlace(seq.slot, seq.num_computed / block_tokens_, sp.detached_blocks);
      seq.num_computed += sp.detached_blocks * block_tokens_;
      if (p_.store != nullptr) {
        const KvPage& page =
            seq.kv_pages.pages[static_cast<size_t>(seq.num_computed / block_tokens_ - 1)];
        p_.store->CountInPlace(page.tier, sp.detached_blocks);
      }
    }
    seq.attach_blocks = 0;
    if (seq.restore_tokens > 0) {
      const int64_t restored = RestorePages(seq);
      seq.num_computed += restored;
      seq.restore_tokens = 0;
      // A prompt promoted in chunks: the later chunks count as cached too (first pass only).
      if (!sp.admit && seq.preemptions == 0 && seq.cached_prompt_tokens >= 0) {
        seq.cached_prompt_tokens += restored;
      }
    }
    // The prompt's cached part, as usage reports it: the pool's prefix and the pages promoted
    // from the KV store at the first admission.
    if (sp.admit && seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = seq.num_computed;
    // Pages restored, or computed where a restore stopped or the prefix cache held them, are let
    // go from their tier at once: a page awaiting restore is never also in the pool.
    p_.pager->SettleRestoredPages(seq.slot);
    const int64_t last = static_cast<int64_t>(seq.tokens.size()) - 1;
    for (int64_t pos = seq.num_computed; pos < end; ++pos) {
      batch_.Add(seq.tokens[static_cast<size_t>(pos)], pos, seq.slot, pos == last);
    }
    if (end - seq.num_computed > 1 || seq.num_computed < seq.num_prompt) {
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
        part_.Add(batch_.tokens[k], batch_.positions[k], batch_.seq_ids[k], batch_.want_logits[k]);
      }
      run = &part_;
    }
    run_seqs_.clear();
    for (int32_t id : run->seq_ids) {
      if (run_seqs_.empty() || run_seqs_.back() != id) run_seqs_.push_back(id);
    }
    p_.pager->BeginStep(run_seqs_);
    p_.forward->Run(*run, *p_.cache);
    for (SeqId failed : p_.pager->EndStep()) {
      for (size_t i = 0; i < plan.seqs.size(); ++i) {
        Sequence* seq = plan.seqs[i];
        if (seq->slot == failed && !seq->stream_failed) {
          seq->stream_failed = true;
          // What this step wrote is wrong: never findable by prefix or in the store.
          p_.kv->DropIdentity(seq->slot, full_blocks_before_[i]);
          to_recompute_.push_back(seq);
        }
      }
    }
    int64_t row = 0;
    for (int64_t t = begin; t < end; ++t) {
      if (!batch_.want_logits[static_cast<size_t>(t)]) continue;
      // The sequence whose last token this is: the next one in step order that samples.
      while (plan.seqs[next_seq]->num_computed !=
             static_cast<int64_t>(plan.seqs[next_seq]->tokens.size())) {
        ++next_seq;
      }
      Sequence* seq = plan.seqs[next_seq++];
      if (seq->stream_failed) {
        // A streamed page did not come back intact: this step's output is thrown away and the
        // sequence's KV recomputed from its tokens (the engine never samples from wrong bytes).
        ++row;
        continue;
      }
      if (seq->request.max_new_tokens == 0) {
        // Nothing to generate: the prompt is in the cache (a later request can reuse it).
        ++row;
        p_.scheduler->Finish(*seq, "length");
        continue;
      }
      AppendToken(*seq, seq->sampler->Sample(p_.forward->logits(row++), seq->tokens));
    }
  }
}

void StepRunner::RecomputeFailedStreams() {
  for (Sequence* seq : to_recompute_) {
    // The sequence is recomputed whole: every computed full page.
    p_.metrics->CountReadFailure(seq->num_computed / block_tokens_);
    seq->stream_failed = false;
    if (!seq->finished) p_.scheduler->Preempt(*seq);  // a paged sequence: recomputed whole
  }
  to_recompute_.clear();
}

void StepRunner::Run(const StepPlan& plan) {
  // Cached blocks the plan reuses for new contents go to the KV store first.
  for (const KvPlan::SeqPlan& sp : plan.kv.seqs) {
    for (BlockId block : sp.allocated) p_.pager->SpillFreeBlock(block);
    if (sp.cow_dst != kNoBlock) p_.pager->SpillFreeBlock(sp.cow_dst);
  }
  p_.kv->Commit(plan.kv);
  for (const KvBlockCopy& copy : plan.kv.copies) p_.storage->CopyBlock(copy.src, copy.dst);
  const Clock::time_point start = Clock::now();
  full_blocks_before_.clear();
  for (const Sequence* seq : plan.seqs) full_blocks_before_.push_back(seq->num_computed / block_tokens_);
  const int64_t prefill_tokens = FillBatch(plan);
  if (batch_.size() > 0) RunBatch(plan);  // a step may only promote pages
  if (p_.store != nullptr) SaveUnreachablePages(plan);
  RecomputeFailedStreams();
  if (!dropped_predicted_ms_.empty()) {
    // Pages dropped at preemption were just recomputed from their tokens within this step.
    const double ms = MillisecondsBetween(start, Clock::now());
    for (double predicted : dropped_predicted_ms_) {
      p_.metrics->CountRestored(KvAction::kRecomputeTokens, predicted,
                                ms / static_cast<double>(dropped_predicted_ms_.size()));
    }
  }
  p_.metrics->CountStep(batch_.size(), static_cast<int64_t>(plan.seqs.size()), prefill_tokens);
}

void StepRunner::SaveUnreachablePages(const StepPlan& plan) {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const Sequence& seq = *plan.seqs[i];
    if (seq.finished || seq.slot < 0 || !p_.kv->Contains(seq.slot) || !p_.kv->IsPaged(seq.slot)) {
      continue;  // a sequence with no page outside the pool is all within the index's reach
    }
    const int64_t full = p_.kv->num_tokens(seq.slot) / block_tokens_;
    if (full <= full_blocks_before_[i]) continue;
    // The blocks the pool's prefix index reaches (at most all but the last token's).
    const std::vector<int32_t>& tokens = p_.kv->tokens(seq.slot);
    const int64_t reachable =
        p_.kv->MatchPrefix(std::span(tokens).first(static_cast<size_t>(
            std::min<int64_t>(static_cast<int64_t>(tokens.size()), full * block_tokens_ + 1)))) /
        block_tokens_;
    p_.pager->SaveUnreachablePages(seq.slot, std::max(full_blocks_before_[i], reachable), full);
  }
}

void StepRunner::AppendToken(Sequence& seq, int32_t token) {
  const Clock::time_point now = Clock::now();
  p_.metrics->CountTokenLatency(seq, now);
  if (seq.num_generated == 0) seq.first_token = now;
  seq.last_token = now;
  const Request& r = seq.request;
  if (!r.ignore_eos && token == p_.tokenizer->eos()) return p_.scheduler->Finish(seq, "eos");
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) {
    return p_.scheduler->Finish(seq, "stop");
  }
  seq.tokens.push_back(token);
  ++seq.num_generated;
  p_.metrics->CountGenerated();
  bool stopped = false;
  TokenEvent event;
  event.request = seq.id;
  event.token = token;
  piece_.clear();
  p_.tokenizer->AppendTokenText(seq.prev_token, token, &piece_);
  event.text = seq.stop_filter.Push(piece_, &stopped);
  seq.prev_token = token;
  if (seq.on_event) seq.on_event(event);
  if (stopped) return p_.scheduler->Finish(seq, "stop");
  if (r.max_new_tokens >= 0 && seq.num_generated >= r.max_new_tokens) {
    return p_.scheduler->Finish(seq, "length");
  }
  if (static_cast<int64_t>(seq.tokens.size()) >= p_.context_length) {
    p_.scheduler->Finish(seq, "context");
  }
}

}  // namespace kvl
