// kvl bench spec: speculative decoding (issue 26) against plain decoding.
//  1. Workloads through the engine, greedy, each run on fresh engines (--spec off, then the
//     chosen mode, then --spec draft where -md names a draft model): tokens per second of
//     decoding, acceptance, tokens per sequence step, and
//     whether the tokens are identical (they must be). Workloads that repeat their input (retell
//     a given text, answer from a given document, a chat's second turn quoting its first, edit a
//     given text), that repeat an earlier request (an agent re-issuing a task it ran, or one
//     whose tool result changed; a chat resubmitting its history and asking for its story
//     again: the earlier requests are what the suffix drafter's recent-requests index holds),
//     and open prose, where the cost model must turn speculation off.
//  2. The verify step's cost on the model: a forward step of 1 + k rows against one row, at a
//     context of --depth tokens (on a synthetic shape, `kvl synth`, this is the side of the
//     trade that is real; its acceptance is not, random weights predict nothing), and per
//     workload the projected speedup: tokens per step x T(1) / T(1 + mean draft).
// Prints a table, or JSON (-o json, --json FILE).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "cli.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/thread_pool.h"

namespace kvl::cli {
namespace {

using BenchClock = std::chrono::steady_clock;

// A text the workloads repeat (TinyStories' register, so stories260K predicts it as it would).
constexpr const char* kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
    "with her big red ball. One day, Lily saw a little dog under a tree. The dog was sad because "
    "he lost his bone. Lily said, \"Do not be sad, little dog. I will help you find your bone.\" "
    "They looked under the tree and behind the slide. At last, Lily found the bone in the sand. "
    "The dog was so happy that he wagged his tail and licked her face. Lily and the dog became "
    "best friends, and they played in the park every day.";

// A workload: the requests before the measured one run on the same engine (what they said is
// what a drafter across requests drafts from, as a server's recent requests), then the measured
// request.
struct Workload {
  std::string name;
  std::string prompt;
  // What runs before the measured request, and how its prompt is made.
  enum class Before {
    kNothing,       // the prompt alone
    kQuoteReply,    // a first turn; the measured turn quotes its reply (chat-quote)
    kSameRequest,   // the same request ran before (an agent re-issuing a task it ran)
    kNearlySame,    // a request that differs from the measured one in a few words ran before
    kResubmit,      // turns that resubmit the history, each asking for the story again
  } before = Before::kNothing;
  std::string earlier_prompt;  // kNearlySame: the request that ran before

