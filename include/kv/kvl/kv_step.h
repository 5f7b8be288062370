// One step's KV work as one object, the way llama.cpp's memory context is: KvMemory::Open carries
// out the step's plan (blocks, copies, admissions, store pages read in place, restores, the
// sliding window's rows) and returns the step; Forward wraps each forward run (the window rows it
// claims, the pages it stages layer by layer, the writes a failed streamed read spoils); Close
// ends it (pages the prefix index cannot reach filed in the KV store, rebuilds inside the step
// and pages recomputed from tokens measured against their prices and fed back, the store's
// statistics published). The engine, the scheduler's tests and the page-life property test all
// drive a step through these three calls, so the protocol is written once, here.
//
// Thread-safety: the step loop's, as KvMemory is.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvl/in_step_rebuild_meter.h"
#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_pager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_price_feedback.h"

namespace kvl {

class KvMemory;

// The request behind each sequence of a step, beyond its block plan (KvMemory::Open).
struct KvStepRequest {
  KvSequencePages* pages = nullptr;  // the request's page table (bound to the slot at admission)
  int64_t request = 0;               // for --kv-trace and the measured pages
  int64_t steps_left = -1;           // for --kv-trace: the most steps it may take after this one
  int64_t computed_before = 0;       // tokens it had computed before the step
  // Read at Close: the sequence finished within the step (its pages are not filed in the store:
  // a finished sequence's slot was let go, or is kept as a parked session). Null: never.
  const bool* finished = nullptr;
};

// One page brought back into the pool (a restore at admission, or a promotion between steps),
// for the engine's metrics; the trace and the price feedback already have it.
struct KvBroughtBack {
  KvAction action = KvAction::kKeep;  // what had put it where it was
  double predicted_ms = 0;            // the corrected price it was expected at
  double measured_ms = 0;
  int64_t store_tier = -1;            // a KV store page found at admission: the store's tier index
};

// A page an admission recomputes from its tokens (dropped at a preemption), priced as the step
// that computes it will be measured (KvStep::Close checks it against that step's time).
struct KvRecomputedPage {
  int64_t request = 0;
  int64_t block = 0;
  BringBackPrice price;
};

// What opening a step (or a promotion) brought back and could not read, for the metrics.
struct KvApplied {
  // Per sequence of the step: the first position the forward pass computes (after the cached
  // prefix, the pages read in place and the pages restored), and the tokens restored.
  std::vector<int64_t> computed_from;
  std::vector<int64_t> restored_tokens;
  std::vector<KvBroughtBack> brought_back;
  // One entry per read that failed: the pages it leaves to be recomputed (0: a promotion's page
  // stays in its tier).
  std::vector<int64_t> read_failures;
  std::vector<KvRecomputedPage> recomputed;  // admissions' dropped pages
  void Clear() {
    computed_from.clear();
    restored_tokens.clear();
    brought_back.clear();
    read_failures.clear();
    recomputed.clear();
  }
};

// What the engine measured of a step, for Close.
struct KvStepMeasured {
  double forward_ms = 0;  // every forward run of the step together (sampling included), wall time
  double logits_ms = 0;   // the last run's logits (the calibrated decode step does not ask them)
  bool prefill = false;   // the step computed prompt tokens: no calibrated decode step applies
};

// What Close measured, for the engine's metrics (the feedback already has it).
struct KvStepReport {
  // Rebuilds inside a decode step (InStepRebuildMeter): none where the step rebuilt nothing or
  // was no plain decode step.
  std::optional<InStepRebuildMeter::Measured> rebuilt_in_step;
  // Pages recomputed from their tokens that this step computed whole.
  struct Recomputed {
    double predicted_ms = 0;
    double measured_ms = 0;  // its share of the step's forward time, by the cost model's weights
    bool beside_decode = false;  // rows of a run that also decoded other sequences
  };
  std::vector<Recomputed> recomputed;
};

class KvStep {
 public:
  KvStep(const KvStep&) = delete;
  KvStep& operator=(const KvStep&) = delete;

