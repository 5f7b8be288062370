// The Engine's parts and who owns them. Engine::Impl only wires them together and hands work
// between threads: requests arrive in the inbox from any thread; the step loop moves them to the
// scheduler, which plans a step, and the step runner carries it out.
//
//   Submit -> inbox -> Scheduler (admission, chunking, KV pressure through KvMemory's parts)
//   -> StepPlan -> StepRunner (commit, restores, Forward, sampling, events)
//   -> MetricsRecorder (read by Metrics() from any thread)
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "kvl/engine.h"
#include "kvl/forward.h"
#include "kvl/kv_memory.h"
#include "kvl/thread_pool.h"
#include "metrics_recorder.h"
#include "request.h"
#include "scheduler.h"
#include "speculator.h"
#include "step_runner.h"

namespace kvl {

struct Engine::Impl {
  // Whether a request of `prompt_tokens` and `max_new_tokens` (< 0: unlimited) can ever fit the
  // pool; an InvalidArgument naming the budget, the prompt and max_tokens where it cannot.
  Status CheckFitsBudget(int64_t prompt_tokens, int32_t max_new_tokens) const;

  EngineOptions options;
  int64_t context_length = 0;

  // The model and what runs it.
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ops::OpsContext> ops;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  // The longest token text: no token covers more bytes of a prompt (Submit's early length check).
  int64_t max_piece_bytes = 1;
  std::unique_ptr<Forward> forward;

  // KV memory: the pool, its tiers, the store, where each page is, and what decides.
  std::unique_ptr<KvMemory> memory;

  // The step loop's parts.
  MetricsRecorder metrics;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<Speculator> speculator;  // speculative decoding (issue 26); null: --spec off
  StepPlan step_plan;  // reused every step
  KvPagePlan promotion_plan;  // reused every step

  // Submission side, guarded by inbox_mutex.
  mutable std::mutex inbox_mutex;
  std::condition_variable inbox_cv;
  std::deque<std::unique_ptr<Sequence>> inbox;
  std::unordered_set<RequestId> cancel_requests;
  RequestId next_request_id = 1;
  int64_t requests_submitted = 0;
  std::unordered_set<RequestId> cancels;  // the step loop's copy, reused

  // Background loop.
  std::thread loop;
  std::atomic<bool> loop_running{false};

  bool StepImpl();
  void TakeInbox();
};

}  // namespace kvl
