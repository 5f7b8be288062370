// Carries out one planned step: applies its KV plan through KvMemory (blocks, copies, restores),
// runs the forward pass over the batch (in chunks when a failed promotion left more tokens than
// one run takes), samples, and sends each token's event.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <string>
#include <vector>

#include "in_step_rebuild_meter.h"
#include "kvl/forward.h"
#include "kvl/kv_memory.h"
#include "kvl/tokenizer.h"
#include "metrics_recorder.h"
#include "request.h"
#include "scheduler.h"
#include "speculator.h"

namespace kvl {

// What a step runs on (none owned).
struct StepRunnerParts {
  Scheduler* scheduler = nullptr;
  KvMemory* memory = nullptr;  // every KV change goes through it (plan, then apply)
  Forward* forward = nullptr;
  const Tokenizer* tokenizer = nullptr;
  MetricsRecorder* metrics = nullptr;
  int64_t context_length = 0;
  Speculator* speculator = nullptr;  // speculative decoding (issue 26); null: --spec off
  int32_t max_seqs = 16;             // sequences in one step (the reused plans are sized for them)
  int64_t draft_max = 0;  // draft tokens a decode may carry (speculative decoding; 0: off)
};

class StepRunner {
 public:
  explicit StepRunner(const StepRunnerParts& parts);

  // One step of the loop: the scheduler plans who runs and how many tokens, the plan runs,
  // finished requests leave, and pages come back into the pool between steps. False when there
  // was nothing to run.
  bool Step();
  void Run(const StepPlan& plan);
  // Between steps: the planned pages of running sequences brought back into the pool
  // (KvMemory::Apply), each checked against its predicted bring-back time as a resume's restore
  // is (metrics here; --kv-trace and the feedback in KvMemory).
  void PromoteBack(KvPagePlan& plan);
  // Rows the last Run computed (the speculator's step cost curve is by rows).
  int64_t last_rows() const { return batch_.size(); }

 private:
  // What applying the KV plan brought back or could not read, to the metrics.
  void CountApplied();
  // Applies the step's KV plan and adds the tokens each sequence computes this step to batch_.
  int64_t FillBatch(const StepPlan& plan);
  void RunBatch(const StepPlan& plan);
  // Sliding-window layers (kvl/kv_window_release.h): a sequence about to compute from a prefix
  // whose local layers' rows it does not hold gets the last window's rows back first
  // (KvMemory::RestoreWindow: from the pool's checkpoints, or by running its receptive field's
  // tokens ahead of its own in batch_).
  void RebuildWindow(const Sequence& seq);
  // Before a forward run: each sequence's positions in it become its window ring's rows.
  void ClaimWindowRows(const TokenBatch& run);
  void RecomputeFailedStreams();
  // Pages a step filled that the pool's prefix index cannot reach (a page before them is in a
  // tier) go to the KV store too, so the next turn finds the whole chain.
  void SaveUnreachablePages(const StepPlan& plan);
  // `logits` is the row the token was sampled from (for the log-probabilities it asked for).
  void AppendToken(Sequence& seq, int32_t token, const float* logits);
  // Speculative decoding (step_runner_spec.cc): the sequence's step carried its draft as rows
  // from logits row `row` on; samples them in order while they agree with the draft, keeps the
  // K/V of the verified tokens and cuts the rest (KvMemory::TruncateTail). Returns the next row.
  int64_t VerifyDraft(Sequence& seq, int64_t row);
  // The sequence is the one whose last token's logits come next: all its rows are in the run.
  static bool SamplesThisStep(const Sequence& seq) {
    return seq.num_computed == static_cast<int64_t>(seq.tokens.size()) + seq.spec.in_step;
  }

  StepRunnerParts p_;
  KvMemory& memory_;
  StepPlan plan_;         // reused every step
  KvPagePlan promotion_;  // reused every step
  int64_t block_tokens_;
  std::vector<KvStepSeq> kv_seqs_;  // per sequence of the step, for KvMemory::Apply
  KvApplied applied_;               // what applying the step (or a promotion) did
  TokenBatch batch_;
  TokenBatch part_;                      // one chunk of batch_ when it exceeds one run
  std::vector<SeqId> run_seqs_;          // sequences of one forward run
  std::vector<Sequence*> to_recompute_;  // streamed reads failed: recompute from tokens
  // Pages dropped at a preemption, awaiting the step that recomputes them from their tokens: the
  // prediction is checked against that step's time per token, so a page is measured in the step
  // (the prefill chunk) that really computes it, not in the resume's first one.
  struct PendingRecompute {
    RequestId request = 0;
    int64_t block = 0;
    double predicted_ms = 0;
    double model_ms = 0;
  };
  std::vector<PendingRecompute> pending_recompute_;
  // One step's pages recomputed from tokens, for the feedback.
  BringBackBatch recomputed_{kNumFeedbackKeys};
  // This step: per sequence, the positions it computes [from, to).
  struct ComputedRange {
    RequestId request = 0;
    int64_t from = 0, to = 0;
  };
  std::vector<ComputedRange> computed_;
  // Checks the pending recomputes this step covered against the forward run's time (ms).
  void CountRecomputedPages(double forward_ms);
  // A decode step (one row per sequence, one forward run): the pages it rebuilt from checkpoints
  // inside, measured against its calibrated time without them (InStepRebuildMeter), to the
  // metrics and the feedback; a plain one refines the meter's baseline.
  void MeasureRebuildsInStep();
  InStepRebuildMeter in_step_meter_;
  BringBackBatch in_step_rebuilt_{kNumFeedbackKeys};
  double last_run_ms_ = 0;  // the last forward run, BeginForward to EndForward
  KvInStepRebuilds last_run_rebuilds_;  // the pages it rebuilt inside, priced
  double TokenWeight(int64_t position) const;
  std::vector<int64_t> full_blocks_before_;   // per sequence of the step: full pages before it
  std::string piece_;                         // the text of the token being appended, reused
  // VerifyDraft: the tokens sampled from the draft's rows and the rows they came from.
  std::vector<int32_t> verified_tokens_;
  std::vector<const float*> verified_logits_;
};

}  // namespace kvl
