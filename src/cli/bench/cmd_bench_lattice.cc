// kvl bench lattice: the lattice's claim measured end to end. `auto` (the cost model choosing
// per page) against each fixed KV policy under the same budget and the same lower tiers (a disk
// tier: --kv-tier disk:PATH:SIZE, else a scratch file in TMPDIR; and Redis behind a shaped network
// link where it can be started, lattice_redis_link.h), at budgets of 1/8, 1/4 and 1/2 (--budgets)
// of each workload's working set (the distinct tokens of all its histories), on four workloads
// whose pages differ (lattice_workloads.h): skewed multi-turn chats, RAG, an agent loop, long
// generations. Every cell is a fresh engine running the workload's script to its end
// (lattice_cell.h), --runs times in rounds: each round runs every cell of the workload once,
// forward in even rounds and backward in odd ones, so that a machine whose load drifts slows no
// policy more than another; the cell's figures are its median run by tok/s, with the range over
// the runs and the process CPU time per token (less sensitive than wall time to other processes
// on a busy machine). Keep-all runs twice: the reference (a budget that holds the whole working
// set), and a repeat whose replies must be identical to it (the engine is deterministic) and
// whose speed shows the run-to-run spread. Per cell the process's RSS less the weights is
// checked against the budget (RSS - weights - fixed <= budget + 5%). A table per workload, with
// `auto`'s verdict against the best fixed policy of equal or better quality (lattice_verdict.h),
// and JSON (--json) that scripts/plots.py draws as a Pareto panel per workload. Quality figures
// (KLD, top-1) mean something only on a trained model: on a synthetic file of random weights
// they are marked meaningless.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench_lattice.h"
#include "cli.h"
#include "engine_drive.h"
#include "kvl/engine.h"
#include "kvl/model.h"
#include "kvl/tokenizer.h"
#include "lattice_cell.h"
#include "lattice_redis_link.h"
#include "lattice_verdict.h"
#include "lattice_workloads.h"

namespace kvl::cli {
namespace {

// A cell's runs in round order made one: the run of median tok/s, whole (its TTFTs and replies
// with it), so that one run slowed by the machine's other work does not decide a cell, carrying
// every run's tok/s and CPU tok/s; a run that failed stands for the cell.
Cell MedianOfRuns(std::vector<Cell> runs) {
  std::vector<double> tok_s, cpu_tok_s;
  for (const Cell& r : runs) {
    if (!r.error.empty()) return r;
    tok_s.push_back(r.tok_s);
    cpu_tok_s.push_back(r.cpu_tok_s);
  }
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tok_s[a] < tok_s[b]; });
  Cell median = std::move(runs[order[order.size() / 2]]);
  median.run_tok_s = std::move(tok_s);
  median.run_cpu_tok_s = std::move(cpu_tok_s);
  std::vector<double> sorted_cpu = median.run_cpu_tok_s;
  std::sort(sorted_cpu.begin(), sorted_cpu.end());
  median.cpu_tok_s = sorted_cpu[sorted_cpu.size() / 2];
  return median;
}

// Every cell --runs times, each run in a fresh engine, in rounds: a round runs each cell once,
// forward in even rounds and backward in odd ones. A cell that fails (or is skipped) runs no more.
std::vector<Cell> RunRounds(const LatticeSetup& setup, const std::vector<CellSpec>& specs) {
  const int32_t runs_wanted = setup.args->runs;
  std::vector<std::vector<Cell>> runs(specs.size());
  for (int32_t round = 0; round < runs_wanted; ++round) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const size_t i = round % 2 == 0 ? k : specs.size() - 1 - k;
      if (!runs[i].empty() && !runs[i].back().error.empty()) continue;
      const CellSpec& c = specs[i];
      if (c.skip_reason.empty()) {
        fmt::print(stderr, "kvl: {} {}: {} (run {} of {}) ...\n", setup.workload->name,
                   c.fraction > 0 ? fmt::format("at 1/{:.0f}", 1 / c.fraction) : "keep-all",
                   c.policy, round + 1, runs_wanted);
      }
      runs[i].push_back(RunCell(setup, c));
    }
  }
  std::vector<Cell> cells;
  for (std::vector<Cell>& r : runs) cells.push_back(MedianOfRuns(std::move(r)));
  return cells;
}

