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
#include <cstring>

#include "engine_impl.h"

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

KvAction Engine::Impl::ChoosePageAction(const Sequence& seq, int64_t block_index, bool running,
                                        double* predicted_ms) {
  KvAction action = policy.fixed;
  KvPolicyOptions o;
  o.quality = quality;
  o.phase = step_has_prefill ? Phase::kPrefill : Phase::kDecode;
  o.memory_price_ms_per_mib = 1e3;  // the page must leave: memory is what we are short of
  PageHistory page;
  page.first_position = block_index * options.block_tokens;
  page.is_sink = page.first_position < sink_tokens;
  PageCostProfile costs = page_costs;
  if (running) {
    // A running sequence reads every page again at its next step; how much it weighs them is the
    // attention mass they received.
    const int64_t age_steps = std::max<int64_t>(1, pager->steps(seq.slot));
    page.steps_since_access = 0;
    page.accesses = age_steps;
    page.attention_mass = pager->PageMass(seq.slot, block_index);
    // A running page is rebuilt from its checkpoints at every step that reads it; from tokens it
    // cannot be (that would rerun the whole prefix each step).
    costs.available_actions &= ~(1u << static_cast<int>(KvAction::kRecomputeTokens));
  } else {
    page.accesses = 1;
    // The sequence resumes as soon as blocks free up: every one of its pages will be read again.
    page.steps_since_access = 0;
    costs.available_actions &= ~((1u << static_cast<int>(KvAction::kCompressInt8)) |
                                 (1u << static_cast<int>(KvAction::kCompressInt4)) |
                                 (1u << static_cast<int>(KvAction::kEvict)));
  }
  const size_t b = static_cast<size_t>(block_index);
  if (b < seq.checkpoint_missing.size() && seq.checkpoint_missing[b]) {
    costs.available_actions &= ~(1u << static_cast<int>(KvAction::kRecomputeResidual));
  }
  const KvDecision d = ChooseKvAction(page, costs, o);
  if (policy.automatic || !d.costs[static_cast<size_t>(action)].allowed) action = d.action;
  *predicted_ms = d.costs[static_cast<size_t>(action)].bring_back_ms;
  if (options.explain) {
    fmt::print(stderr, "kvl: explain: request {} {} page {} (tokens {}-{}) -> {}\n{}", seq.id,
               running ? "running" : "preempted", block_index, page.first_position,
               page.first_position + options.block_tokens - 1, KvActionName(action), d.Explain());
  }
  return action;
}

void Engine::Impl::CountPageAction(KvAction action) {
  std::lock_guard<std::mutex> lock(metrics_mutex);
  KvActionCounter& counter = action_counters[static_cast<size_t>(action)];
  ++counter.pages;
  counter.bytes += storage->layout().kv_bytes();
}

bool Engine::Impl::RelievePressure(int64_t blocks_short) {
  if (!pages_running_sequences) return false;
  // Candidates: full pages outside the attention sinks and the recent window, coldest first
  // (least attention mass per step; then oldest). Resident pages this sequence alone holds are
  // acted on by the policy; compressed pages are the last resort, evicted when nothing resident
  // is left to act on.
  struct Candidate {
    Sequence* seq;
    int64_t block_index;
    double mass;
  };
  std::vector<Candidate> resident, compressed;
  const int64_t bt = options.block_tokens;
  const int64_t recent_blocks = std::min((recent_tokens + bt - 1) / bt, kv->num_blocks() / 4);
  const int64_t sink_blocks = (sink_tokens + bt - 1) / bt;
  for (auto& seq : running) {
    if (seq->slot < 0 || !kv->Contains(seq->slot)) continue;
    const std::vector<BlockId>& table = kv->block_table(seq->slot);
    const int64_t full_blocks = kv->num_tokens(seq->slot) / bt;
    // The last block (written next) and the recent window stay.
    const int64_t end =
        std::min<int64_t>(full_blocks, static_cast<int64_t>(table.size()) - 1) - recent_blocks;
    for (int64_t b = sink_blocks; b < end; ++b) {
      const BlockId block = table[static_cast<size_t>(b)];
      const Candidate c{seq.get(), b, pager->PageMass(seq->slot, b)};
      if (block != kNoBlock && kv->refcount(block) == 1) resident.push_back(c);
      if (block == kNoBlock && pager->IsCompressed(seq->slot, b)) compressed.push_back(c);
    }
  }
  auto coldest_first = [](const Candidate& a, const Candidate& b) { return a.mass < b.mass; };
  std::stable_sort(resident.begin(), resident.end(), coldest_first);
  std::stable_sort(compressed.begin(), compressed.end(), coldest_first);
  const int64_t free_before = kv->stats().blocks_free;
  auto enough = [&] { return kv->stats().blocks_free - free_before >= blocks_short; };
  bool acted = false;
  for (const Candidate& c : resident) {
    if (enough()) break;
    double predicted = 0;
    const KvAction action = ChoosePageAction(*c.seq, c.block_index, /*running=*/true, &predicted);
    if (action == KvAction::kKeep) continue;
    KvTier* tier = action == KvAction::kDemoteRam || action == KvAction::kRecomputeResidual
                       ? ram_tier.get()
                   : action == KvAction::kDemoteDisk ? disk_tier.get()
                                                     : nullptr;
    if (!pager->DetachPage(c.seq->slot, c.block_index, action, tier)) continue;
    acted = true;
    CountPageAction(action);
  }
  if (acted) return true;
  for (const Candidate& c : compressed) {
    if (enough()) break;
    if (!pager->EvictCompressedPage(c.seq->slot, c.block_index)) continue;
    if (options.explain) {
      fmt::print(stderr, "kvl: explain: request {} compressed page {} -> evict (the pool holds "
                 "only compressed pages)\n", c.seq->id, c.block_index);
    }
    acted = true;
    CountPageAction(KvAction::kEvict);
  }
  return acted;
}

