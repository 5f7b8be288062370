// kvl bench: prompt processing (ppN) and text generation (tgN) speed, printed as llama-bench
// prints it so the two tables can be compared line by line.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "cli.h"
#include "kv_type_quality.h"
#include "kvl/kv_manager.h"  // ParseKvCacheType

namespace kvl::cli {
namespace {

struct TestResult {
  std::string model_path;
  std::string model_label;
  int64_t model_bytes = 0;
  int64_t params = 0;
  std::string backend;
  int threads = 0;
  std::string type_k = "f32", type_v = "f32";  // KV cache element types (-ctk / -ctv)
  int64_t n_prompt = 0;
  int64_t n_gen = 0;
  int64_t n_depth = 0;  // tokens already in the cache (-d), as llama-bench's n_depth
  int parallel = 1;
  std::vector<double> samples_ts;  // tokens per second, one per repetition
  KvTypeQuality quality;  // of (type_k, type_v) against an f32 cache; shown with the types

  std::string test_name() const {
    std::string name = n_prompt > 0   ? fmt::format("pp{}", n_prompt)
                       : parallel > 1 ? fmt::format("tg{} np{}", n_gen, parallel)
                                      : fmt::format("tg{}", n_gen);
    if (n_depth > 0) name += fmt::format(" @ d{}", n_depth);
    return name;
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

// Runs one batch of requests to completion and returns what the bench needs from it.
struct RunTimes {
  double ttft_ms = 0;        // submit to first token, of the slowest request
  double decode_s = 0;       // from the last first token to the last token
  int64_t decode_tokens = 0; // tokens generated after each request's first
  int64_t cached_tokens = 0;
  Status error;
};

RunTimes RunRequests(Engine& engine, std::vector<std::vector<int32_t>> prompts, int32_t max_new) {
  using Clock = std::chrono::steady_clock;
  RunTimes out;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_first = start, last_token = start;
  for (std::vector<int32_t>& ids : prompts) {
    Request r;
    r.prompt_ids = std::move(ids);
    r.max_new_tokens = max_new;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    bool first = true;
    StatusOr<RequestId> id = engine.Submit(std::move(r), [&, first](const TokenEvent& ev) mutable {
      const Clock::time_point now = Clock::now();
      if (ev.token >= 0) {
        if (first) {
          last_first = std::max(last_first, now);
          out.ttft_ms = std::max(out.ttft_ms, std::chrono::duration<double, std::milli>(now - start).count());
          first = false;
        } else {
          ++out.decode_tokens;
        }
        last_token = std::max(last_token, now);
      }
      if (ev.finished) {
        out.cached_tokens += ev.cached_prompt_tokens;
        if (!ev.error.ok()) out.error = ev.error;
      }
    });
    if (!id.ok()) {
      out.error = id.status();
      return out;
    }
  }
  engine.RunUntilIdle();
  out.decode_s = std::chrono::duration<double>(last_token - last_first).count();
  return out;
}

// The cached context of a depth test (-d): n_depth tokens run once, untimed, so the prefix cache
// holds them; every prompt of the test then starts with them, and only what follows is computed
// (llama-bench computes the depth once and restores it before each repetition in the same way).
struct DepthContext {
  std::vector<int32_t> tokens;  // empty at depth 0
  int64_t cached_tokens = 0;    // what a prompt starting with them must find cached
};

StatusOr<DepthContext> PrepareDepth(Engine& engine, int64_t depth, int32_t block_tokens) {
  DepthContext c;
  if (depth == 0) return c;
  c.tokens = RandomTokens(depth, engine.model().config().vocab_size, 777 + static_cast<uint64_t>(depth));
  RunTimes t = RunRequests(engine, {c.tokens}, 1);
  if (!t.error.ok()) return t.error;
  c.cached_tokens = depth / block_tokens * block_tokens;  // the prefix cache keeps full blocks
  return c;
}

// One timed repetition, in tokens per second: a pp test is one prompt of n_prompt tokens timed to
// its first token; a tg test is n_gen decode steps of `parallel` sequences (aggregate rate). At a
// depth, each prompt is the context plus its own tokens (one for a tg test).
StatusOr<double> TimeOnce(Engine& engine, int64_t n_prompt, int64_t n_gen, int parallel,
                          const DepthContext& depth, uint64_t seed) {
  const int64_t vocab = engine.model().config().vocab_size;
  auto after_context = [&](std::vector<int32_t> ids) {
    ids.insert(ids.begin(), depth.tokens.begin(), depth.tokens.end());
    return ids;
  };
  // A depth test measures nothing true unless the context really came from the cache.
  auto check_cached = [&](const RunTimes& t, int requests) -> Status {
    if (t.cached_tokens >= depth.cached_tokens * requests) return Status::Ok();
    return InternalError(fmt::format(
        "bench at depth {}: {} of {} context tokens came from the prefix cache (pool too small?)",
        depth.tokens.size(), t.cached_tokens, depth.cached_tokens * requests));
  };
  if (n_prompt > 0) {
    RunTimes t = RunRequests(engine, {after_context(RandomTokens(n_prompt, vocab, seed))}, 1);
    if (!t.error.ok()) return t.error;
    KVL_RETURN_IF_ERROR(check_cached(t, 1));
    return static_cast<double>(n_prompt) / (t.ttft_ms / 1000.0);
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < parallel; ++i) {
    prompts.push_back(after_context(RandomTokens(1, vocab, seed * 1000 + static_cast<uint64_t>(i))));
  }
  RunTimes t = RunRequests(engine, std::move(prompts), static_cast<int32_t>(n_gen + 1));
  if (!t.error.ok()) return t.error;
  KVL_RETURN_IF_ERROR(check_cached(t, parallel));
  return static_cast<double>(t.decode_tokens) / t.decode_s;
}

// KV bytes per token of a model with the given cache element types.
StatusOr<int64_t> KvBytesPerToken(const std::string& path, const std::string& type_k,
                                  const std::string& type_v) {
  StatusOr<std::unique_ptr<Model>> model = Model::Load(path);
  if (!model.ok()) return model.status();
  const ModelConfig& c = (*model)->config();
  const DType k = ParseKvCacheType(type_k).value(), v = ParseKvCacheType(type_v).value();
  return c.num_layers * (RowBytes(k, c.kv_dim()) + RowBytes(v, c.kv_dim()));
}

// Time to first token for prefix + suffix prompts: a miss (cold cache), then a hit (another
// request with the same prefix and a different suffix).
struct PrefixResult {
  std::vector<double> miss_ms, hit_ms;
  int64_t hit_cached_tokens = 0;
};

StatusOr<PrefixResult> TimePrefix(Engine& engine, int64_t prefix, int64_t suffix, int reps) {
  const int64_t vocab = engine.model().config().vocab_size;
  PrefixResult r;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms up
    const std::vector<int32_t> shared = RandomTokens(prefix, vocab, 5000 + static_cast<uint64_t>(rep + 1));
    double ttft[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<int32_t> ids = shared;
      const std::vector<int32_t> tail = RandomTokens(suffix, vocab, 9000 + static_cast<uint64_t>(4 * (rep + 1) + k));
      ids.insert(ids.end(), tail.begin(), tail.end());
      RunTimes t = RunRequests(engine, {std::move(ids)}, 1);
      if (!t.error.ok()) return t.error;
      ttft[k] = t.ttft_ms;
      if (k == 1 && rep >= 0) r.hit_cached_tokens = t.cached_tokens;
    }
    if (rep >= 0) {
      r.miss_ms.push_back(ttft[0]);
      r.hit_ms.push_back(ttft[1]);
    }
  }
  return r;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// As in llama-bench, the type_k / type_v columns appear only when a non-default type is asked for.
void PrintMarkdownHeader(bool show_cache_types) {
  fmt::print("| {:<22} | {:>10} | {:>10} | {:<14} | {:>7} | ", "model", "size", "params",
             "backend", "threads");
  if (show_cache_types) {
    fmt::print("{:>6} | {:>6} | {:>9} | {:>5} | ", "type_k", "type_v", "kld", "top1");
  }
  fmt::print("{:>17} | {:>20} |\n", "test", "t/s");
  fmt::print("| {:-<22} | {:->10} | {:->10} | {:-<14} | {:->7} | ", ":", ":", ":", ":", ":");
  if (show_cache_types) fmt::print("{:->6} | {:->6} | {:->9} | {:->5} | ", ":", ":", ":", ":");
  fmt::print("{:->17} | {:->20} |\n", ":", ":");
}

void PrintMarkdownRow(const TestResult& r, bool show_cache_types) {
  fmt::print("| {:<22} | {:>10} | {:>10} | {:<14} | {:>7} | ", r.model_label,
             FormatBytes(r.model_bytes), FormatParams(r.params), r.backend, r.threads);
  if (show_cache_types) {
    fmt::print("{:>6} | {:>6} | {:>9.3e} | {:>5.3f} | ", r.type_k, r.type_v, r.quality.mean_kld,
               r.quality.top1);
  }
  fmt::print("{:>17} | {:>20} |\n", r.test_name(),
             fmt::format("{:.2f} ± {:.2f}", r.mean(), r.stddev()));
  (void)FlushStdout();  // rows appear as they are measured; a failure ends the command later
}

nlohmann::json ToJson(const TestResult& r) {
  return {{"model_filename", r.model_path}, {"model_type", r.model_label},
          {"model_size", r.model_bytes},    {"model_n_params", r.params},
          {"backend", r.backend},           {"n_threads", r.threads},
          {"type_k", r.type_k},             {"type_v", r.type_v},
          {"n_prompt", r.n_prompt},         {"n_gen", r.n_gen},
          {"n_depth", r.n_depth},           {"n_parallel", r.parallel},
          {"kld_vs_f32", r.quality.mean_kld}, {"top1_vs_f32", r.quality.top1},
          {"kld_prompts", r.quality.num_prompts},
          {"test", r.test_name()},          {"avg_ts", r.mean()},
          {"stddev_ts", r.stddev()},        {"samples_ts", r.samples_ts}};
}

}  // namespace

int BenchCommand(const BenchArgs& args) {
  // The sizes were validated when parsed (ValidateBenchArgs): none is negative or overflows.
  std::vector<int> thread_counts = args.threads;
  if (thread_counts.empty()) thread_counts.push_back(0);
  int max_parallel = 1;
  for (int np : args.parallel) max_parallel = std::max(max_parallel, np);
  int64_t longest = 2;
  for (int64_t p : args.prompt_lengths) longest = std::max(longest, p + 2);
  for (int64_t n : args.gen_lengths) longest = std::max(longest, n + 3);
  int64_t deepest = 0;
  for (int64_t d : args.depths) deepest = std::max(deepest, d);
  longest += deepest;
  // At a depth the pool holds the cached context beside every test's own tokens (twice over, so
  // the context's blocks are never the ones a test reuses), whatever the default budget is.
  int64_t depth_pool_tokens = 0;
  if (deepest > 0) {
    int64_t own = 0;
    for (int64_t p : args.prompt_lengths) own = std::max(own, p);
    for (int64_t n : args.gen_lengths) own = std::max(own, max_parallel * (n + 3 + 16));
    depth_pool_tokens = deepest + 2 * own + 64;
  }
  if (args.prefix_tokens > 0) longest = std::max(longest, args.prefix_tokens + args.suffix_tokens + 2);

  // One engine per model x thread count x (-ctk, -ctv) pair, in llama-bench's order.
  std::vector<EngineOptions> configs;
  bool show_cache_types = false;
  for (const std::string& path : args.model_paths) {
    for (int threads : thread_counts) {
      for (const std::string& type_k : args.cache_types_k) {
        for (const std::string& type_v : args.cache_types_v) {
          EngineOptions options;
          options.model_path = path;
          options.num_threads = threads;
          options.context_length = longest;
          options.batch_size = args.batch_size;
          options.isa = args.isa;
          options.max_seqs = max_parallel;
          options.cache_type_k = type_k;
          options.cache_type_v = type_v;
          // Random prompts never share prefixes, but the speed tests must not depend on that.
          // Depth tests read their context from the prefix cache (PrepareDepth).
          options.prefix_cache = deepest > 0;
          if (depth_pool_tokens > 0) {
            StatusOr<int64_t> per_token = KvBytesPerToken(path, type_k, type_v);
            if (!per_token.ok()) {
              fmt::print(stderr, "kvl: {}\n", per_token.status().ToString());
              return 1;
            }
            options.kv_budget_bytes = depth_pool_tokens * *per_token;
          }
          configs.push_back(options);
          show_cache_types |= type_k != "f32" || type_v != "f32";
        }
      }
    }
  }

  const bool markdown = args.output == "md";
  if (markdown) PrintMarkdownHeader(show_cache_types);
  nlohmann::json all = nlohmann::json::array();
  std::vector<std::string> prefix_lines;
  for (EngineOptions& options : configs) {
    const std::string& path = options.model_path;
    StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
    if (!engine.ok()) {
      fmt::print(stderr, "kvl: {}\n", engine.status().ToString());
      return 1;
    }
    Engine& e = **engine;
    // A test longer than the model's context measures positions the model never saw (RoPE past
    // its range): refused, as a request past the context is, before anything runs.
    const int64_t model_context = e.model().config().context_length;
    if (model_context > 0 && options.context_length > model_context) {
      fmt::print(stderr,
                 "kvl: bench: the longest test (prompt, generated and depth tokens) needs a "
                 "context of {} tokens but {} holds {} (its context_length); use smaller -p / -n "
                 "/ -d\n",
                 options.context_length, path, model_context);
      return 1;
    }
    // The quality column: the final-token distributions of a fixed prompt set against an f32
    // cache, measured once per (model, -ctk, -ctv).
    KvTypeQuality quality{0, 1, 0};
    if (show_cache_types) {
      const DType type_k = ParseKvCacheType(options.cache_type_k).value();  // validated already
      const DType type_v = ParseKvCacheType(options.cache_type_v).value();
      StatusOr<KvTypeQuality> q =
          MeasureKvTypeQuality(e.model(), e.tokenizer(), e.isa(), e.num_threads(), type_k, type_v);
      if (!q.ok()) {
        fmt::print(stderr, "kvl: {}\n", q.status().ToString());
        return 1;
      }
      quality = *q;
    }
    struct Test {
      int64_t n_prompt, n_gen;
      int parallel;
      int64_t depth;
    };
    // llama-bench's order: per depth, the pp tests, then the tg tests.
    std::vector<Test> tests;
    for (int64_t d : args.depths) {
      for (int64_t p : args.prompt_lengths) {
        if (p > 0) tests.push_back({p, 0, 1, d});
      }
      for (int64_t n : args.gen_lengths) {
        for (int np : args.parallel) {
          if (n > 0) tests.push_back({0, n, np, d});
        }
      }
    }
    DepthContext depth;
    for (const Test& test : tests) {
      if (test.depth != static_cast<int64_t>(depth.tokens.size())) {
        StatusOr<DepthContext> prepared = PrepareDepth(e, test.depth, options.block_tokens);
        if (!prepared.ok()) {
          fmt::print(stderr, "kvl: {}\n", prepared.status().ToString());
          return 1;
        }
        depth = std::move(*prepared);
      }
      TestResult r;
      r.model_path = path;
      r.model_label = ModelLabel(e.model());
      r.model_bytes = e.model().weight_bytes();
      r.params = e.model().num_parameters();
      r.backend = fmt::format("CPU ({})", ops::KernelsName(e.isa()));
      r.threads = e.num_threads();
      r.type_k = options.cache_type_k;
      r.type_v = options.cache_type_v;
      r.n_prompt = test.n_prompt;
      r.n_gen = test.n_gen;
      r.n_depth = test.depth;
      r.parallel = test.parallel;
      r.quality = quality;
      // One untimed warm-up run pages the weights in and settles the clocks.
      for (int rep = -1; rep < args.repetitions; ++rep) {
        StatusOr<double> ts = TimeOnce(e, test.n_prompt, test.n_gen, test.parallel, depth,
                                       42 + static_cast<uint64_t>(rep + 1));
        if (!ts.ok()) {
          fmt::print(stderr, "kvl: {}\n", ts.status().ToString());
          return 1;
        }
        if (rep >= 0) r.samples_ts.push_back(*ts);
      }
      if (markdown) PrintMarkdownRow(r, show_cache_types);
      all.push_back(ToJson(r));
    }

    if (args.prefix_tokens > 0) {
      options.prefix_cache = true;
      options.max_seqs = 1;
      StatusOr<std::unique_ptr<Engine>> cached = Engine::Create(options);
      if (!cached.ok()) {
        fmt::print(stderr, "kvl: {}\n", cached.status().ToString());
        return 1;
      }
      StatusOr<PrefixResult> pr =
          TimePrefix(**cached, args.prefix_tokens, args.suffix_tokens, args.repetitions);
      if (!pr.ok()) {
        fmt::print(stderr, "kvl: {}\n", pr.status().ToString());
        return 1;
      }
      const double miss = Mean(pr->miss_ms), hit = Mean(pr->hit_ms);
      // A speedup is claimed only when the hit really came from the cache.
      const bool from_cache = pr->hit_cached_tokens > 0 && hit > 0;
      const double speedup = from_cache ? miss / hit : 0.0;
      prefix_lines.push_back(fmt::format(
          "| {:<22} | {:>7} | {:>6} | {:>6} | {:>13.2f} | {:>12.2f} | {:>13} | {:>9} |",
          ModelLabel(e.model()), e.num_threads(), args.prefix_tokens, args.suffix_tokens, miss,
          hit, pr->hit_cached_tokens, from_cache ? fmt::format("{:.1f}x", speedup) : "n/a"));
      all.push_back({{"model_filename", path},
                     {"test", "prefix_ttft"},
                     {"n_threads", e.num_threads()},
                     {"type_k", options.cache_type_k},
                     {"type_v", options.cache_type_v},
                     {"prefix_tokens", args.prefix_tokens},
                     {"suffix_tokens", args.suffix_tokens},
                     {"ttft_miss_ms", pr->miss_ms},
                     {"ttft_hit_ms", pr->hit_ms},
                     {"hit_cached_tokens", pr->hit_cached_tokens},
                     {"speedup", from_cache ? nlohmann::json(speedup) : nlohmann::json(nullptr)}});
    }
  }
  if (markdown && !prefix_lines.empty()) {
    fmt::print("\n| {:<22} | {:>7} | {:>6} | {:>6} | {:>13} | {:>12} | {:>13} | {:>9} |\n", "model",
               "threads", "prefix", "suffix", "TTFT miss ms", "TTFT hit ms", "cached tokens",
               "speedup");
    fmt::print("| {:-<22} | {:->7} | {:->6} | {:->6} | {:->13} | {:->12} | {:->13} | {:->9} |\n", ":",
               ":", ":", ":", ":", ":", ":", ":");
    for (const std::string& line : prefix_lines) fmt::print("{}\n", line);
  }
  if (!markdown) fmt::print("{}\n", all.dump(2));
  return 0;
}

}  // namespace kvl::cli