  Workload(std::string name_, std::string prompt_, Before before_ = Before::kNothing,
           std::string earlier_prompt_ = "")
      : name(std::move(name_)),
        prompt(std::move(prompt_)),
        before(before_),
        earlier_prompt(std::move(earlier_prompt_)) {}
};

std::vector<Workload> Workloads() {
  const std::string story = kStory;
  // An agent's task: a document, a tool's observation, a question (the same words each time the
  // loop comes back to it, or an observation that changed).
  const std::string task = story + "\nTool result: the ball is red.\nQuestion: What did Lily find?"
                                   "\nAnswer:";
  const std::string changed_task =
      story + "\nTool result: the ball is blue.\nQuestion: What did Lily find?\nAnswer:";
  return {
      {"retell", story + "\nTell the story again.\n" + story.substr(0, 60)},
      {"document-qa",
       story + "\nQuestion: What did Lily find?\nAnswer: At last, Lily found the bone in the sand. "
               "The dog was"},
      {"chat-quote", story + "\nWhat happened next?\n", Workload::Before::kQuoteReply},
      {"agent-repeat", task, Workload::Before::kSameRequest},
      {"agent-nearly", changed_task, Workload::Before::kNearlySame, task},
      {"chat-resubmit", "Once upon a time", Workload::Before::kResubmit},
      {"edit", story + "\nThe same story, with the dog named Max:\n" + story.substr(0, 90)},
      {"prose", "Once upon a time"},
  };
}

struct RunResult {
  std::vector<int32_t> tokens;
  double decode_ms = 0;  // first token to last
  EngineMetrics metrics;
};

// One greedy request on `e`; the time from its first token to its last.
StatusOr<RunResult> RunOnce(Engine& e, const std::string& prompt, int32_t n) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  RunResult out;
  BenchClock::time_point first, last;
  Status error;
  KVL_RETURN_IF_ERROR(e.Submit(r, [&](const TokenEvent& ev) {
                        if (!ev.error.ok()) error = ev.error;
                        if (ev.token < 0) return;
                        last = BenchClock::now();
                        if (out.tokens.empty()) first = last;
                        out.tokens.push_back(ev.token);
                      }).status());
  e.RunUntilIdle();
  KVL_RETURN_IF_ERROR(error);
  out.decode_ms = std::chrono::duration<double, std::milli>(last - first).count();
  return out;
}

// The workload's requests on a fresh engine: those before the measured one (Workload::Before),
// then the measured request; only its own figures are kept.
StatusOr<RunResult> RunWorkload(const EngineOptions& options, const Workload& w, int32_t n) {
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(options));
  std::string prompt = w.prompt;
  switch (w.before) {
    case Workload::Before::kNothing:
      break;
    case Workload::Before::kQuoteReply: {
      KVL_ASSIGN_OR_RETURN(RunResult first, RunOnce(*e, prompt, n));
      const std::string reply = e->tokenizer().Decode(first.tokens);
      prompt += reply + "\nSay that again.\n" + reply.substr(0, reply.size() / 4);
      break;
    }
    case Workload::Before::kSameRequest:
      KVL_RETURN_IF_ERROR(RunOnce(*e, prompt, n).status());
      break;
    case Workload::Before::kNearlySame:
      KVL_RETURN_IF_ERROR(RunOnce(*e, w.earlier_prompt, n).status());
      break;
    case Workload::Before::kResubmit:
      // Two turns, each resubmitting the history so far and asking for the story again; the
      // third (measured) asks once more.
      for (int turn = 0; turn < 2; ++turn) {
        KVL_ASSIGN_OR_RETURN(RunResult reply, RunOnce(*e, prompt, n));
        prompt += e->tokenizer().Decode(reply.tokens) + "\nTell me that story again.\n" + w.prompt;
      }
      break;
  }
  const EngineMetrics before = e->Metrics();
  KVL_ASSIGN_OR_RETURN(RunResult out, RunOnce(*e, prompt, n));
  out.metrics = e->Metrics();
  // The measured turn's own counts.
  out.metrics.spec_drafted -= before.spec_drafted;
  out.metrics.spec_accepted -= before.spec_accepted;
  out.metrics.spec_seq_steps -= before.spec_seq_steps;
  out.metrics.spec_draft_steps -= before.spec_draft_steps;
  out.metrics.tokens_generated -= before.tokens_generated;
  return out;
}

struct WorkloadFigures {
  std::string name;
  std::string drafter;  // the --spec mode
  double plain_tps = 0, spec_tps = 0;
  double acceptance = 0, tokens_per_step = 0, mean_draft = 0;
  int64_t drafted = 0, accepted = 0;
  int64_t tokens = 0, seq_steps = 0, draft_steps = 0;
  bool identical = false;
};

