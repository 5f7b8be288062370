// kvl bench: prompt processing (ppN) and text generation (tgN) speed, printed as llama-bench
// prints it so the two tables can be compared line by line.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "cli/cli.h"

namespace kvl::cli {
namespace {

struct TestResult {
  std::string model_path;
  std::string model_label;
  int64_t model_bytes = 0;
  int64_t params = 0;
  std::string backend;
  int threads = 0;
  int64_t n_prompt = 0;
  int64_t n_gen = 0;
  std::vector<double> samples_ts;  // tokens per second, one per repetition

  std::string test_name() const {
    return n_prompt > 0 ? fmt::format("pp{}", n_prompt) : fmt::format("tg{}", n_gen);
  }
  double mean() const {
    double s = 0;
    for (double v : samples_ts) s += v;
    return samples_ts.empty() ? 0 : s / static_cast<double>(samples_ts.size());
  }
  double stddev() const {
    if (samples_ts.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double v : samples_ts) s += (v - m) * (v - m);
    return std::sqrt(s / static_cast<double>(samples_ts.size() - 1));
  }
};

std::string ModelLabel(const Model& model) {
  const double billions = static_cast<double>(model.num_parameters()) / 1e9;
  const double millions = billions * 1000.0;
  const std::string size = billions >= 1.0  ? fmt::format("{:.1f}B", billions)
                           : millions >= 10 ? fmt::format("{:.0f}M", millions)
                                            : fmt::format("{:.1f}M", millions);
  std::string type = model.weight_type_name();
  std::transform(type.begin(), type.end(), type.begin(), ::toupper);
  return fmt::format("{} {} {}", model.config().architecture, size, type);
}

// Random in-vocabulary tokens: speed does not depend on which tokens run.
std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

// One timed repetition: seconds for a pp test (one prompt evaluation) or a tg test (n_gen
// single-token steps), each starting from an empty context.
StatusOr<double> TimeOnce(Engine& engine, int64_t n_prompt, int64_t n_gen, uint64_t seed) {
  const int64_t vocab = engine.model().config().vocab_size;
  const auto start = std::chrono::steady_clock::now();
  if (n_prompt > 0) {
    const std::vector<int32_t> ids = RandomTokens(n_prompt, vocab, seed);
    StatusOr<const float*> logits = engine.Evaluate(ids, 0);
    if (!logits.ok()) return logits.status();
  } else {
    const std::vector<int32_t> ids = RandomTokens(n_gen, vocab, seed);
    for (int64_t i = 0; i < n_gen; ++i) {
      StatusOr<const float*> logits =
          engine.Evaluate(std::span<const int32_t>(&ids[static_cast<size_t>(i)], 1), i);
      if (!logits.ok()) return logits.status();
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void PrintMarkdownHeader() {
  fmt::print("| {:<22} | {:>10} | {:>10} | {:<14} | {:>7} | {:>13} | {:>20} |\n", "model", "size",
             "params", "backend", "threads", "test", "t/s");
  fmt::print("| {:-<22} | {:->10} | {:->10} | {:-<14} | {:->7} | {:->13} | {:->20} |\n", ":", ":",
             ":", ":", ":", ":", ":");
}

void PrintMarkdownRow(const TestResult& r) {
  fmt::print("| {:<22} | {:>10} | {:>10} | {:<14} | {:>7} | {:>13} | {:>20} |\n", r.model_label,
             FormatBytes(r.model_bytes), FormatParams(r.params), r.backend, r.threads,
             r.test_name(), fmt::format("{:.2f} ± {:.2f}", r.mean(), r.stddev()));
  std::fflush(stdout);
}

nlohmann::json ToJson(const TestResult& r) {
  return {{"model_filename", r.model_path}, {"model_type", r.model_label},
          {"model_size", r.model_bytes},    {"model_n_params", r.params},
          {"backend", r.backend},           {"n_threads", r.threads},
          {"n_prompt", r.n_prompt},         {"n_gen", r.n_gen},
          {"test", r.test_name()},          {"avg_ts", r.mean()},
          {"stddev_ts", r.stddev()},        {"samples_ts", r.samples_ts}};
}

}  // namespace

int BenchCommand(const BenchArgs& args) {
  if (args.repetitions < 1) {
    fmt::print(stderr, "kvl: -r must be at least 1\n");
    return 1;
  }
  if (args.output != "md" && args.output != "json") {
    fmt::print(stderr, "kvl: -o must be md or json\n");
    return 1;
  }
  std::vector<int> thread_counts = args.threads;
  if (thread_counts.empty()) thread_counts.push_back(0);
  int64_t longest = 1;
  for (int64_t p : args.prompt_lengths) longest = std::max(longest, p);
  for (int64_t n : args.gen_lengths) longest = std::max(longest, n);

  const bool markdown = args.output == "md";
  if (markdown) PrintMarkdownHeader();
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& path : args.model_paths) {
    for (int threads : thread_counts) {
      EngineOptions options;
      options.model_path = path;
      options.num_threads = threads;
      options.context_length = longest;
      options.batch_size = args.batch_size;
      options.isa = args.isa;
      StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
      if (!engine.ok()) {
        fmt::print(stderr, "kvl: {}\n", engine.status().ToString());
        return 1;
      }
      Engine& e = **engine;
      std::vector<std::pair<int64_t, int64_t>> tests;
      for (int64_t p : args.prompt_lengths) {
        if (p > 0) tests.push_back({p, 0});
      }
      for (int64_t n : args.gen_lengths) {
        if (n > 0) tests.push_back({0, n});
      }
      for (auto [n_prompt, n_gen] : tests) {
        TestResult r;
        r.model_path = path;
        r.model_label = ModelLabel(e.model());
        r.model_bytes = e.model().weight_bytes();
        r.params = e.model().num_parameters();
        r.backend = fmt::format("CPU ({})", ops::IsaName(e.isa()));
        r.threads = e.num_threads();
        r.n_prompt = n_prompt;
        r.n_gen = n_gen;
        // One untimed warm-up run pages the weights in and settles the clocks.
        for (int rep = -1; rep < args.repetitions; ++rep) {
          StatusOr<double> seconds = TimeOnce(e, n_prompt, n_gen, 42 + static_cast<uint64_t>(rep + 1));
          if (!seconds.ok()) {
            fmt::print(stderr, "kvl: {}\n", seconds.status().ToString());
            return 1;
          }
          if (rep >= 0) r.samples_ts.push_back(static_cast<double>(n_prompt + n_gen) / *seconds);
        }
        if (markdown) PrintMarkdownRow(r);
        all.push_back(ToJson(r));
      }
    }
  }
  if (!markdown) fmt::print("{}\n", all.dump(2));
  return 0;
}

}  // namespace kvl::cli
