// Carries out one planned step: opens its KV step (KvMemory::Open: blocks, copies, restores, the
// window's rows), runs the forward pass over the batch through it (in chunks when a failed
// promotion left more tokens than one run takes), samples, sends each token's event, and closes
// the KV step with what it measured.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <string>
#include <vector>

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
  KvMemory* memory = nullptr;  // every KV change goes through it (a step: Open, Forward, Close)
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
  // Rows the last Run computed (the speculator's step cost curve is by rows).
  int64_t last_rows() const { return batch_.size(); }

 private:
  // What a KV step (or a promotion) brought back or could not read, to the metrics.
  void CountApplied(const KvApplied& applied);
  // Opens the step's KV step and adds the tokens each sequence computes this step to batch_
  // (sliding-window layers: the window's rows a sequence does not hold first, KvStep::window_from).
  int64_t FillBatch(const StepPlan& plan);
  void RunBatch(const StepPlan& plan);
  void RecomputeFailedStreams();
  // `logits` is the row the token was sampled from (for the log-probabilities it asked for).
  void AppendToken(Sequence& seq, int32_t token, const float* logits);
  // Speculative decoding (step_runner_spec.cc): the sequence's step carried its draft as rows
  // from logits row `row` on; samples them in order while they agree with the draft, keeps the
  // K/V of the verified tokens and cuts the rest (KvStep::TruncateTail). Returns the next row.
  int64_t VerifyDraft(Sequence& seq, int64_t row);
  // The sequence is the one whose last token's logits come next: all its rows are in the run.
  static bool SamplesThisStep(const Sequence& seq) {
    return seq.num_computed == static_cast<int64_t>(seq.tokens.size()) + seq.spec.in_step;
  }

  StepRunnerParts p_;
  KvMemory& memory_;
  KvStep* step_ = nullptr;  // the KV step, open from FillBatch to the end of Run
  StepPlan plan_;           // reused every step
  int64_t block_tokens_;
  std::vector<KvStepRequest> kv_seqs_;  // per sequence of the step, for KvMemory::Open
  KvApplied promoted_;                  // what a promotion between steps brought back
  TokenBatch batch_;
  TokenBatch part_;                      // one chunk of batch_ when it exceeds one run
  std::vector<Sequence*> to_recompute_;  // streamed reads failed: recompute from tokens
  std::string piece_;  // the text of the token being appended, reused
  // VerifyDraft: the tokens sampled from the draft's rows and the rows they came from.
  std::vector<int32_t> verified_tokens_;
  std::vector<const float*> verified_logits_;
};

}  // namespace kvl
