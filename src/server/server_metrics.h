// What the server measures per request (latency histograms, token counts, how requests ended)
// and the Prometheus text exposition of it together with Engine::Metrics(). Names are prefixed
// `kvl:` as vLLM prefixes `vllm:`; beside them, the series routers read under vLLM's own names
// (the Gateway API Inference Extension's model-server protocol: vllm:num_requests_waiting, ...).
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kvl/engine.h"

namespace kvl::server {

// A Prometheus histogram over fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // _bucket{le=...} lines (cumulative, then +Inf), _sum and _count.
  void Render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds + 1]: the last is above every bound
  double sum_ = 0;
  int64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  // A request's end: its tokens and the OpenAI finish reason ("stop", "length", "abort", ...).
  void ObserveFinished(double e2e_seconds, int64_t prompt_tokens, int64_t cached_tokens,
                       int64_t generated_tokens, const std::string& finish_reason);
  void CountHttpError(int status);
  void CountDisconnectCancel();

  // `block_tokens`: the pool's block size (vllm:cache_config_info's block_size).
  std::string Render(const EngineMetrics& engine, int64_t block_tokens = 16) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  int64_t prompt_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  int64_t disconnect_cancels_ = 0;
  std::map<std::string, int64_t> finished_;    // by finish reason
  std::map<int, int64_t> http_errors_;         // by status
};

}  // namespace kvl::server
