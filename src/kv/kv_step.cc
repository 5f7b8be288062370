// A step's KV work from Open to Close (kvl/kv_step.h): the plan carried out, the window's rows,
// each forward run's staging, and the step's measurements fed back to the prices.
#include "kvl/kv_step.h"

#include <algorithm>
#include <chrono>

#include "kvl/kv_memory.h"

namespace kvl {

void KvStep::Open(const KvPlan& plan, std::span<const KvStepRequest> seqs) {
  KVL_CHECK_MSG(!open_, "a KV step opened before the last one was closed");
  open_ = true;
  seqs_.assign(seqs.begin(), seqs.end());
  const int64_t block_tokens = memory_.layout().block_tokens;
  slots_.clear();
  computed_to_.clear();
  full_blocks_before_.clear();
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const KvPlan::SeqPlan& sp = plan.seqs[i];
    const auto tokens = static_cast<int64_t>(sp.tokens.size());
    slots_.push_back(sp.seq);
    computed_to_.push_back(sp.admit ? tokens : seqs[i].computed_before + tokens);
    full_blocks_before_.push_back(seqs[i].computed_before / block_tokens);
  }
  discarded_.assign(plan.seqs.size(), 0);
  memory_.Apply(plan, seqs, &applied_);
  for (const KvRecomputedPage& page : applied_.recomputed) {
    pending_recompute_.push_back(
        {page.request, page.block, page.price.predicted_ms, page.price.model_ms});
  }
  // The window's rows after every sequence's pages are in place (a rebuild from checkpoints
  // reads them).
  window_from_.clear();
  for (size_t i = 0; i < slots_.size(); ++i) {
    window_from_.push_back(memory_.RestoreWindow(slots_[i], applied_.computed_from[i]));
  }
  positions_.clear();
  runs_ = 0;
}

KvCache& KvStep::BeginRun(std::span<const SeqId> row_slots,
                          std::span<const int64_t> row_positions) {
  KVL_CHECK_MSG(open_, "a forward run outside an open KV step");
  run_slots_.clear();
  for (size_t t = 0; t < row_slots.size();) {
    const SeqId slot = row_slots[t];
    size_t end = t + 1;
    while (end < row_slots.size() && row_slots[end] == slot) ++end;
    memory_.ClaimWindowRows(slot, row_positions[t], row_positions[end - 1] + 1);
    run_slots_.push_back(slot);
    t = end;
  }
  positions_.insert(positions_.end(), row_positions.begin(), row_positions.end());
  ++runs_;
  run_start_ = std::chrono::steady_clock::now();
  memory_.BeginForward(run_slots_);
  return memory_.forward_cache();
}

std::span<const SeqId> KvStep::EndRun() {
  const std::span<const SeqId> failed = memory_.EndForward();
  last_run_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - run_start_)
          .count();
  // Priced now, while every sequence of the run still holds its slot (sampling may finish one).
  last_run_rebuilds_ = memory_.InStepRebuilds();
  for (SeqId slot : failed) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i] != slot || discarded_[i]) continue;
      discarded_[i] = 1;
      // What this step wrote is wrong: never findable by prefix or in the store.
      memory_.DiscardWrites(slot, full_blocks_before_[i]);
    }
  }
  return failed;
}

void KvStep::TruncateTail(SeqId slot, int64_t tokens) { memory_.TruncateTail(slot, tokens); }

const KvStepReport& KvStep::Close(const KvStepMeasured& measured) {
  KVL_CHECK_MSG(open_, "closing a KV step that is not open");
  open_ = false;
  report_.rebuilt_in_step.reset();
  report_.recomputed.clear();
  // (Before a preemption can let a sequence's blocks go.)
  if (!measured.prefill && !positions_.empty()) MeasureRebuilds(measured);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (seqs_[i].finished != nullptr && *seqs_[i].finished) continue;
    memory_.FileUnreachablePages(slots_[i], full_blocks_before_[i]);
  }
  if (!pending_recompute_.empty() && !positions_.empty()) {
    MeasureRecomputedPages(measured.forward_ms);
  }
  memory_.PublishStoreStats();
  return report_;
}

void KvStep::MeasureRebuilds(const KvStepMeasured& measured) {
  // One row per sequence (no draft, no window rows) in one forward run: the calibrated decode
  // step applies, and the run's time is the step's.
  if (runs_ != 1 || positions_.size() != run_slots_.size()) return;
  InStepRebuildMeter::Step step;
  step.measured_ms = last_run_ms_;
  const double plain_ms = memory_.PlainDecodeStepMs(positions_);
  step.plain_model_ms = plain_ms > 0 ? plain_ms + measured.logits_ms : 0;
  step.rebuilds = last_run_rebuilds_;
  report_.rebuilt_in_step = in_step_meter_.Observe(step);
  if (!report_.rebuilt_in_step) return;
  // One event per step, whatever its page count (kvl/kv_price_feedback.h).
  in_step_rebuilt_.Add(kInStepRebuildFeedbackKey, report_.rebuilt_in_step->model_ms,
                       report_.rebuilt_in_step->measured_ms);
  memory_.FeedBack(in_step_rebuilt_);
}

double KvStep::TokenWeight(int64_t position) const {
  const double ms = memory_.TokenRecomputeMs(position);
  return ms > 0 ? ms : 1.0;
}

void KvStep::MeasureRecomputedPages(double forward_ms) {
  const int64_t block_tokens = memory_.layout().block_tokens;
  // The step also computes other sequences' tokens (decode tokens deep in their context, other
  // prefills), so a page's measured time is its share of the forward run by the cost model's
  // weight of each token: its own tokens' weight over the weight of every token of the step.
  // A split by token count alone would charge a page's shallow tokens for the attention of the
  // deep decode tokens beside it.
  double step_weight = 0;
  for (int64_t pos : positions_) step_weight += TokenWeight(pos);
  // A page recomputed from its tokens is a prefill chunk of the step: rows of the same forward
  // run as the other sequences' decode tokens, never a run of its own.
  bool beside_decode = false;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    beside_decode |= computed_to_[i] - applied_.computed_from[i] == 1;
  }
  size_t kept = 0;
  for (const PendingRecompute& page : pending_recompute_) {
    const int64_t first = page.block * block_tokens;
    bool done = false;  // measured, or no longer measurable as one page
    bool seen = false;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      if (seqs_[i].request != page.request) continue;
      seen = true;
      const int64_t from = applied_.computed_from[i];
      const int64_t to = computed_to_[i];
      if (first >= from && first + block_tokens <= to) {
        double page_weight = 0;
        for (int64_t pos = first; pos < first + block_tokens; ++pos) page_weight += TokenWeight(pos);
        const double page_ms = forward_ms * page_weight / step_weight;
        report_.recomputed.push_back({page.predicted_ms, page_ms, beside_decode});
        recomputed_.Add(static_cast<size_t>(KvAction::kRecomputeTokens), page.model_ms, page_ms);
        done = true;
      } else if (from > first) {
        done = true;  // split across two steps: its time is not one step's share
      }
    }
    // A sequence that sat this step out (preempted again, finished) is not followed further.
    if (!done && seen) pending_recompute_[kept++] = page;
  }
  pending_recompute_.resize(kept);
  memory_.FeedBack(recomputed_);
}

}  // namespace kvl
