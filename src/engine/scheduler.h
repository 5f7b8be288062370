// The continuous-batching scheduler: which sequences run this step and how many tokens each,
// which waiting requests are admitted, and what leaves the pool when it is short. It plans; it
// never runs the model, tokenizes or samples (StepRunner does), so it is testable on a pool with
// no model behind it.
//
// Order of work in a step's token budget (vLLM-style continuous batching):
//   1. decodes of running sequences (one token each),
//   2. the next chunk of running sequences still in prefill (chunked prefill),
//   3. admissions from the waiting queue, FIFO, their prompts chunked to the budget left.
// When the plan does not fit the KV pool: the newest admissions wait first; then the running
// sequences' coldest pages leave the pool as the KV planner decides (compress, stream from a
// tier, keep as checkpoints, evict); then prefill chunks shrink (a sequence paging through a pool
// smaller than one chunk); then the most recently admitted running sequence is preempted (its
// pages demoted, checkpointed or dropped, and it is requeued at the front of the waiting queue).
// Between steps, once the pool has blocks to spare again, running sequences' pages that left it
// losslessly come back (PromoteBack, as KvMemory::Promote decides).
//
// Thread-safety: owned by the step loop.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvl/kv_memory.h"
#include "metrics_recorder.h"
#include "request.h"

namespace kvl {

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // tokens per forward step
  int32_t max_seqs = 16;           // sequences running at once (KV slots 0..max_seqs-1)
  // A finished sequence whose KV went lossy (compressed or evicted pages) keeps its slot as a
  // session, and a later request whose prompt starts with its tokens continues it, as far as
  // they agree (a chat's next turn resubmitting the history): that history is not prefilled
  // again and the pool stays at its budget, at the price of reusing approximate KV, which the
  // user accepted by choosing a lossy policy. A lossless sequence's pages are found again
  // exactly through the prefix cache and the KV store instead, so it is never parked. Sessions
  // give their slot and blocks back as soon as another request needs them.
  bool keep_lossy_sessions = false;
  // The context a sequence may grow to: with its max_tokens, the most steps it may still take,
  // which the KV reuse forecast orders pages by (0: unknown).
  int64_t context_length = 0;
  // Running sequences' pages held in a tier or as checkpoints come back into the pool between
  // steps when it has blocks to spare (EngineOptions::kv_promote_back).
  bool promote_back = true;
  // Set by another thread while a cancellation or a stop waits for the step loop (Inbox): a
  // Schedule in progress returns with nothing planned, so that the loop takes them at once
  // rather than after a long planning pass (null: never).
  const std::atomic<bool>* interrupt = nullptr;
};

// One step's work: a KV plan that fits, and per sequence the tokens it computes.
struct StepPlan {
  KvPlan kv;
  std::vector<KvSeqStep> steps;  // one per sequence of the step, in step order
  std::vector<Sequence*> seqs;   // the sequence of each step
  Phase phase = Phase::kDecode;  // prefill when any sequence computes more than one token
};

class Scheduler {
 public:
  // Every KV question and every change to a page goes through `memory` (plan, then apply).
  Scheduler(const SchedulerOptions& options, KvMemory& memory, MetricsRecorder& metrics);

  // A new request joins the back of the waiting queue.
  void Enqueue(std::unique_ptr<Sequence> seq);
  // Requests with these ids finish as "cancelled".
  void Cancel(const std::unordered_set<RequestId>& ids);

  // Plans the next step into *plan (its vectors reused); admissions become running. False when
  // there is nothing to run, or when options.interrupt was set. Requests that can never fit the
  // pool finish with an error here. Every pass of its planning loop either frees something
  // (pages or blocks, measured), asks for less (an admission fewer, a smaller chunk), preempts or
  // stops a sequence, so it ends in a bounded number of passes (last_schedule_passes).
  bool Schedule(StepPlan* plan);
  // Passes of the planning loop the last Schedule took (for tests that bound them).
  int64_t last_schedule_passes() const { return last_schedule_passes_; }