void Engine::Impl::Preempt(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running[running_index]);
  running.erase(running.begin() + static_cast<std::ptrdiff_t>(running_index));
  // Each computed full page is demoted or dropped (recomputed from its tokens at resume). A paged
  // sequence (pages already compressed, streamed or evicted while it ran) is recomputed whole:
  // that gives back exact KV whatever happened to its pages.
  seq->demoted.clear();
  seq->recompute_predicted_ms.clear();
  const bool paged = kv->IsPaged(seq->slot);
  const int64_t full_blocks = seq->num_computed / options.block_tokens;
  const std::vector<BlockId>& table = kv->block_table(seq->slot);
  for (int64_t b = 0; b < full_blocks; ++b) {
    double predicted = 0;
    const KvAction action = paged ? KvAction::kRecomputeTokens
                                  : ChoosePageAction(*seq, b, /*running=*/false, &predicted);
    const bool residual = action == KvAction::kRecomputeResidual;
    KvTier* tier = action == KvAction::kDemoteRam || residual ? ram_tier.get()
                   : action == KvAction::kDemoteDisk          ? disk_tier.get()
                                                              : nullptr;
    bool demoted = false;
    if (tier != nullptr) {
      // K/V layer pages, or for a residual page the layers' checkpoints; a full tier: drop.
      uint64_t page_id = 0;
      demoted = pager->WriteLayerPages(table[static_cast<size_t>(b)], tier, residual, &page_id);
      if (demoted) seq->demoted.push_back({b, tier, page_id, action, predicted});
    }
    if (!demoted) seq->recompute_predicted_ms.push_back(predicted);
    CountPageAction(demoted ? action : KvAction::kRecomputeTokens);
  }
  pager->DropSequence(seq->slot);
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
  // Prefill chunks shrink when a sequence pages through a pool smaller than one chunk.
  int64_t prefill_cap = max_tokens;
  for (;;) {
    steps.clear();
    step_seqs.clear();
    int64_t budget = max_tokens;
    for (bool decode_pass : {true, false}) {
      for (auto& seq : running) {
        const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->num_computed;
        if (remaining <= 0 || (remaining == 1) != decode_pass || budget == 0) continue;
        const int64_t n = std::min({remaining, budget, decode_pass ? remaining : prefill_cap});
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
      // Demoted pages right after the cached prefix are promoted instead of computed (never the
      // page holding the last token: its logits are needed).
      const int64_t bt = options.block_tokens;
      int64_t restore = 0;
      for (const DemotedPage& page : seq->demoted) {
        if (page.block_index * bt < cached) continue;
        if (page.block_index * bt != cached + restore || cached + restore + bt > len - 1) break;
        restore += bt;
      }
      seq->restore_tokens = restore;
      const int64_t n = std::min({len - cached - restore, budget, prefill_cap});
      const SeqId slot = free_slots[free_slots.size() - 1 - admissions];
      steps.push_back({slot, std::span<const int32_t>(seq->tokens).first(static_cast<size_t>(cached + restore + n))});
      step_seqs.push_back(seq.get());
      budget -= n;
      ++admissions;
    }
    if (steps.empty()) return false;
    // Recompute is priced against the step's own arithmetic: busy in prefill, idle in decode.
    step_has_prefill = false;
    for (const KvSeqStep& step : steps) step_has_prefill |= step.tokens.size() > 1;
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
    const int64_t blocks_short = plan->blocks_needed + plan->blocks_reused_free - plan->blocks_free;
    if (admissions > 0 && !running.empty()) {
      max_admissions = admissions - 1;  // the newest admission waits for a later step
      continue;
    }
    // Running sequences' coldest pages are compressed, demoted or evicted (the lattice), before
    // anything is preempted.
    if (RelievePressure(blocks_short)) continue;
    if (pages_running_sequences && prefill_cap > options.block_tokens) {
      prefill_cap = std::max<int64_t>(options.block_tokens, prefill_cap / 2);
      continue;
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
      max_admissions = admissions - 1;
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
               "--kv-budget{}",
               kv->num_blocks(), options.block_tokens, seq.tokens.size(),
               pages_running_sequences
                   ? ""
                   : ", or let its pages move: --kv-policy auto with --kv-tier ram:SIZE "
                     "(lossless) or with --kv-quality balanced")));
    ReleaseFinished();
    max_admissions = waiting.size();
  }
}