// The disk tier every cell gets: --kv-tier's, else a file in TMPDIR; ":scratch", so that each
// cell's engine starts it empty (no cell finds the pages of the one before) and removes it.
std::string CellDiskTier(const BenchLatticeArgs& args, int64_t working_set_bytes) {
  std::string spec = args.disk_tier;
  if (spec.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    const std::filesystem::path dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    // Room for every page of the working set several times over (the store's cached copies
    // beside the pages demoted from running sequences).
    spec = fmt::format("disk:{}:{}", (dir / fmt::format("kvl-lattice-{}.tier", getpid())).string(),
                       4 * working_set_bytes + (16ll << 20));
  }
  if (!spec.ends_with(":scratch")) spec += ":scratch";
  return spec;
}

// Whether the model's quality figures mean anything: `kvl synth` files (random weights) have
// near ties everywhere, so any loss there looks like a large disagreement.
bool QualityMeaningful(const ModelConfig& mc) {
  return mc.name.find("random weights") == std::string::npos;
}

void PrintWorkloadTable(const LatticeWorkload& w, int64_t working_set_bytes, const Cell& reference,
                        const Cell& repeat, const std::vector<Cell>& cells,
                        const std::vector<Verdict>& verdicts, bool quality_meaningful) {
  fmt::print("\n### {}: {}\n", w.name, w.description);
  fmt::print("{} requests, {} tokens generated per cell; working set {} tokens ({}); keep-all's "
             "peak resident KV {}\n",
             w.requests, w.generated_tokens, w.working_set_tokens, FormatBytes(working_set_bytes),
             FormatBytes(reference.resident_peak));
  if (!quality_meaningful) {
    fmt::print("top-1 and KLD are MEANINGLESS here: the model has random weights (speed only)\n");
  }
  fmt::print("\n| {:>6} | {:<18} | {:<10} | {:>8} | {:>11} | {:>9} | {:>6} | {:>8} | {:>7} | {:>9} "
             "| {:>8} | {:>10} | {:>10} | {:>10} | {:>5} | {:>7} | {:>8} | {:<34} |\n",
             "budget", "policy", "quality", "tok/s", "runs' range", "CPU tok/s", "vs ref",
             "TTFT p50", "top-1", "identical", "KLD", "budget", "RSS-w peak", "fixed", "bound",
             "preempt", "back ms", "pages per action");
  fmt::print("| {:->6} | {:-<18} | {:-<10} | {:->8} | {:->11} | {:->9} | {:->6} | {:->8} | {:->7} "
             "| {:->9} | {:->8} | {:->10} | {:->10} | {:->10} | {:->5} | {:->7} | {:->8} | {:-<34} "
             "|\n",
             ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":",
             ":");
  auto row = [&](const Cell& c) {
    const std::string budget =
        c.budget_fraction > 0 ? fmt::format("1/{:.0f}", 1 / c.budget_fraction) : "all";
    if (!c.skipped.empty()) {
      fmt::print("| {:>6} | {:<18} | skipped: {} |\n", budget, c.policy, c.skipped);
      return;
    }
    if (!c.error.empty()) {
      fmt::print("| {:>6} | {:<18} | failed: {} |\n", budget, c.policy, c.error);
      return;
    }
    const auto [lo, hi] = std::minmax_element(c.run_tok_s.begin(), c.run_tok_s.end());
    const std::string range =
        c.run_tok_s.size() > 1 ? fmt::format("{:.0f}-{:.0f}", *lo, *hi) : std::string("-");
    fmt::print("| {:>6} | {:<18} | {:<10} | {:>8.1f} | {:>11} | {:>9.1f} | {:>5.2f}x | {:>8.1f} "
               "| {:>6.1f}% | {:>9} | {:>8.1e} | {:>10} | {:>10} | {:>10} | {:>5} | {:>7} | "
               "{:>8.1f} | {:<34} |\n",
               budget, c.policy, c.quality, c.tok_s, range, c.cpu_tok_s,
               reference.tok_s > 0 ? c.tok_s / reference.tok_s : 0, c.ttft_p50_ms, 100 * c.top1,
               fmt::format("{}/{}", c.identical, c.requests), c.kld_mean,
               FormatBytes(c.budget_bytes), FormatBytes(c.rss_minus_weights_peak),
               FormatBytes(c.fixed_bytes), c.rss_bound_holds ? "holds" : "NO", c.preemptions,
               c.bring_back_ms, ActionsText(c));
  };
  row(reference);
  row(repeat);
  for (const Cell& c : cells) row(c);
  fmt::print("\n| {:>6} | {:<40} | {:>10} | {:>16} | {:>9} | {:>7} | {:>10} |\n", "budget",
             "auto vs the best fixed policy of equal or better quality", "auto / best",
             "rounds' range", "CPU time", "actions", "best of all");
  fmt::print("| {:->6} | {:-<40} | {:->10} | {:->16} | {:->9} | {:->7} | {:->10} |\n", ":", ":",
             ":", ":", ":", ":", ":");
  for (const Verdict& v : verdicts) {
    const std::string budget = fmt::format("1/{:.0f}", 1 / v.budget_fraction);
    if (v.auto_tok_s <= 0) {
      fmt::print("| {:>6} | {:<40} | {:>10} | {:>16} | {:>9} | {:>7} | {:>10} |\n", budget,
                 v.note, "-", "-", "-", "-", "-");  // why auto has no figure
      continue;
    }
    const std::string against =
        v.best_policy.empty()
            ? "no fixed policy reached auto's quality"
            : fmt::format("{} ({:.1f} tok/s){}", v.best_policy, v.best_tok_s,
                          v.within_3pct ? "" : ": auto more than 3% slower");
    const bool rounds = !v.best_policy.empty() && v.round_ratio_max > 0;
    fmt::print("| {:>6} | {:<40} | {:>10} | {:>16} | {:>9} | {:>7} | {:>10} |\n", budget, against,
               v.best_policy.empty() ? "-" : fmt::format("{:.2f}", v.ratio),
               rounds ? fmt::format("{:.2f} ({:.2f}-{:.2f})", v.round_ratio_median,
                                    v.round_ratio_min, v.round_ratio_max)
                      : std::string("-"),
               v.best_policy.empty() || v.cpu_ratio <= 0 ? "-" : fmt::format("{:.2f}", v.cpu_ratio),
               v.mixed_actions, v.strictly_best ? "auto" : "-");
  }
  // The goal's closing note: why, where auto is not within 3% or not strictly best.
  fmt::print("\n");
  for (const Verdict& v : verdicts) {
    if (v.note.empty()) continue;
    fmt::print("- 1/{:.0f}: {}.\n", 1 / v.budget_fraction, v.note);
  }
  (void)FlushStdout();
}