// Median ms of a forward step of each of `row_counts` rows of one sequence at positions
// depth..depth+rows-1. The counts take turns step by step, so that a machine whose speed drifts
// while they run (others' load, DRAM shared with other VMs) slows each alike: measured one count
// after another, the ratio of a 9-row step to a 1-row one moved 1.65x to 2.61x between runs.
std::vector<double> StepMs(Forward& forward, KvCache& cache, int64_t depth,
                           const std::vector<int64_t>& row_counts, int repetitions) {
  std::vector<TokenBatch> batches(row_counts.size());
  for (size_t k = 0; k < row_counts.size(); ++k) {
    for (int64_t i = 0; i < row_counts[k]; ++i) {
      batches[k].Add(static_cast<int32_t>(3 + i), depth + i, 0, true);
    }
  }
  std::vector<std::vector<double>> ms(row_counts.size());
  for (int r = 0; r < repetitions + 1; ++r) {
    for (size_t k = 0; k < row_counts.size(); ++k) {
      const BenchClock::time_point start = BenchClock::now();
      forward.Run(batches[k], cache);
      const double t = std::chrono::duration<double, std::milli>(BenchClock::now() - start).count();
      if (r > 0) ms[k].push_back(t);  // the first round warms the caches
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& m : ms) {
    std::sort(m.begin(), m.end());
    medians.push_back(m[m.size() / 2]);
  }
  return medians;
}

}  // namespace

std::vector<std::string> SpecModesOf(const std::string& list) {
  std::vector<std::string> modes;
  for (size_t from = 0; from <= list.size();) {
    const size_t comma = std::min(list.find(',', from), list.size());
    modes.push_back(list.substr(from, comma - from));
    from = comma + 1;
  }
  return modes;
}

bool IsBenchSpecWorkload(const std::string& name) {
  const std::vector<Workload> all = Workloads();
  return std::any_of(all.begin(), all.end(), [&](const Workload& w) { return w.name == name; });
}

