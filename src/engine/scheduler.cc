// One engine step: admit, plan KV memory, preempt if it does not fit, run one batched forward,
// sample, stream events.
//
// Order of work in a step's token budget (vLLM-style continuous batching):
//   1. decodes of running sequences (one token each),
//   2. the next chunk of running sequences still in prefill (chunked prefill),
//   3. admissions from the waiting queue, FIFO, their prompts chunked to the budget left.
// If the plan does not fit the KV pool, the newest admissions are dropped first, then the most
// recently admitted running sequence is preempted (freed and requeued at the front of the waiting
// queue, to be recomputed; its full blocks usually come back from the prefix cache).
#include <fmt/format.h>

#include <algorithm>

#include "engine/engine_impl.h"

namespace kvl {

void Engine::Impl::TakeInbox() {
  std::lock_guard<std::mutex> lock(inbox_mutex);
  while (!inbox.empty()) {
    waiting.push_back(std::move(inbox.front()));
    inbox.pop_front();
  }
}

void Engine::Impl::ApplyCancellations() {
  std::unordered_set<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex);
    if (cancel_requests.empty()) return;
    cancels.swap(cancel_requests);
  }
  for (auto& seq : running) {
    if (cancels.count(seq->id)) Finish(*seq, "cancelled");
  }
  for (auto& seq : waiting) {
    if (cancels.count(seq->id)) Finish(*seq, "cancelled");
  }
}

void Engine::Impl::Preempt(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running[running_index]);
  running.erase(running.begin() + static_cast<std::ptrdiff_t>(running_index));
  kv->Free(seq->slot);
  free_slots.push_back(seq->slot);
  seq->slot = -1;
  seq->num_computed = 0;
  waiting.push_front(std::move(seq));
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++preemptions;
}

// Fills steps / step_seqs and a plan that fits; false when there is nothing to run.
bool Engine::Impl::BuildPlan(KvPlan* plan) {
  const int64_t max_tokens = forward->options().max_batch_tokens;
  size_t max_admissions = waiting.size();
  for (;;) {
    steps.clear();
    step_seqs.clear();
    int64_t budget = max_tokens;
    for (bool decode_pass : {true, false}) {
      for (auto& seq : running) {
        const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->num_computed;
        if (remaining <= 0 || (remaining == 1) != decode_pass || budget == 0) continue;
        const int64_t n = std::min(remaining, budget);
        steps.push_back({seq->slot, std::span<const int32_t>(seq->tokens).subspan(
                                        static_cast<size_t>(seq->num_computed), static_cast<size_t>(n))});
        step_seqs.push_back(seq.get());
        budget -= n;
      }
    }
    size_t admissions = 0;
    for (auto& seq : waiting) {
      if (budget == 0 || admissions == max_admissions) break;
      if (running.size() + admissions >= static_cast<size_t>(options.max_seqs)) break;
      const int64_t len = static_cast<int64_t>(seq->tokens.size());
      const int64_t cached = kv->MatchPrefix(seq->tokens);
      const int64_t n = std::min(len - cached, budget);
      const SeqId slot = free_slots[free_slots.size() - 1 - admissions];
      steps.push_back({slot, std::span<const int32_t>(seq->tokens).first(static_cast<size_t>(cached + n))});
      step_seqs.push_back(seq.get());
      budget -= n;
      ++admissions;
    }
    if (steps.empty()) return false;
    *plan = kv->Plan(steps);
    if (plan->fits) {
      // Admissions become running sequences, in order, with the slots the plan used.
      for (size_t a = 0; a < admissions; ++a) {
        std::unique_ptr<Sequence> seq = std::move(waiting.front());
        waiting.pop_front();
        seq->slot = free_slots.back();
        free_slots.pop_back();
        running.push_back(std::move(seq));
      }
      return true;
    }
    if (admissions == 1 && running.empty()) {
      // Alone in an empty pool and still too big: it can never run.
      Sequence& seq = *waiting.front();
      Finish(seq, "error", ResourceExhaustedError(fmt::format(
                               "the KV budget ({} blocks of {} tokens) cannot hold a prompt of {} "
                               "tokens; raise --kv-budget",
                               kv->num_blocks(), options.block_tokens, seq.tokens.size())));
      ReleaseFinished();
      max_admissions = waiting.size();
      continue;
    }
    if (admissions > 0) {
      max_admissions = admissions - 1;  // the newest admission waits for a later step
      continue;
    }
    if (running.size() > 1) {
      Preempt(running.size() - 1);
      max_admissions = 0;
      continue;
    }
    // One sequence alone does not fit the whole pool: it can never run.
    Sequence& seq = *running.front();
    Finish(seq, "error",
           ResourceExhaustedError(fmt::format(
               "the KV budget ({} blocks of {} tokens) cannot hold a sequence of {} tokens; raise "
               "--kv-budget",
               kv->num_blocks(), options.block_tokens, seq.tokens.size())));
    ReleaseFinished();
    max_admissions = waiting.size();
  }
}