nlohmann::json CellJson(const std::string& workload, const Cell& c, bool quality_meaningful) {
  return {{"workload", workload},
          {"policy", c.policy},
          {"quality", c.quality},
          {"budget_fraction", c.budget_fraction},
          {"budget_bytes", c.budget_bytes},
          {"rss_minus_weights_peak_bytes", c.rss_minus_weights_peak},
          {"fixed_bytes", c.fixed_bytes},
          {"rss_bound_holds", c.rss_bound_holds},
          {"tok_s", c.tok_s},
          {"cpu_tok_s", c.cpu_tok_s},
          {"kld_mean", c.kld_mean},
          {"top1", c.top1},
          {"quality_meaningful", quality_meaningful},
          {"replies_identical", c.replies_identical},
          {"identical_replies", c.identical},
          {"requests", c.requests},
          {"action_pages", ActionPagesJson(c.action_pages)},
          {"actions_restored", ActionPagesJson(c.restored_pages)},
          {"wall_ms", c.wall_ms},
          {"cpu_ms", c.cpu_ms},
          {"run_tok_s", c.run_tok_s},
          {"run_cpu_tok_s", c.run_cpu_tok_s},
          {"generated_tokens", c.generated},
          {"ttft_p50_ms", c.ttft_p50_ms},
          {"ttft_p99_ms", c.ttft_p99_ms},
          {"kld_positions", c.kld_positions},
          {"resident_peak", c.resident_peak},
          {"preemptions", c.preemptions},
          {"bring_back_ms", c.bring_back_ms},
          {"skipped", c.skipped},
          {"error", c.error}};
}

nlohmann::json VerdictJson(const Verdict& v) {
  return {{"budget_fraction", v.budget_fraction},
          {"budget_bytes", v.budget_bytes},
          {"best_fixed_policy", v.best_policy},
          {"best_tok_s", v.best_tok_s},
          {"auto_tok_s", v.auto_tok_s},
          {"ratio", v.ratio},
          {"within_3pct", v.within_3pct},
          {"round_ratio_min", v.round_ratio_min},
          {"round_ratio_median", v.round_ratio_median},
          {"round_ratio_max", v.round_ratio_max},
          {"cpu_ratio", v.cpu_ratio},
          {"strictly_best", v.strictly_best},
          {"same_choices_as", v.same_choices_as},
          {"mixed_actions", v.mixed_actions},
          {"note", v.note}};
}