int64_t Engine::Impl::RestorePages(Sequence& seq, int64_t first_block, int64_t num_blocks) {
  const Clock::time_point start = Clock::now();
  const KvBlockLayout& layout = storage->layout();
  const std::vector<BlockId>& table = kv->block_table(seq.slot);
  int64_t restored = 0;
  TokenBatch rebuild;  // positions whose K/V come back from residual checkpoints
  for (int64_t b = first_block; b < first_block + num_blocks; ++b) {
    auto page = std::find_if(seq.demoted.begin(), seq.demoted.end(),
                             [b](const DemotedPage& p) { return p.block_index == b; });
    KVL_CHECK(page != seq.demoted.end());
    const bool residual = page->action == KvAction::kRecomputeResidual;
    const BlockId block = table[static_cast<size_t>(b)];
    if (!pager->ReadLayerPages(block, page->tier, residual, page->page_id).ok()) {
      // Never wrong bytes: a corrupt or failed read is recomputed from tokens by this step.
      std::lock_guard<std::mutex> lock(metrics_mutex);
      ++checksum_failures;
      break;
    }
    if (residual) {
      for (int64_t p = b * options.block_tokens; p < (b + 1) * options.block_tokens; ++p) {
        rebuild.Add(seq.tokens[static_cast<size_t>(p)], p, seq.slot, false);
      }
    } else if (layout.residual_dim > 0) {
      if (seq.checkpoint_missing.size() <= static_cast<size_t>(b)) {
        seq.checkpoint_missing.resize(static_cast<size_t>(b) + 1, false);
      }
      seq.checkpoint_missing[static_cast<size_t>(b)] = true;
    }
    ++restored;
  }
  // K and V of every layer rebuilt from the checkpoints: one RmsNorm, two projections and RoPE
  // per layer, bit-identical to what the forward pass stored.
  const int64_t chunk = forward->options().max_batch_tokens;
  for (int64_t begin = 0; begin < rebuild.size(); begin += chunk) {
    TokenBatch part;
    for (int64_t t = begin; t < std::min(rebuild.size(), begin + chunk); ++t) {
      const size_t k = static_cast<size_t>(t);
      part.Add(rebuild.tokens[k], rebuild.positions[k], rebuild.seq_ids[k], false);
    }
    forward->RebuildKvFromResiduals(part, *cache);
  }
  const double ms = MillisecondsBetween(start, Clock::now());
  {
    std::lock_guard<std::mutex> lock(metrics_mutex);
    for (const DemotedPage& page : seq.demoted) {
      if (page.block_index < first_block || page.block_index >= first_block + restored) continue;
      KvActionCounter& counter = action_counters[static_cast<size_t>(page.action)];
      ++counter.pages_restored;
      counter.predicted_ms += page.predicted_ms;
      counter.measured_ms += ms / static_cast<double>(std::max<int64_t>(1, restored));
    }
  }
  for (const DemotedPage& page : seq.demoted) pager->EraseTierPage(page.tier, page.page_id);
  seq.demoted.clear();
  return restored * options.block_tokens;
}