void Engine::Impl::RunForwardAndSample(const KvPlan& plan) {
  batch.Clear();
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < step_seqs.size(); ++i) {
    Sequence& seq = *step_seqs[i];
    const KvPlan::SeqPlan& sp = plan.seqs[i];
    if (sp.admit) {
      seq.num_computed = sp.num_cached_tokens;
      if (seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = sp.num_cached_tokens;
    }
    KVL_CHECK(sp.first_new_pos == seq.num_computed);
    const int64_t end = sp.admit ? static_cast<int64_t>(steps[i].tokens.size())
                                 : seq.num_computed + static_cast<int64_t>(steps[i].tokens.size());
    const int64_t last = static_cast<int64_t>(seq.tokens.size()) - 1;
    for (int64_t p = seq.num_computed; p < end; ++p) {
      batch.Add(seq.tokens[static_cast<size_t>(p)], p, seq.slot, p == last);
    }
    if (end - seq.num_computed > 1 || seq.num_computed < seq.num_prompt) {
      prefill_tokens += end - seq.num_computed;
    }
    seq.num_computed = end;
  }
  forward->Run(batch, *cache);

  int64_t row = 0;
  for (Sequence* seq : step_seqs) {
    if (seq->num_computed != static_cast<int64_t>(seq->tokens.size())) continue;  // mid-prefill
    const int32_t token = seq->sampler->Sample(forward->logits(row++), seq->tokens);
    AppendToken(*seq, token);
  }
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++num_steps;
  tokens_prefilled += prefill_tokens;
  last_batch_tokens = batch.size();
  last_batch_seqs = static_cast<int64_t>(step_seqs.size());
  batch_tokens_total += last_batch_tokens;
  batch_seqs_total += last_batch_seqs;
}

void Engine::Impl::AppendToken(Sequence& seq, int32_t token) {
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(metrics_mutex);
    if (seq.num_generated == 0) {
      seq.first_token = now;
      ttft_ms.Add(MillisecondsBetween(seq.submitted, now));
    } else {
      itl_ms.Add(MillisecondsBetween(seq.last_token, now));
    }
  }
  seq.last_token = now;
  const Request& r = seq.request;
  if (!r.ignore_eos && token == tokenizer->eos()) return Finish(seq, "eos");
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) {
    return Finish(seq, "stop");
  }
  seq.tokens.push_back(token);
  ++seq.num_generated;
  {
    std::lock_guard<std::mutex> lock(metrics_mutex);
    ++tokens_generated;
  }
  bool stopped = false;
  TokenEvent event;
  event.request = seq.id;
  event.token = token;
  event.text = seq.stop_filter.Push(tokenizer->DecodeToken(seq.prev_token, token), &stopped);
  seq.prev_token = token;
  if (seq.on_event) seq.on_event(event);
  if (stopped) return Finish(seq, "stop");
  if (r.max_new_tokens >= 0 && seq.num_generated >= r.max_new_tokens) return Finish(seq, "length");
  if (static_cast<int64_t>(seq.tokens.size()) >= context_length) return Finish(seq, "context");
}

void Engine::Impl::Finish(Sequence& seq, const std::string& reason, Status error) {
  if (seq.finished) return;
  seq.finished = true;  // ReleaseFinished drops it from the queues
  TokenEvent event;
  event.request = seq.id;
  event.finished = true;
  event.finish_reason = reason;
  event.error = std::move(error);
  if (reason != "stop") event.text = seq.stop_filter.Flush();
  event.time_to_first_token_ms =
      seq.num_generated > 0 ? MillisecondsBetween(seq.submitted, seq.first_token) : 0.0;
  event.prompt_tokens = seq.num_prompt;
  event.cached_prompt_tokens = std::max<int64_t>(0, seq.cached_prompt_tokens);
  event.generated_tokens = seq.num_generated;
  if (seq.slot >= 0) {
    kv->Free(seq.slot);
    free_slots.push_back(seq.slot);
    seq.slot = -1;
  }
  if (seq.on_event) seq.on_event(event);
  std::lock_guard<std::mutex> lock(metrics_mutex);
  ++requests_finished;
}

void Engine::Impl::ReleaseFinished() {
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->finished; };
  running.erase(std::remove_if(running.begin(), running.end(), done), running.end());
  waiting.erase(std::remove_if(waiting.begin(), waiting.end(), done), waiting.end());
}

void Engine::Impl::UpdateGauges() {
  const KvStats stats = kv->stats();
  std::lock_guard<std::mutex> lock(metrics_mutex);
  kv_stats = stats;
  num_running = static_cast<int64_t>(running.size());
  num_waiting = static_cast<int64_t>(waiting.size());
}

bool Engine::Impl::StepImpl() {
  TakeInbox();
  ApplyCancellations();
  ReleaseFinished();
  KvPlan plan;
  const bool has_work = BuildPlan(&plan);
  if (has_work) {
    kv->Commit(plan);
    for (const KvBlockCopy& copy : plan.copies) storage->CopyBlock(copy.src, copy.dst);
    RunForwardAndSample(plan);
    ReleaseFinished();
  }
  UpdateGauges();
  return has_work || !running.empty() || !waiting.empty();
}

}  // namespace kvl
