// Does one long conversation keep going at a fixed KV budget, and at what cost?
//
// One sequence generates N tokens (greedy, EOS ignored) in a KV pool of only a few pages. For
// each policy a fresh engine runs the same prompt; the table shows how many tokens came out, the
// decode speed, the peak pool bytes against the budget, what the KV action lattice did (pages
// compressed, demoted, checkpointed, evicted; layer pages streamed back and the time attention
// waited for them; page layers rebuilt from checkpoints), and how far the output agrees with
// keep-all, the run whose budget holds everything. Lossless policies (demote, demote-disk,
// recompute-residual) should agree on every token; compress and evict trade agreement for memory.
// recompute-residual keeps checkpoints in every block, so the same bytes hold fewer pages.
//
// Usage: long_conversation_bench -m MODEL [-n 400] [--budget-pages 8]
//          [--policies keep-all,demote,demote-disk,recompute-residual,compress,compress-int4,evict]
//          [-t 2] [--disk /tmp] [-o md|json]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvl/engine.h"
#include "kvl/model.h"
#include "kvl/tokenizer.h"
#include "reply_agreement.h"  // src/cli/bench: the benches' one LeadingAgreement

namespace {

using Clock = std::chrono::steady_clock;

// A story opening, so that small story models stay on familiar ground for hundreds of tokens.
constexpr char kPrompt[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
    "with her friends. One day, she found a big red ball under a tall tree.";

// Every page is one block of 16 tokens across all layers (the engine's default block).
constexpr int32_t kBlockTokens = 16;

struct BenchArgs {
  std::string model_path;
  int32_t num_tokens = 400;
  int64_t budget_pages = 8;
  std::vector<std::string> policies = {"keep-all", "demote",        "demote-disk",
                                       "recompute-residual", "compress", "compress-int4",
                                       "evict"};
  int threads = 2;
  std::string disk_dir = "/tmp";
  std::string output = "md";
};

// What one policy's run produced.
struct PolicyRun {
  std::string policy;
  std::vector<int32_t> tokens;  // generated ids, in order
  std::string finish_reason;
  std::string error;           // the engine's error, when finish_reason is "error"
  double total_s = 0;          // submit to the last event
  double decode_tok_s = 0;     // tokens after the first / time after the first
  int64_t peak_kv_bytes = 0;   // pool bytes in use at the most (the KV manager's peak)
  int64_t peak_kv_blocks = 0;  // the same in blocks (pages)
  int64_t budget_bytes = 0;    // the pool's size
  int64_t budget_blocks = 0;
  kvl::EngineMetrics metrics;  // at the end of the run
  double agree = -1;           // leading tokens equal to keep-all's, as a fraction; -1: none
};

// The demote-disk tier's file; removed after each run so runs start alike and nothing is left.
std::filesystem::path DiskTierPath(const BenchArgs& args) {
  return std::filesystem::path(args.disk_dir) / "kvl-long-bench.pages";
}

int64_t ActionPages(const PolicyRun& run, kvl::KvAction action) {
  return run.metrics.kv_actions[static_cast<size_t>(action)].pages;
}

// The engine options for one policy. keep-all is no policy at all: a budget that holds the whole
// context, so nothing is ever under pressure.
kvl::EngineOptions OptionsFor(const BenchArgs& args, const std::string& policy,
                              int64_t context_length, int64_t budget_bytes) {
  kvl::EngineOptions options;
  options.model_path = args.model_path;
  options.num_threads = args.threads;
  options.context_length = context_length;
  options.block_tokens = kBlockTokens;
  options.max_seqs = 1;
  // One conversation shares nothing with another; the prefix cache would only hold on to blocks.
  options.prefix_cache = false;
  if (policy == "keep-all") {
    options.kv_policy = "keep";
    options.kv_budget_bytes = 0;  // the engine's default: room for the full context
    return options;
  }
  options.kv_policy = policy;
  options.kv_budget_bytes = budget_bytes;
  if (policy == "demote" || policy == "recompute-residual") {
    // The one KV budget holds the RAM tier too (kvl/kv_budget.h): the tier on top of the pool's.
    options.kv_tiers = {"ram:1GiB"};
    options.kv_budget_bytes += int64_t{1} << 30;
  }
  if (policy == "demote-disk") {
    options.kv_tiers = {fmt::format("disk:{}:1GiB", DiskTierPath(args).string())};
  }
  return options;
}

// Runs the prompt to the end under one policy.
kvl::StatusOr<PolicyRun> RunPolicy(const BenchArgs& args, const std::string& policy,
                                   const std::vector<int32_t>& prompt_ids, int64_t budget_bytes) {
  const int64_t context_length =
      static_cast<int64_t>(prompt_ids.size()) + args.num_tokens + kBlockTokens;
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<kvl::Engine> engine,
                       kvl::Engine::Create(OptionsFor(args, policy, context_length, budget_bytes)));
  PolicyRun run;
  run.policy = policy;
  run.tokens.reserve(static_cast<size_t>(args.num_tokens));

  kvl::Request request;
  request.prompt_ids = prompt_ids;
  request.max_new_tokens = args.num_tokens;
  request.ignore_eos = true;
  request.sampling.temperature = 0;
  const Clock::time_point start = Clock::now();
  Clock::time_point first_token = start, last_token = start, finished = start;
  auto on_event = [&](const kvl::TokenEvent& ev) {
    const Clock::time_point now = Clock::now();
    if (ev.token >= 0) {
      if (run.tokens.empty()) first_token = now;
      last_token = now;
      run.tokens.push_back(ev.token);
    }
    if (ev.finished) {
      finished = now;
      run.finish_reason = ev.finish_reason;
      if (!ev.error.ok()) run.error = ev.error.ToString();
    }
  };
  KVL_RETURN_IF_ERROR(engine->Submit(std::move(request), on_event).status());
  engine->RunUntilIdle();
  run.total_s = std::chrono::duration<double>(finished - start).count();
  const double decode_s = std::chrono::duration<double>(last_token - first_token).count();
  const size_t decoded = run.tokens.empty() ? 0 : run.tokens.size() - 1;
  run.decode_tok_s = decode_s > 0 ? static_cast<double>(decoded) / decode_s : 0;
  run.metrics = engine->Metrics();
  run.peak_kv_bytes = run.metrics.kv.kv_bytes_peak;
  run.peak_kv_blocks = run.metrics.kv.blocks_used_peak;
  run.budget_bytes = run.metrics.kv.kv_bytes_total;
  run.budget_blocks = run.metrics.kv.blocks_total;
  return run;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void PrintMarkdown(const std::vector<PolicyRun>& runs, const kvl::ModelConfig& config,
                   const BenchArgs& args, size_t prompt_tokens, int64_t budget_bytes) {
  fmt::print(
      "model {} ({} layers, kv_dim {}), prompt {} tokens, {} new tokens, budget {} pages "
      "({:.3f} MiB), {} threads\n\n",
      config.name, config.num_layers, config.kv_dim(), prompt_tokens, args.num_tokens,
      args.budget_pages, MiB(budget_bytes), args.threads);
  // "peak / pool" is in pages (blocks): the peak resident KV against the pool it had.
  fmt::print(
      "| {:<18} | {:>6} | {:>6} | {:>7} | {:>11} | {:>8} | {:>5} | {:>5} | {:>5} | {:>5} | "
      "{:>5} | {:>5} | {:>8} | {:>7} | {:>8} | {:>7} | {:>6} | {:>6} |\n",
      "policy", "tokens", "finish", "tok/s", "peak / pool", "peak MiB", "int8", "int4", "ram",
      "disk", "resid", "evict", "streamed", "wait ms", "rebuilt", "preempt", "agree", "time s");
  fmt::print(
      "| {:-<18} | {:->6} | {:->6} | {:->7} | {:->11} | {:->8} | {:->5} | {:->5} | {:->5} | "
      "{:->5} | {:->5} | {:->5} | {:->8} | {:->7} | {:->8} | {:->7} | {:->6} | {:->6} |\n",
      ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":");
  for (const PolicyRun& r : runs) {
    using kvl::KvAction;
    fmt::print(
        "| {:<18} | {:>6} | {:>6} | {:>7.1f} | {:>11} | {:>8.3f} | {:>5} | {:>5} | {:>5} | "
        "{:>5} | {:>5} | {:>5} | {:>8} | {:>7.2f} | {:>8} | {:>7} | {:>6} | {:>6.2f} |\n",
        r.policy, r.tokens.size(), r.finish_reason, r.decode_tok_s,
        fmt::format("{} / {}", r.peak_kv_blocks, r.budget_blocks), MiB(r.peak_kv_bytes),
        ActionPages(r, KvAction::kCompressInt8), ActionPages(r, KvAction::kCompressInt4),
        ActionPages(r, KvAction::kDemoteRam), ActionPages(r, KvAction::kDemoteDisk),
        ActionPages(r, KvAction::kRecomputeResidual), ActionPages(r, KvAction::kEvict),
        r.metrics.kv_layers_streamed, r.metrics.kv_stream_wait_ms, r.metrics.kv_layers_rebuilt,
        r.metrics.preemptions, r.agree < 0 ? "-" : fmt::format("{:.1f}%", 100 * r.agree),
        r.total_s);
  }
}

nlohmann::json ToJson(const PolicyRun& r) {
  nlohmann::json actions = nlohmann::json::object();
  for (int a = 0; a < kvl::kNumKvActions; ++a) {
    const kvl::KvActionCounter& c = r.metrics.kv_actions[static_cast<size_t>(a)];
    if (c.pages == 0) continue;
    actions[std::string(kvl::KvActionName(static_cast<kvl::KvAction>(a)))] = {
        {"pages", c.pages},
        {"bytes", c.bytes},
        {"pages_restored", c.pages_restored},
        {"predicted_ms", c.predicted_ms},
        {"measured_ms", c.measured_ms}};
  }
  nlohmann::json j = {{"policy", r.policy},
                      {"generated_tokens", r.tokens.size()},
                      {"finish_reason", r.finish_reason},
                      {"decode_tok_s", r.decode_tok_s},
                      {"total_s", r.total_s},
                      {"peak_kv_bytes", r.peak_kv_bytes},
                      {"peak_kv_blocks", r.peak_kv_blocks},
                      {"pool_bytes", r.budget_bytes},
                      {"pool_blocks", r.budget_blocks},
                      {"actions", actions},
                      {"pages_compressed_at_end", r.metrics.kv_pages_compressed},
                      {"pages_streamed_at_end", r.metrics.kv_pages_streamed},
                      {"pages_evicted_at_end", r.metrics.kv_pages_evicted},
                      {"stream_staging_bytes", r.metrics.kv_stream_staging_bytes},
                      {"layers_streamed", r.metrics.kv_layers_streamed},
                      {"stream_wait_ms", r.metrics.kv_stream_wait_ms},
                      {"layers_rebuilt", r.metrics.kv_layers_rebuilt},
                      {"rebuild_ms", r.metrics.kv_rebuild_ms},
                      {"preemptions", r.metrics.preemptions}};
  if (r.agree >= 0) j["agree"] = r.agree;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  CLI::App app{"One long conversation at a fixed KV budget, per KV policy",
               "long_conversation_bench"};
  app.add_option("-m,--model", args.model_path, "GGUF model file")->required();
  app.add_option("-n,--n-gen", args.num_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--budget-pages", args.budget_pages, "KV pool size in 16-token pages (blocks)")
      ->capture_default_str();
  app.add_option("--policies", args.policies,
                 "keep-all (a pool for everything) or any --kv-policy value")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("-t,--threads", args.threads, "threads")->capture_default_str();
  app.add_option("--disk", args.disk_dir, "directory of the demote-disk tier file")
      ->capture_default_str();
  app.add_option("-o,--output", args.output, "md | json")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (args.output != "md" && args.output != "json") {
    fmt::print(stderr, "long_conversation_bench: -o must be md or json\n");
    return 1;
  }
  if (args.num_tokens < 1 || args.budget_pages < 1) {
    fmt::print(stderr, "long_conversation_bench: -n and --budget-pages must be at least 1\n");
    return 1;
  }

  // The model and tokenizer are read once here, for the budget and the prompt's tokens; every
  // policy then gets the very same ids.
  kvl::StatusOr<std::unique_ptr<kvl::Model>> model = kvl::Model::Load(args.model_path);
  if (!model.ok()) {
    fmt::print(stderr, "long_conversation_bench: {}\n", model.status().ToString());
    return 1;
  }
  kvl::StatusOr<std::unique_ptr<kvl::Tokenizer>> tokenizer =
      kvl::Tokenizer::FromGguf((*model)->file());
  if (!tokenizer.ok()) {
    fmt::print(stderr, "long_conversation_bench: {}\n", tokenizer.status().ToString());
    return 1;
  }
  const kvl::ModelConfig& config = (*model)->config();
  const std::vector<int32_t> prompt_ids = (*tokenizer)->Encode(kPrompt, /*add_bos=*/true);
  // A page is the K and V of kBlockTokens tokens in every layer, at f32 (the default cache type).
  const int64_t page_bytes =
      kBlockTokens * config.num_layers * config.KvBytesPerTokenPerLayer(kvl::DType::kF32);
  const int64_t budget_bytes = args.budget_pages * page_bytes;

  std::vector<PolicyRun> runs;
  bool failed = false;
  for (const std::string& policy : args.policies) {
    fmt::print(stderr, "long_conversation_bench: {} ...\n", policy);
    kvl::StatusOr<PolicyRun> run = RunPolicy(args, policy, prompt_ids, budget_bytes);
    std::error_code ignored;
    std::filesystem::remove(DiskTierPath(args), ignored);
    if (!run.ok()) {
      fmt::print(stderr, "long_conversation_bench: policy {}: {}\n", policy,
                 run.status().ToString());
      return 1;
    }
    if (!run->error.empty()) {
      // A run that failed mid-way is still a row of the table; the exit status reports it.
      fmt::print(stderr, "long_conversation_bench: policy {} failed after {} tokens: {}\n", policy,
                 run->tokens.size(), run->error);
      failed = true;
    }
    runs.push_back(std::move(*run));
  }

  const auto reference = std::find_if(runs.begin(), runs.end(),
                                      [](const PolicyRun& r) { return r.policy == "keep-all"; });
  if (reference != runs.end()) {
    for (PolicyRun& r : runs) r.agree = kvl::cli::LeadingAgreement(r.tokens, reference->tokens);
  }

  if (args.output == "md") {
    PrintMarkdown(runs, config, args, prompt_ids.size(), budget_bytes);
  } else {
    nlohmann::json all = nlohmann::json::array();
    for (const PolicyRun& r : runs) all.push_back(ToJson(r));
    nlohmann::json out = {{"model", args.model_path},
                          {"prompt_tokens", prompt_ids.size()},
                          {"n_gen", args.num_tokens},
                          {"budget_pages", args.budget_pages},
                          {"budget_bytes", budget_bytes},
                          {"threads", args.threads},
                          {"runs", all}};
    fmt::print("{}\n", out.dump(2));
  }
  return failed ? 1 : 0;
}