// The workload's verdict: `best_fixed_policy` and `ratio` are those of its worst budget (the one
// the goal "within 3% in every cell" is judged by; a budget where auto did not complete is the
// worst of all, ratio 0), with every budget's verdict in `by_budget`.
nlohmann::json AutoVerdictJson(const std::vector<Verdict>& verdicts) {
  const Verdict* worst = nullptr;
  bool within_everywhere = true, wins_by_10pct = false;
  nlohmann::json by_budget = nlohmann::json::array();
  for (const Verdict& v : verdicts) {
    by_budget.push_back(VerdictJson(v));
    // Judged: auto ran (or failed) and a fixed policy of its quality completed beside it.
    const bool judged = v.has_auto && (v.auto_tok_s <= 0 || !v.best_policy.empty());
    if (!judged) continue;  // no fixed policy of auto's quality: nothing to be within
    within_everywhere = within_everywhere && v.auto_tok_s > 0 && v.within_3pct;
    wins_by_10pct = wins_by_10pct || (v.strictly_best && v.ratio >= 1.10);
    if (worst == nullptr || v.ratio < worst->ratio) worst = &v;
  }
  return {{"best_fixed_policy", worst != nullptr ? worst->best_policy : ""},
          {"ratio", worst != nullptr ? worst->ratio : 0.0},
          {"budget_fraction", worst != nullptr ? worst->budget_fraction : 0.0},
          {"within_3pct_everywhere", worst != nullptr && within_everywhere},
          {"strictly_better_by_10pct_somewhere", wins_by_10pct},
          {"by_budget", std::move(by_budget)}};
}

bool PoliciesNeed(const BenchLatticeArgs& args, const std::string& policy) {
  return std::find(args.policies.begin(), args.policies.end(), policy) != args.policies.end();
}

}  // namespace