int BenchSpecCommand(const BenchSpecArgs& args) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kvl bench spec: {}\n", s.ToString());
    return 1;
  };
  EngineOptions base;
  base.model_path = args.model_path;
  base.num_threads = args.num_threads;
  base.max_seqs = 1;
  base.context_length = args.context_length;
  base.draft_max = args.draft_max;
  base.calibrate = false;  // KV prices play no part here
  // The speculative configurations, each compared with plain decoding (--spec: one mode or a
  // comma-separated list, run in turn in the same conditions).
  std::vector<EngineOptions> specs;
  for (const std::string& mode : SpecModesOf(args.spec)) {
    specs.push_back(base);
    specs.back().spec = mode;
    specs.back().spec_force = args.spec_force;
  }
  if (!args.draft_model.empty()) {
    specs.push_back(base);
    specs.back().spec = "draft";
    specs.back().draft_model_path = args.draft_model;
    specs.back().spec_force = args.spec_force;
  }
  base.spec = "off";
  for (const EngineOptions& spec : specs) {
    if (Status s = ValidateEngineOptions(spec); !s.ok()) return fail(s);
  }

  // 1. The verify step's cost on this model.
  StatusOr<std::unique_ptr<Model>> model = Model::Load(args.model_path);
  if (!model.ok()) return fail(model.status());
  const ModelConfig& c = (*model)->config();
  const int threads = ThreadsOrEveryCore(args.num_threads);
  StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(threads);
  if (!pool.ok()) return fail(pool.status());
  ops::OpsContext ctx(ops::BestIsa(), pool->get());
  const int64_t max_rows = 1 + args.draft_max;
  ForwardOptions fo;
  fo.max_batch_tokens = std::max<int64_t>(max_rows, 64);
  fo.max_logit_rows = max_rows;
  fo.max_context = args.depth + fo.max_batch_tokens;
  Forward forward(**model, ctx, fo);
  StatusOr<std::unique_ptr<ContiguousKvCache>> cache =
      ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, fo.max_context);
  if (!cache.ok()) return fail(cache.status());
  // The context the step attends to: depth tokens, in chunks.
  for (int64_t pos = 0; pos < args.depth; pos += fo.max_batch_tokens) {
    TokenBatch fill;
    for (int64_t p = pos; p < std::min(args.depth, pos + fo.max_batch_tokens); ++p) {
      fill.Add(static_cast<int32_t>(3 + p % 100), p, 0, false);
    }
    forward.Run(fill, **cache);
  }
  std::vector<int64_t> row_counts;
  for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, max_rows}) {
    if (rows > max_rows || (!row_counts.empty() && row_counts.back() == rows)) continue;
    row_counts.push_back(rows);
  }
  const std::vector<double> medians =
      StepMs(forward, **cache, args.depth, row_counts, args.repetitions);
  std::vector<std::pair<int64_t, double>> step_ms;  // rows, ms
  for (size_t k = 0; k < row_counts.size(); ++k) step_ms.push_back({row_counts[k], medians[k]});
  const double one_row_ms = step_ms.front().second;
  auto relative = [&](double rows) {  // T(rows) / T(1), linear between the measured points
    for (size_t i = 1; i < step_ms.size(); ++i) {
      if (rows <= static_cast<double>(step_ms[i].first)) {
        const auto [r0, t0] = step_ms[i - 1];
        const auto [r1, t1] = step_ms[i];
        const double f = (rows - static_cast<double>(r0)) / static_cast<double>(r1 - r0);
        return (t0 + f * (t1 - t0)) / one_row_ms;
      }
    }
    return step_ms.back().second / one_row_ms;
  };

  // 2. The workloads, plain then speculative.
  std::vector<WorkloadFigures> figures;
  const std::vector<std::string> chosen = SpecModesOf(args.workloads);
  for (const Workload& w : Workloads()) {
    if (args.steps_only) break;
    if (!args.workloads.empty() && std::find(chosen.begin(), chosen.end(), w.name) == chosen.end()) {
      continue;
    }
    // Plain and speculative runs take turns (--runs each), so that a load that comes and goes
    // slows both alike; the median tok/s of each is kept.
    const auto tps = [](const RunResult& r) {
      return r.decode_ms > 0 ? 1000.0 * static_cast<double>(r.tokens.size() - 1) / r.decode_ms : 0;
    };
    std::vector<double> plain_tps;
    std::vector<std::vector<double>> spec_tps(specs.size());
    StatusOr<RunResult> plain = InvalidArgumentError("no run");
    std::vector<RunResult> sped(specs.size());
    for (int run = 0; run < args.runs; ++run) {
      plain = RunWorkload(base, w, args.n_gen);
      if (!plain.ok()) return fail(plain.status());
      plain_tps.push_back(tps(*plain));
      for (size_t i = 0; i < specs.size(); ++i) {
        StatusOr<RunResult> r = RunWorkload(specs[i], w, args.n_gen);
        if (!r.ok()) return fail(r.status());
        spec_tps[i].push_back(tps(*r));
        sped[i] = std::move(r).value();
      }
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (size_t i = 0; i < specs.size(); ++i) {
      WorkloadFigures f;
      f.name = w.name;
      f.drafter = specs[i].spec;
      f.plain_tps = median(plain_tps);
      f.spec_tps = median(spec_tps[i]);
      const EngineMetrics& m = sped[i].metrics;
      f.drafted = m.spec_drafted;
      f.accepted = m.spec_accepted;
      f.acceptance =
          m.spec_drafted > 0 ? static_cast<double>(m.spec_accepted) / m.spec_drafted : 0;
      f.tokens_per_step = m.spec_seq_steps > 0
                              ? static_cast<double>(m.tokens_generated) / m.spec_seq_steps
                              : 1.0;
      f.mean_draft = m.spec_draft_steps > 0
                         ? static_cast<double>(m.spec_drafted) / m.spec_draft_steps
                         : 0.0;
      f.tokens = m.tokens_generated;
      f.seq_steps = m.spec_seq_steps;
      f.draft_steps = m.spec_draft_steps;
      f.identical = plain->tokens == sped[i].tokens;
      figures.push_back(f);
    }
  }

  nlohmann::json j;
  j["model"] = c.name;
  j["model_path"] = args.model_path;
  j["threads"] = threads;
  j["spec"] = args.spec;
  j["draft_model"] = args.draft_model;
  j["draft_max"] = args.draft_max;
  j["spec_force"] = args.spec_force;
  j["n_gen"] = args.n_gen;
  j["depth"] = args.depth;
  for (const auto& [rows, ms] : step_ms) {
    j["step_ms"].push_back({{"rows", rows}, {"ms", ms}, {"relative", ms / one_row_ms}});
  }
  bool all_identical = true;
  for (const WorkloadFigures& f : figures) {
    // The workload's steps priced in one-row steps of this model: plain steps at 1, verify
    // steps (drafts of the mean length) at T(1 + mean draft) / T(1).
    const double step_units = static_cast<double>(f.seq_steps - f.draft_steps) +
                              static_cast<double>(f.draft_steps) * relative(1.0 + f.mean_draft);
    const double steps_projected =
        step_units > 0 ? static_cast<double>(f.tokens) / step_units : 1.0;
    all_identical &= f.identical;
    j["workloads"].push_back({{"name", f.name},
                              {"drafter", f.drafter},
                              {"plain_tok_s", f.plain_tps},
                              {"spec_tok_s", f.spec_tps},
                              {"speedup", f.plain_tps > 0 ? f.spec_tps / f.plain_tps : 0},
                              {"drafted", f.drafted},
                              {"accepted", f.accepted},
                              {"acceptance", f.acceptance},
                              {"tokens_per_step", f.tokens_per_step},
                              {"mean_draft", f.mean_draft},
                              {"projected_speedup_at_this_step_cost", steps_projected},
                              {"identical_tokens", f.identical}});
  }
  if (args.output == "json") {
    fmt::print("{}\n", j.dump(1));
  } else {
    fmt::print("kvl bench spec: {} ({} threads, {} kernels), --spec {}{}, --draft-max {}, {} "
               "tokens per workload, greedy\n\n",
               c.name, threads, ops::KernelsName(ctx.isa()), args.spec,
               args.spec_force ? " --spec-force" : "", args.draft_max, args.n_gen);
    fmt::print("step cost at a context of {} tokens (median of {}):\n", args.depth,
               args.repetitions);
    fmt::print("| rows | ms | x one row |\n|---:|---:|---:|\n");
    for (const auto& [rows, ms] : step_ms) {
      fmt::print("| {} | {:.3f} | {:.3f} |\n", rows, ms, ms / one_row_ms);
    }
    if (!args.draft_model.empty()) fmt::print("draft model (--spec draft): {}\n", args.draft_model);
    fmt::print("\n| workload | drafter | plain tok/s | spec tok/s | speedup | drafted | accepted | "
               "acceptance | tokens/step | mean draft | projected x | identical |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t i = 0; i < figures.size(); ++i) {
      const WorkloadFigures& f = figures[i];
      fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.2f}x | {} | {} | {:.1f}% | {:.2f} | {:.2f} | "
                 "{:.2f} | {} |\n",
                 f.name, f.drafter, f.plain_tps, f.spec_tps,
                 f.plain_tps > 0 ? f.spec_tps / f.plain_tps : 0,
                 f.drafted, f.accepted, 100 * f.acceptance, f.tokens_per_step, f.mean_draft,
                 j["workloads"][i]["projected_speedup_at_this_step_cost"].get<double>(),
                 f.identical ? "yes" : "NO");
    }
    fmt::print("\nprojected x: tokens per step x T(1) / T(1 + mean draft), this model's step "
               "cost with the workload's acceptance\n");
  }
  if (!args.json_path.empty()) {
    std::ofstream file(args.json_path);
    file << j.dump(1) << "\n";
    if (!file) return fail(IoError(fmt::format("cannot write {}", args.json_path)));
  }
  if (!all_identical) {
    fmt::print(stderr, "kvl bench spec: speculative tokens differ from plain decoding's\n");
    return 1;
  }
  return 0;
}

}  // namespace kvl::cli