  // After a step: pages of running sequences held in a tier or as checkpoints come back into the
  // pool where it has blocks to spare (KvMemory::Promote decides how many and which), never
  // while a request waits (the free blocks are its). What came back goes to *out (cleared first).
  // False when nothing was planned (*out untouched).
  bool PromoteBack(KvApplied* out);

  // Preempts a running sequence (its pages saved or dropped, as the KV planner decides); it goes
  // to the front of the waiting queue.
  void Preempt(Sequence& seq);
  // Ends a request: its KV leaves the pool (or the tiers, if it was waiting), its last event is
  // sent. It leaves the queues at the next ReleaseFinished.
  void Finish(Sequence& seq, FinishReason reason, Status error = Status::Ok());
  void ReleaseFinished();
  // Every parked session lets its KV go as a finished request's does (durable tiers get its exact
  // pages): at shutdown, so that a restart finds what a parked session held.
  void ReleaseParkedSessions();

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t num_parked() const { return static_cast<int64_t>(parked_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // The running sequences, in admission order (read between steps, e.g. for their page maps).
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }

 private:
  // Fills plan->steps / seqs for the running sequences and up to max_admissions admissions;
  // returns how many admissions it took.
  size_t FillSteps(size_t max_admissions, int64_t prefill_cap, int64_t restore_cap,
                   StepPlan* plan);
  // Tokens from position `from` that pages awaiting restore cover, at most `cap`.
  int64_t RestorableTokens(const Sequence& seq, int64_t from, int64_t cap) const;
  // Whether pages awaiting restore start at `from`: a chunk that stops before them computes
  // nothing, so that they are promoted by the next chunk rather than computed.
  bool RestoresAhead(const Sequence& seq, int64_t from) const;
  // Waiting requests that continue a parked session take its slot and KV and run; then parked
  // sessions give their slots back to the requests still waiting for one.
  void AdoptParkedSessions();
  // Leading tokens of `seq` a parked session can give it: every token it computed when they all
  // agree, else the whole pages before they part.
  int64_t ContinuableTokens(const Sequence& session, const Sequence& seq) const;
  // A parked session goes: its KV leaves the pool as a finished request's does.
  void Unpark(size_t parked_index);
  // A finished or parked sequence's slot: pages written through to durable tiers, the KV let go.
  void ReleaseSlot(Sequence& seq);
  // The most steps a running sequence may still take (its max_tokens, the context); -1 unknown.
  int64_t StepsLeft(const Sequence& seq) const;
  bool RelievePressure(int64_t blocks_short, Phase phase);
  void PreemptAt(size_t running_index);
  void CountAppliedActions(const KvPagePlan& plan);
  // Waiting sequences let go of the tier pages they hold (kept at their preemption, or found in
  // the store for their admission; KvMemory::ReleaseWaiting): store pages become cached ones a
  // tier may evict, the rest are erased. `ram_only`: only the sequences holding pages in the RAM
  // tier. `ask_store_again`: they look their pages up in the store again at their next admission
  // (otherwise they compute what the prefix cache lacks). Returns the pages let go.
  int64_t ReleaseWaitingTierPages(bool ram_only, bool ask_store_again);
  bool Interrupted() const { return options_.interrupt != nullptr && options_.interrupt->load(); }
  // The RAM tier (if any) has no room for one more page without evicting.
  bool RamTierFull() const;
  // Finishes the sequence that can never fit this pool with an error naming the budget.
  void FinishTooBig(Sequence& seq, bool prompt_only);

  SchedulerOptions options_;
  KvMemory& memory_;
  KvMemoryView kv_;  // memory_, read only
  MetricsRecorder& metrics_;
  int64_t block_tokens_;

  std::deque<std::unique_ptr<Sequence>> waiting_;   // not admitted (new or preempted), FIFO
  std::vector<std::unique_ptr<Sequence>> running_;  // admitted, in admission order
  std::vector<std::unique_ptr<Sequence>> parked_;   // lossy sessions, oldest first
  std::vector<SeqId> free_slots_;
  Phase phase_ = Phase::kDecode;                    // of the step being planned
  std::vector<KvPlannedSeq> planned_running_;       // reused
  int64_t last_schedule_passes_ = 0;
};

}  // namespace kvl