int BenchLatticeCommand(const BenchLatticeArgs& args) {
  // The model once here, for its tokenizer and shape; each cell loads its own engine.
  StatusOr<BenchModel> loaded = LoadBenchModel(args.engine.model_path);
  if (!loaded.ok()) {
    fmt::print(stderr, "kvl: {}\n", loaded.status().ToString());
    return 1;
  }
  const Tokenizer* tokenizer = loaded->tokenizer.get();
  const ModelConfig& mc = loaded->model->config();
  const bool quality_meaningful = QualityMeaningful(mc);
  const int64_t bytes_per_token = KvBytesPerToken(mc, args.engine);
  // Every workload made before any cell runs: a size the model cannot hold is an error now.
  std::vector<LatticeWorkload> workloads;
  for (const std::string& name : args.workloads) {
    StatusOr<LatticeWorkload> w = MakeLatticeWorkload(name, args, *tokenizer,
                                                      args.engine.block_tokens, mc.context_length);
    if (!w.ok()) {
      fmt::print(stderr, "kvl: {}\n", w.status().message());
      return 1;
    }
    workloads.push_back(std::move(*w));
  }
  RedisLink redis;
  if (PoliciesNeed(args, "demote-redis")) {
    redis = StartRedisLink(args.redis_script, args.redis_rate);
  } else {
    redis.skip_reason = "demote-redis is not among --policies";
  }
  fmt::print("kvl bench lattice: model {} ({}, {} layers, kv_dim {}, {} per token of KV); "
             "budgets {} of each working set; policies {}; Redis: {}; llama-server row: not "
             "implemented\n",
             std::filesystem::path(args.engine.model_path).filename().string(), mc.name,
             mc.num_layers, mc.kv_dim(), FormatBytes(bytes_per_token),
             fmt::join(args.budgets, ", "), fmt::join(args.policies, ", "),
             redis.tier_spec.empty() ? "skipped (" + redis.skip_reason + ")"
                                     : fmt::format("{} over {}", redis.tier_spec, redis.rate));
  (void)FlushStdout();

  nlohmann::json out = {{"bench", "lattice"},
                        {"model", args.engine.model_path},
                        {"model_name", mc.name},
                        {"quality_meaningful", quality_meaningful},
                        {"num_layers", mc.num_layers},
                        {"kv_dim", mc.kv_dim()},
                        {"kv_bytes_per_token", bytes_per_token},
                        {"threads", args.engine.num_threads},
                        {"runs", args.runs},
                        {"budgets", args.budgets},
                        {"policies", args.policies},
                        {"rss_bound_slack", kRssBoundSlack},
                        {"redis", {{"started", !redis.tier_spec.empty()},
                                   {"tier_spec", redis.tier_spec},
                                   {"rate", redis.rate},
                                   {"skip_reason", redis.skip_reason}}},
                        {"llama_server", "not implemented"},
                        {"workloads", nlohmann::json::array()}};
  bool reference_failed = false;
  int64_t cells_run = 0, bound_holds = 0;
  int cell_index = 0;
  for (const LatticeWorkload& w : workloads) {
    const int64_t working_set_bytes = w.working_set_tokens * bytes_per_token;
    LatticeSetup setup;
    setup.args = &args;
    setup.workload = &w;
    setup.disk_tier = CellDiskTier(args, working_set_bytes);
    setup.redis = &redis;
    // Keep-all's pool holds the whole working set and every running sequence's partial blocks,
    // so that it never lets a page go: the reference every other cell is compared with.
    const int64_t keep_all_budget =
        2 * working_set_bytes +
        static_cast<int64_t>(w.concurrency) * w.context * bytes_per_token;
    std::vector<CellSpec> specs = {{"keep-all", 0, keep_all_budget, cell_index++, ""},
                                   {"keep-all (repeat)", 0, keep_all_budget, cell_index++, ""}};
    for (double fraction : args.budgets) {
      const int64_t budget = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(working_set_bytes) * fraction));
      for (const std::string& policy : args.policies) {
        const std::string skip = policy == "demote-redis" && redis.tier_spec.empty()
                                     ? redis.skip_reason
                                     : std::string();
        specs.push_back({policy, fraction, budget, cell_index++, skip});
      }
    }
    std::vector<Cell> all = RunRounds(setup, specs);
    Cell reference = std::move(all[0]);
    Cell repeat = std::move(all[1]);
    if (!reference.error.empty()) {
      fmt::print(stderr, "kvl: workload {}: keep-all failed: {}\n", w.name, reference.error);
      reference_failed = true;
      continue;
    }
    std::vector<Cell> cells(std::make_move_iterator(all.begin() + 2),
                            std::make_move_iterator(all.end()));
    CompareWithReference(reference, &repeat);
    for (Cell& cell : cells) CompareWithReference(reference, &cell);
    CompareWithReference(reference, &reference);
    std::vector<Verdict> verdicts;
    for (double fraction : args.budgets) {
      verdicts.push_back(JudgeAuto(cells, fraction));
      verdicts.back().note = VerdictNote(verdicts.back(), cells, reference, repeat);
    }
    PrintWorkloadTable(w, working_set_bytes, reference, repeat, cells, verdicts,
                       quality_meaningful);
    nlohmann::json wj = {{"name", w.name},
                         {"description", w.description},
                         {"requests", w.requests},
                         {"generated_tokens", w.generated_tokens},
                         {"concurrency", w.concurrency},
                         {"context", w.context},
                         {"working_set_tokens", w.working_set_tokens},
                         {"working_set_bytes", working_set_bytes},
                         {"keep_all_peak_bytes", reference.resident_peak},
                         {"disk_tier", setup.disk_tier},
                         {"reference", CellJson(w.name, reference, quality_meaningful)},
                         {"repeat", CellJson(w.name, repeat, quality_meaningful)},
                         {"cells", nlohmann::json::array()},
                         {"auto_verdict", AutoVerdictJson(verdicts)}};
    for (const Cell* c : {&reference, &repeat}) {
      ++cells_run;
      bound_holds += c->rss_bound_holds ? 1 : 0;
    }
    for (const Cell& c : cells) {
      wj["cells"].push_back(CellJson(w.name, c, quality_meaningful));
      if (!c.error.empty()) continue;
      ++cells_run;
      bound_holds += c.rss_bound_holds ? 1 : 0;
    }
    out["workloads"].push_back(std::move(wj));
  }
  StopRedisLink(redis);
  fmt::print("\nRSS - weights - fixed <= budget + {:.0f}% in {} of {} cells that ran\n",
             100 * kRssBoundSlack, bound_holds, cells_run);
  if (!args.json_path.empty()) {
    std::ofstream f(args.json_path);
    f << out.dump(1) << "\n";
    if (!f.good()) {
      fmt::print(stderr, "kvl: cannot write {}\n", args.json_path);
      return 1;
    }
  }
  return reference_failed ? 1 : 0;
}

}  // namespace kvl::cli
