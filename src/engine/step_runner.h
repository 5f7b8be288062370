// Carries out one planned step: commits the KV plan, copies shared blocks, brings back the pages
// of resumed sequences, runs the forward pass over the batch (in chunks when a failed promotion
// left more tokens than one run takes), samples, and sends each token's event.
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
  KvMemory* memory = nullptr;  // the pool, pager, store, trace and price feedback
  Forward* forward = nullptr;
  const Tokenizer* tokenizer = nullptr;
  MetricsRecorder* metrics = nullptr;
  int64_t context_length = 0;
  Speculator* speculator = nullptr;  // speculative decoding (issue 26); null: --spec off
};

class StepRunner {
 public:
  explicit StepRunner(const StepRunnerParts& parts);

  void Run(const StepPlan& plan);
  // Between steps: the planned pages of running sequences brought back into the pool
  // (KvPager::PromoteBack), each checked against its predicted bring-back time as a resume's
  // restore is (metrics, --kv-trace, the feedback).
  void PromoteBack(PromotionPlan& plan);
  // Rows the last Run computed (the speculator's step cost curve is by rows).
  int64_t last_rows() const { return batch_.size(); }

 private:
  // A resumed sequence's kept pages promoted (or rebuilt) into its fresh blocks; returns the
  // tokens that really came back (a failed or corrupt read ends it: the rest is computed).
  int64_t RestorePages(Sequence& seq);
  // One page brought back into the pool (`page` as it was before), in the bring-back event that
  // restored_ gathers: counted against its prediction and traced. (A running sequence's page
  // promoted back is no hit of a KV store lookup: the store's counts are the resume's alone.)
  void CountBroughtBack(RequestId request, int64_t block, const KvPage& page, double page_ms);
  // Adds the tokens each sequence computes this step to batch_.
  int64_t FillBatch(const StepPlan& plan);
  void RunBatch(const StepPlan& plan);
  // Sliding-window layers (kvl/kv_window_release.h): a sequence about to compute from a prefix
  // whose local layers' rows it does not hold gets the last window's rows back first, from the
  // pool's checkpoints or by running its receptive field's tokens ahead of its own in batch_.
  void RebuildWindow(const Sequence& seq);
  // Before a forward run: each sequence's positions in it become its window ring's rows.
  void ClaimWindowRows(const TokenBatch& run);
  void RecomputeFailedStreams();
  // Pages a step filled that the pool's prefix index cannot reach (a page before them is in a
  // tier) go to the KV store too, so the next turn finds the whole chain.
  void SaveUnreachablePages(const StepPlan& plan);
  // --kv-trace: the full pages each sequence of the step reads, and which it computes.
  void TraceReads(const StepPlan& plan);
  // `logits` is the row the token was sampled from (for the log-probabilities it asked for).
  void AppendToken(Sequence& seq, int32_t token, const float* logits);
  // Speculative decoding (step_runner_spec.cc): the sequence's step carried its draft as rows
  // from logits row `row` on; samples them in order while they agree with the draft, keeps the
  // K/V of the verified tokens and cuts the rest (KvManager::TruncateTail). Returns the next row.
  int64_t VerifyDraft(Sequence& seq, int64_t row);
  // The sequence is the one whose last token's logits come next: all its rows are in the run.
  static bool SamplesThisStep(const Sequence& seq) {
    return seq.num_computed == static_cast<int64_t>(seq.tokens.size()) + seq.spec.in_step;
  }

  StepRunnerParts p_;
  // KvMemory's parts.
  KvManager* kv_;
  KvBlockStorage* storage_;
  KvPager* pager_;
  KvStore* store_;  // may be null
  PagedKvCache* cache_;
  KvTraceWriter* trace_;  // --kv-trace; may be null
  // Where measured bring-back times are fed back to the cost model, by FeedbackKey (null: not
  // fed).
  BringBackFeedback* feedback_;
  // The cost model's per-page prices: weigh a recomputed page's share of a step.
  const PageCostProfile* prices_;
  int64_t block_tokens_;
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
  // One event's pages for the feedback: restored by one call, recomputed from tokens in one step.
  BringBackBatch restored_{kNumFeedbackKeys};
  BringBackBatch recomputed_{kNumFeedbackKeys};
  // This step: per sequence, the positions it computes [from, to).
  struct ComputedRange {
    RequestId request = 0;
    int64_t from = 0, to = 0;
  };
  std::vector<ComputedRange> computed_;
  // Checks the pending recomputes this step covered against the forward run's time (ms).
  void CountRecomputedPages(double forward_ms);
  double TokenWeight(int64_t position) const;
  std::vector<double> restore_page_ms_;  // one restore call's time per page, reused
  std::vector<int64_t> full_blocks_before_;   // per sequence of the step: full pages before it
  std::string piece_;                    // the text of the token being appended, reused
  std::vector<int64_t> trace_from_;      // --kv-trace: per sequence, its first computed block
  std::vector<KvContentId> trace_contents_;
  std::vector<int64_t> trace_outside_;
  std::vector<int64_t> trace_evicted_;
  std::vector<KvPage> promoting_;  // PromoteBack: each page as it was before it came back
  // VerifyDraft: the tokens sampled from the draft's rows and the rows they came from.
  std::vector<int32_t> verified_tokens_;
  std::vector<const float*> verified_logits_;
};

}  // namespace kvl