  // --- Per sequence i of the step, in the plan's order ---
  size_t size() const { return seqs_.size(); }
  // The first position the forward pass computes.
  int64_t computed_from(size_t i) const { return applied_.computed_from[i]; }
  // The position after the last one it computes.
  int64_t computed_to(size_t i) const { return computed_to_[i]; }
  int64_t restored_tokens(size_t i) const { return applied_.restored_tokens[i]; }
  // Sliding-window layers: the sequence's tokens [window_from, computed_from) run ahead of its
  // own as window-rebuild rows (TokenBatch::AddWindowRebuild); equal where none run.
  int64_t window_from(size_t i) const { return window_from_[i]; }
  // What came back into the pool and what could not be read, for the metrics.
  const KvApplied& applied() const { return applied_; }

  // One forward run of the step: its rows (one slot and position each; a slot's rows together)
  // become the window rings' rows, its sequences' pages outside the pool are staged, then
  // `run(KvCache&)` computes it. Returns the sequences whose streamed reads failed: what the step
  // wrote for them is thrown away (never findable by prefix or in the store) and their output
  // must be too. The span lives until the next run.
  template <typename Run>
  std::span<const SeqId> Forward(std::span<const SeqId> row_slots,
                                 std::span<const int64_t> row_positions, Run&& run) {
    run(BeginRun(row_slots, row_positions));
    return EndRun();
  }

  // Speculative decoding's rollback (issue 26): `slot` keeps its first `tokens` tokens, the K/V
  // of the unverified ones after them is cut.
  void TruncateTail(SeqId slot, int64_t tokens);

  // Ends the step (after sampling, before any preemption): pages the step filled that the pool's
  // prefix index cannot reach (a page before them is in a tier) go to the KV store, so the next
  // turn finds the whole chain; a decode step's rebuilds inside it and the pages recomputed from
  // their tokens are measured and fed back to the prices; the store's statistics are published.
  const KvStepReport& Close(const KvStepMeasured& measured);

 private:
  friend class KvMemory;
  explicit KvStep(KvMemory& memory) : memory_(memory) {}

  void Open(const KvPlan& plan, std::span<const KvStepRequest> seqs);
  KvCache& BeginRun(std::span<const SeqId> row_slots, std::span<const int64_t> row_positions);
  std::span<const SeqId> EndRun();
  void MeasureRebuilds(const KvStepMeasured& measured);
  void MeasureRecomputedPages(double forward_ms);
  // What one token at `position` weighs in a forward run: the cost model's time for it, or 1
  // without prices (a split by tokens).
  double TokenWeight(int64_t position) const;

  KvMemory& memory_;
  bool open_ = false;
  std::vector<KvStepRequest> seqs_;
  std::vector<SeqId> slots_;
  std::vector<int64_t> computed_to_;
  std::vector<int64_t> window_from_;
  std::vector<int64_t> full_blocks_before_;  // full pages before the step
  std::vector<char> discarded_;              // its writes were thrown away this step
  KvApplied applied_;

  // The runs so far: every row's position (in order), the last run's sequences and cost.
  std::vector<int64_t> positions_;
  std::vector<SeqId> run_slots_;
  int64_t runs_ = 0;
  std::chrono::steady_clock::time_point run_start_;
  double last_run_ms_ = 0;
  KvInStepRebuilds last_run_rebuilds_;

  // Across steps: pages dropped at a preemption, awaiting the step that recomputes them from
  // their tokens: the prediction is checked against that step's time per token, so a page is
  // measured in the step (the prefill chunk) that really computes it, not in the resume's first.
  struct PendingRecompute {
    int64_t request = 0;
    int64_t block = 0;
    double predicted_ms = 0;
    double model_ms = 0;
  };
  std::vector<PendingRecompute> pending_recompute_;
  BringBackBatch recomputed_{kNumFeedbackKeys};
  InStepRebuildMeter in_step_meter_;
  BringBackBatch in_step_rebuilt_{kNumFeedbackKeys};
  KvStepReport report_;
};

}  // namespace kvl
