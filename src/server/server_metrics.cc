#include "server_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

namespace kvl::server {
namespace {

// The bounds vLLM uses for its latency histograms, in seconds.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                         0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
const std::vector<double> kItlBounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                        0.2,   0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
const std::vector<double> kE2eBounds = {0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0,
                                        15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0};

void Header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <typename T>
void Metric(std::string* out, const char* name, const char* type, const char* help, T value) {
  Header(out, name, type, help);
  *out += fmt::format("{} {}\n", name, value);
}

// A label value with \, " and newlines escaped, as the text format wants.
std::string LabelValue(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// One family per field of KvTierMetrics, a sample per tier labelled tier="<name>".
struct TierFamily {
  const char* name;
  const char* type;
  const char* help;
  double (*value)(const KvTierMetrics&);
};
constexpr TierFamily kTierFamilies[] = {
    {"kvl:kv_tier_capacity_bytes", "gauge", "KV tier capacity.",
     [](const KvTierMetrics& t) { return double(t.capacity_bytes); }},
    {"kvl:kv_tier_bytes_used", "gauge", "KV tier bytes in use.",
     [](const KvTierMetrics& t) { return double(t.bytes_used); }},
    {"kvl:kv_tier_pages", "gauge", "Layer pages the KV tier holds.",
     [](const KvTierMetrics& t) { return double(t.pages); }},
    {"kvl:kv_tier_lookups_total", "counter", "Prefix lookups that reached the KV tier.",
     [](const KvTierMetrics& t) { return double(t.lookups); }},
    {"kvl:kv_tier_hits_total", "counter", "Prefix blocks found in the KV tier.",
     [](const KvTierMetrics& t) { return double(t.hit_blocks); }},
    {"kvl:kv_tier_hit_tokens_total", "counter", "Prompt tokens of the blocks found in the KV tier.",
     [](const KvTierMetrics& t) { return double(t.hit_tokens); }},
    {"kvl:kv_tier_pages_in_total", "counter", "Layer pages written to the KV tier.",
     [](const KvTierMetrics& t) { return double(t.pages_in); }},
    {"kvl:kv_tier_bytes_in_total", "counter", "Bytes written to the KV tier.",
     [](const KvTierMetrics& t) { return double(t.bytes_in); }},
    {"kvl:kv_tier_pages_out_total", "counter", "Layer pages read from the KV tier.",
     [](const KvTierMetrics& t) { return double(t.pages_out); }},
    {"kvl:kv_tier_bytes_out_total", "counter", "Bytes read from the KV tier.",
     [](const KvTierMetrics& t) { return double(t.bytes_out); }},
    {"kvl:kv_tier_checksum_failures_total", "counter",
     "Reads from the KV tier that failed their checksum.",
     [](const KvTierMetrics& t) { return double(t.checksum_failures); }},
    {"kvl:kv_tier_evictions_total", "counter", "Pages the KV tier dropped to make room.",
     [](const KvTierMetrics& t) { return double(t.evictions); }},
    {"kvl:kv_tier_errors_total", "counter", "KV tier transfers that failed (I/O, connection).",
     [](const KvTierMetrics& t) { return double(t.errors); }},
    {"kvl:kv_tier_blocks_promoted_total", "counter",
     "Blocks promoted from the KV tier to the pool.",
     [](const KvTierMetrics& t) { return double(t.blocks_promoted); }},
    {"kvl:kv_tier_promote_predicted_seconds_total", "counter",
     "Promotion time from the KV tier the cost model predicted.",
     [](const KvTierMetrics& t) { return t.promote_ms_predicted / 1000.0; }},
    {"kvl:kv_tier_promote_seconds_total", "counter", "Promotion time from the KV tier, measured.",
     [](const KvTierMetrics& t) { return t.promote_ms_measured / 1000.0; }},
};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  *out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

ServerMetrics::ServerMetrics() : ttft_(kTtftBounds), itl_(kItlBounds), e2e_(kE2eBounds) {}

void ServerMetrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void ServerMetrics::ObserveInterTokenLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(seconds);
}

void ServerMetrics::ObserveFinished(double e2e_seconds, int64_t prompt_tokens,
                                    int64_t cached_tokens, int64_t generated_tokens,
                                    const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(e2e_seconds);
  prompt_tokens_ += prompt_tokens;
  cached_prompt_tokens_ += cached_tokens;
  generation_tokens_ += generated_tokens;
  ++finished_[finish_reason];
}

void ServerMetrics::CountHttpError(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_errors_[status];
}

void ServerMetrics::CountDisconnectCancel() {
  std::lock_guard<std::mutex> lock(mu_);
  ++disconnect_cancels_;
}

// The series KV-aware routers and gateways scrape, under vLLM's names: the Gateway API Inference
// Extension's model-server protocol (TotalQueuedRequests, TotalRunningRequests,
// KVCacheUtilization, LoRA info, cache config), which llm-d's and the GIE's endpoint pickers read,
// and vLLM V1's prefix-cache counters (tokens). The same figures as the kvl: series beside them.
namespace {

void RenderVllmSeries(const EngineMetrics& m, int64_t block_tokens, double usage,
                      std::string* out) {
  Metric(out, "vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted.",
         m.requests_waiting);
  Metric(out, "vllm:num_requests_running", "gauge", "Requests in the running batch.",
         m.requests_running);
  Metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV pool usage ratio (1 = full).", usage);
  Metric(out, "vllm:gpu_cache_usage_perc", "gauge",
         "KV pool usage ratio (1 = full): vLLM's older name, still read by some routers.", usage);
  Metric(out, "vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", m.kv.prefix_query_tokens);
  Metric(out, "vllm:prefix_cache_hits_total", "counter",
         "Prompt tokens found in the prefix cache.", m.kv.prefix_hit_tokens);
  Metric(out, "vllm:gpu_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache (vLLM's older name).",
         m.kv.prefix_query_tokens);
  Metric(out, "vllm:gpu_prefix_cache_hits_total", "counter",
         "Prompt tokens found in the prefix cache (vLLM's older name).", m.kv.prefix_hit_tokens);
  Metric(out, "vllm:num_preemptions_total", "counter", "Sequences preempted.", m.preemptions);
  // kvl serves no LoRA adapters: the info series says so (empty lists), as vLLM's does.
  Header(out, "vllm:lora_requests_info", "gauge", "Running stats on LoRA requests.");
  *out += "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\","
          "waiting_lora_adapters=\"\"} 1\n";
  Header(out, "vllm:cache_config_info", "gauge", "The KV cache's configuration.");
  *out += fmt::format("vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1\n",
                      block_tokens, m.kv.blocks_total);
}

}  // namespace

std::string ServerMetrics::Render(const EngineMetrics& m, int64_t block_tokens) const {
  std::string out;
  Metric(&out, "kvl:num_requests_running", "gauge", "Requests in the running batch.",
         m.requests_running);
  Metric(&out, "kvl:num_requests_waiting", "gauge", "Requests waiting to be admitted.",
         m.requests_waiting);
  Metric(&out, "kvl:num_preemptions_total", "counter", "Sequences preempted.", m.preemptions);
  Metric(&out, "kvl:engine_steps_total", "counter", "Forward steps run.", m.steps);
  Metric(&out, "kvl:watchdog_trips_total", "counter",
         "Times the engine's step loop was seen stalled (--watchdog-seconds).", m.watchdog_trips);
  Metric(&out, "kvl:watchdog_stalled_seconds_total", "counter",
         "Seconds the engine's step loop spent stalled.", m.watchdog_stalled_seconds);
  // --- speculative decoding (issue 26) ---
  Metric(&out, "kvl:spec_draft_tokens_total", "counter", "Draft tokens verified by steps.",
         m.spec_drafted);
  Metric(&out, "kvl:spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
         m.spec_accepted);
  Metric(&out, "kvl:spec_acceptance_rate", "gauge", "Accepted / drafted tokens (0: none drafted).",
         m.spec_drafted > 0 ? static_cast<double>(m.spec_accepted) / m.spec_drafted : 0.0);
  Metric(&out, "kvl:spec_tokens_per_step", "gauge",
         "Generated tokens per sequence step (1 without speculation).",
         m.spec_seq_steps > 0 ? static_cast<double>(m.tokens_generated) / m.spec_seq_steps : 0.0);
  // --- end speculative decoding ---
  Metric(&out, "kvl:prompt_tokens_computed_total", "counter",
         "Prompt tokens computed by the forward pass (prefix hits excluded).", m.tokens_prefilled);
  const double usage = m.kv.blocks_total > 0
                           ? static_cast<double>(m.kv.blocks_used) / m.kv.blocks_total
                           : 0.0;
  Metric(&out, "kvl:kv_cache_usage_perc", "gauge", "KV pool usage ratio (1 = full).", usage);
  RenderVllmSeries(m, block_tokens, usage, &out);
  Metric(&out, "kvl:kv_cache_used_bytes", "gauge", "KV pool bytes in use.", m.kv.kv_bytes_used);
  Metric(&out, "kvl:kv_cache_total_bytes", "gauge", "KV pool bytes.", m.kv.kv_bytes_total);
  Metric(&out, "kvl:kv_resident_bytes_peak", "gauge", "Most resident KV bytes at any time.",
         m.kv_resident_bytes_peak);
  // The one KV budget (kvl/kv_budget.h) and the process's memory against it: RSS less the
  // weights less the fixed part stays within the budget.
  Metric(&out, "kvl_kv_budget_bytes", "gauge",
         "The KV budget: every byte of KV state held in DRAM (pool, RAM tier, staging, rings, "
         "index, draft pool).",
         m.kv_budget_bytes);
  Metric(&out, "kvl_kv_fixed_bytes", "gauge",
         "Memory beyond the weights and the KV (scratch, stacks, tokenizer), measured at start.",
         m.kv_fixed_bytes);
  Metric(&out, "kvl_kv_held_bytes", "gauge", "KV bytes held in DRAM now, every part.",
         m.kv_held_bytes);
  Metric(&out, "kvl_rss_minus_weights_bytes", "gauge",
         "Resident memory less the resident weights, now.", m.rss_minus_weights_bytes);
  // Sliding-window layers (kvl/kv_window_release.h): the local layers' rings, outside the pool.
  Metric(&out, "kvl:kv_window_ring_bytes", "gauge",
         "Bytes of the sliding-window layers' rings (one window and one run per sequence).",
         m.kv_window_ring_bytes);
  Metric(&out, "kvl:kv_window_rebuilds_total", "counter",
         "Cached prefixes whose last window of local-layer K/V was rebuilt.",
         m.kv_window_rebuilds_from_residuals + m.kv_window_rebuilds_from_tokens);
  Metric(&out, "kvl:kv_window_tokens_rebuilt_total", "counter",
         "Tokens run to rebuild windows of local-layer K/V.", m.kv_window_tokens_rebuilt);
  Metric(&out, "kvl:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", m.kv.prefix_query_tokens);
  Metric(&out, "kvl:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
         m.kv.prefix_hit_tokens);
  Metric(&out, "kvl:prefix_cache_lookups_total", "counter", "Admissions that looked up prefixes.",
         m.kv.prefix_queries);
  Header(&out, "kvl:kv_pages_total", "counter", "KV pages each action was applied to.");
  for (int a = 0; a < kNumKvActions; ++a) {
    out += fmt::format("kvl:kv_pages_total{{action=\"{}\"}} {}\n",
                       KvActionName(static_cast<KvAction>(a)), m.kv_actions[size_t(a)].pages);
  }
  Header(&out, "kvl:kv_bytes_total", "counter", "KV bytes each action was applied to.");
  for (int a = 0; a < kNumKvActions; ++a) {
    out += fmt::format("kvl:kv_bytes_total{{action=\"{}\"}} {}\n",
                       KvActionName(static_cast<KvAction>(a)), m.kv_actions[size_t(a)].bytes);
  }
  Header(&out, "kvl:kv_pages_restored_total", "counter", "KV pages brought back, per action.");
  for (int a = 0; a < kNumKvActions; ++a) {
    out += fmt::format("kvl:kv_pages_restored_total{{action=\"{}\"}} {}\n",
                       KvActionName(static_cast<KvAction>(a)),
                       m.kv_actions[size_t(a)].pages_restored);
  }
  // The cost model checked: absolute error of its bring-back predictions over the last 4096
  // pages each action brought back (actions that brought none back are left out).
  for (const auto& [name, p90] : {std::pair{"kvl:kv_prediction_error_median_percent", false},
                                  std::pair{"kvl:kv_prediction_error_p90_percent", true}}) {
    Header(&out, name, "gauge",
           p90 ? "p90 of |measured - predicted| / measured bring-back time, per action."
               : "Median of |measured - predicted| / measured bring-back time, per action.");
    for (int a = 0; a < kNumKvActions; ++a) {
      const KvPredictionError& e = m.kv_actions[size_t(a)].error;
      if (e.samples == 0) continue;
      out += fmt::format("{}{{action=\"{}\"}} {}\n", name, KvActionName(static_cast<KvAction>(a)),
                         p90 ? e.p90_pct : e.median_pct);
    }
  }
  Metric(&out, "kvl:kv_checksum_failures_total", "counter",
         "Demoted KV pages that came back corrupt and were recomputed.", m.kv_checksum_failures);
  Metric(&out, "kvl:kv_layers_streamed_total", "counter", "Layer pages streamed back from tiers.",
         m.kv_layers_streamed);
  Metric(&out, "kvl:kv_pages_promoted_back_total", "counter",
         "Running sequences' pages brought back into the pool from tiers or checkpoints.",
         m.kv_pages_promoted_back);
  // Every family is declared even with no tier, so a dashboard's queries find them.
  for (const TierFamily& f : kTierFamilies) {
    Header(&out, f.name, f.type, f.help);
    for (const KvTierMetrics& tier : m.kv_tiers) {
      out += fmt::format("{}{{tier=\"{}\"}} {}\n", f.name, LabelValue(tier.name), f.value(tier));
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  Metric(&out, "kvl:prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         prompt_tokens_);
  Metric(&out, "kvl:prompt_tokens_cached_total", "counter",
         "Prompt tokens of finished requests found in the prefix cache.", cached_prompt_tokens_);
  Metric(&out, "kvl:generation_tokens_total", "counter", "Generated tokens of finished requests.",
         generation_tokens_);
  Header(&out, "kvl:request_success_total", "counter", "Finished requests, by finish reason.");
  for (const char* reason : {"stop", "length", "abort", "error", "kv_pressure"}) {
    auto it = finished_.find(reason);
    out += fmt::format("kvl:request_success_total{{finished_reason=\"{}\"}} {}\n", reason,
                       it == finished_.end() ? 0 : it->second);
  }
  Metric(&out, "kvl:request_disconnect_cancels_total", "counter",
         "Streaming requests cancelled because their client went away.", disconnect_cancels_);
  Header(&out, "kvl:http_errors_total", "counter", "Error responses, by HTTP status.");
  for (const auto& [status, count] : http_errors_) {
    out += fmt::format("kvl:http_errors_total{{status=\"{}\"}} {}\n", status, count);
  }
  Header(&out, "kvl:time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.Render("kvl:time_to_first_token_seconds", &out);
  Header(&out, "kvl:inter_token_latency_seconds", "histogram", "Time between generated tokens.");
  itl_.Render("kvl:inter_token_latency_seconds", &out);
  Header(&out, "kvl:e2e_request_latency_seconds", "histogram", "Request latency, end to end.");
  e2e_.Render("kvl:e2e_request_latency_seconds", &out);
  return out;
}

}  // namespace kvl::server
