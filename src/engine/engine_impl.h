// The Engine's parts and who owns them. Engine::Impl only wires them together and hands work
// between threads: requests arrive in the inbox from any thread; the step loop moves them to the
// scheduler, which plans a step, and the step runner carries it out.
//
//   Submit -> Inbox -> Scheduler (who runs, how many tokens; KV plans through KvMemory)
//   -> StepPlan -> StepRunner (KvMemory::Open, KvStep::Forward / Close, sampling, events)
//   -> MetricsRecorder (read by Metrics() from any thread)
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "constrained_sampling.h"
#include "inbox.h"
#include "kvl/engine.h"
#include "kvl/forward.h"
#include "kvl/kv_memory.h"
#include "kvl/thread_pool.h"
#include "metrics_recorder.h"
#include "profile_keeper.h"
#include "request.h"
#include "scheduler.h"
#include "spec_draft_model.h"
#include "speculator.h"
#include "step_runner.h"
#include "step_watchdog.h"

namespace kvl {

// The model and what runs it, loaded together (LoadModel).
struct EngineModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ops::OpsContext> ops;
  std::unique_ptr<Model> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  // The longest token text: no token covers more bytes of a prompt (Submit's early length check).
  int64_t max_piece_bytes = 1;
  int64_t context_length = 0;  // per sequence: -c, or the model's capped at 4096
};

struct Engine::Impl {
  // Whether a request of `prompt_tokens` and `max_new_tokens` (< 0: unlimited) can ever fit the
  // pool; an InvalidArgument naming the budget, the prompt and max_tokens where it cannot.
  Status CheckFitsBudget(int64_t prompt_tokens, int32_t max_new_tokens) const;
  // One step of the loop: the inbox drained, the step run, the gauges published. False when idle.
  bool StepImpl();

  EngineOptions options;
  EngineModel model;
  // The cost profile the KV layer prices with, once a decision asked for it (EnginePriceSource),
  // and where it lives; `profile_at_default_path`: found or saved at a default path, the only
  // kind ProfileKeeper keeps.
  std::optional<MachineProfile> profile;
  std::string profile_path;
  std::string profile_disk_dir;  // where the disk tier's file lives (calibrated there)
  bool profile_at_default_path = false;
  std::unique_ptr<KvPriceSource> prices;
  std::unique_ptr<Forward> forward;
  // KV memory: the pool, its tiers, the store, where each page is, and what decides.
  std::unique_ptr<KvMemory> memory;
  MetricsRecorder metrics;
  // The process's memory beyond the weights and the KV (EngineMetrics::kv_fixed_bytes): measured
  // at the end of Create, and again after the first step that ran the forward pass (the warm-up:
  // what the first run touches for the first time), the larger kept. Written by the step loop,
  // read by Metrics on any thread.
  std::atomic<int64_t> kv_fixed_bytes{0};
  bool kv_fixed_warmed = false;
  // Measures it now and keeps the larger (kv_fixed_bytes).
  void MeasureFixedBytes();
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<Speculator> speculator;  // speculative decoding (issue 26); null: --spec off
  Inbox inbox;                             // requests and cancellations from any thread
  GrammarVocabularyOnce grammar_vocabulary;  // built for the first request with a grammar
  // Writes the measured corrections back into the profile and measures the machine again when
  // they drift (null: no profile at a default path). Last: its worker reads the model.
  std::unique_ptr<ProfileKeeper> keeper;

  // The background step loop (Start / Stop), and the watchdog that checks it from a thread of
  // its own (so that a stall is counted while nobody asks).
  struct Loop {
    std::thread thread;
    std::atomic<bool> running{false};
    std::thread watchdog_thread;
    std::mutex watchdog_mutex;
    std::condition_variable watchdog_wake;  // Stop ends the watchdog thread's wait
  } loop;
  std::unique_ptr<StepWatchdog> watchdog;
};

}  // namespace kvl