void Engine::Impl::RunForwardAndSample(const KvPlan& plan) {
  batch.Clear();
  int64_t prefill_tokens = 0;
  int64_t recompute_tokens = 0;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < step_seqs.size(); ++i) {
    Sequence& seq = *step_seqs[i];
    const KvPlan::SeqPlan& sp = plan.seqs[i];
    if (sp.admit) {
      pager->StartSequence(seq.slot);
      seq.num_computed = sp.num_cached_tokens;
      if (seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = sp.num_cached_tokens;
      if (seq.restore_tokens > 0) {
        seq.num_computed += RestorePages(seq, seq.num_computed / options.block_tokens,
                                         seq.restore_tokens / options.block_tokens);
        seq.restore_tokens = 0;
      }
      seq.demoted.clear();
      recompute_tokens += static_cast<int64_t>(seq.recompute_predicted_ms.size());
    }
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

  // A failed promotion can leave more tokens than one forward takes: run them in chunks. Each
  // sequence samples from the chunk that holds its last token; samplers are independent, so the
  // order does not matter.
  const int64_t chunk = forward->options().max_batch_tokens;
  size_t next_seq = 0;
  TokenBatch part;
  for (int64_t begin = 0; begin < batch.size(); begin += chunk) {
    const int64_t end = std::min(batch.size(), begin + chunk);
    const TokenBatch* run = &batch;
    if (begin > 0 || end < batch.size()) {
      part.Clear();
      for (int64_t t = begin; t < end; ++t) {
        const size_t k = static_cast<size_t>(t);
        part.Add(batch.tokens[k], batch.positions[k], batch.seq_ids[k], batch.want_logits[k]);
      }
      run = &part;
    }
    run_seqs.clear();
    for (int32_t id : run->seq_ids) {
      if (run_seqs.empty() || run_seqs.back() != id) run_seqs.push_back(id);
    }
    pager->BeginStep(run_seqs);
    forward->Run(*run, *cache);
    for (SeqId failed : pager->EndStep()) {
      for (Sequence* seq : step_seqs) {
        if (seq->slot == failed && !seq->stream_failed) {
          seq->stream_failed = true;
          to_recompute.push_back(seq);
        }
      }
    }
    int64_t row = 0;
    for (int64_t t = begin; t < end; ++t) {
      if (!batch.want_logits[static_cast<size_t>(t)]) continue;
      // The sequence whose last token this is: the next one in step order that samples.
      while (step_seqs[next_seq]->num_computed != static_cast<int64_t>(step_seqs[next_seq]->tokens.size())) {
        ++next_seq;
      }
      Sequence* seq = step_seqs[next_seq++];
      if (seq->stream_failed) {
        // A streamed page did not come back intact: this step's output is thrown away and the
        // sequence's KV recomputed from its tokens (the engine never samples from wrong bytes).
        ++row;
        continue;
      }
      const int32_t token = seq->sampler->Sample(forward->logits(row++), seq->tokens);
      AppendToken(*seq, token);
    }
  }
  for (Sequence* seq : to_recompute) {
    {
      std::lock_guard<std::mutex> lock(metrics_mutex);
      ++checksum_failures;
    }
    seq->stream_failed = false;
    for (size_t i = 0; i < running.size(); ++i) {
      if (running[i].get() == seq) {
        Preempt(i);  // a paged sequence: recomputed whole from its tokens
        break;
      }
    }
  }
  to_recompute.clear();
  if (recompute_tokens > 0) {
    // Pages dropped at preemption were just recomputed from their tokens within this step.
    const double ms = MillisecondsBetween(start, Clock::now());
    std::lock_guard<std::mutex> lock(metrics_mutex);
    KvActionCounter& counter = action_counters[static_cast<size_t>(KvAction::kRecomputeTokens)];
    for (Sequence* seq : step_seqs) {
      for (double predicted : seq->recompute_predicted_ms) {
        ++counter.pages_restored;
        counter.predicted_ms += predicted;
        counter.measured_ms += ms / static_cast<double>(recompute_tokens);
      }
      seq->recompute_predicted_ms.clear();
    }
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
    if (kv->Contains(seq.slot)) {
      pager->DropSequence(seq.slot);
      kv->Free(seq.slot);
    }
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
  const KvPagerStats paging = pager->stats();
  std::lock_guard<std::mutex> lock(metrics_mutex);
  kv_stats = stats;
  pager_stats = paging;
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
