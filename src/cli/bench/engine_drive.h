// How the benches that run whole requests drive an engine (bench turns, bench lattice): a set of
// requests submitted together and stepped to their end, each request's tokens, timings and (when
// asked) log-probabilities kept, with a hook after every step for what a bench samples between
// steps (the pool's bytes, the process's memory).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kvl/engine.h"
#include "kvl/model.h"
#include "kvl/tokenizer.h"
#include "kvl/status.h"

namespace kvl::cli {

// One request as it ran.
struct DrivenReply {
  std::vector<int32_t> tokens;
  // Per token, when the request asked for top_logprobs: its most likely tokens, most likely first.
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  double ttft_ms = 0;   // submit to the first token (to the end, when there was none)
  double end_ms = 0;    // submit to the finished event
  std::string finish_reason;
  int64_t cached_prompt_tokens = 0;
  Status error;         // the request's own error (finish_reason "error")
};

// Submits every request at once and steps the engine until it is idle; `after_step` (if set)
// runs after each step with the step's index. A request the engine refuses to queue is an error
// here; an error in a running request is kept in its DrivenReply.
StatusOr<std::vector<DrivenReply>> DriveRequests(
    Engine& engine, std::vector<Request> requests,
    const std::function<void(int64_t step)>& after_step = {});

// A model loaded once for its shape and tokenizer, by a bench that scripts its workload before it
// makes its engines (each engine loads its own).
struct BenchModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
StatusOr<BenchModel> LoadBenchModel(const std::string& path);

// One short untimed request (BOS and two ids of the workload), so that the weights are paged in
// before anything is timed; it fills no block, so it caches nothing.
Status WarmUpEngine(Engine& engine, int32_t id_a, int32_t id_b);

// Pages each KV action took (indexed by KvAction) between two snapshots of the engine's metrics,
// and how a bench shows them: "demote 3, evict 1" ("-" for none), or a JSON object of the
// actions that took any.
using ActionPages = std::array<int64_t, kNumKvActions>;
ActionPages ActionPagesBetween(const EngineMetrics& before, const EngineMetrics& after);
std::string ActionPagesText(const ActionPages& pages);
nlohmann::json ActionPagesJson(const ActionPages& pages);

}  // namespace kvl::cli
