// kvl bench lattice: the lattice's claim measured end to end. `auto` (the cost model choosing
// per page) against each fixed KV policy, at budgets of 1/8, 1/4 and 1/2 (--budgets) of
// keep-all's peak resident KV, on three workloads (lattice_workloads.h): eight concurrent chats,
// requests sharing long prefixes (RAG-like), long generations. Every cell is a fresh engine
// running the workload's script to its end, --runs times in rounds: each round runs every cell
// of the workload once, forward in even rounds and backward in odd ones, so that a machine whose
// load drifts slows no policy more than another; the cell's figures are its median run by tok/s,
// with the range over the runs and the process CPU time per token (less sensitive than wall
// time to other processes on a busy machine). Per cell:
// output tok/s over the whole workload, TTFT p50 / p99 over its requests, top-1 agreement with
// keep-all (the replies' leading agreement, greedy decoding) and, for lossy cells, the KL
// divergence from keep-all's next-token distributions (over each reply's positions up to its
// first difference, from the top-20 log-probabilities both runs report); the pages each action
// took and how many came back, and the bring-back time the engine measured for them (what the
// policy's choices cost, beside the run's wall time). Keep-all runs twice:
// the reference, and a repeat whose agreement with it must be 1 (the engine is deterministic)
// and whose speed shows the run-to-run spread. A table per workload, with `auto`'s verdict
// against the best fixed policy of equal or better quality (the ratio of the medians, the range
// of the ratios within each round, and the ratio of CPU time per token) and a closing note where
// auto is not within 5% or not strictly best, saying why (VerdictNote), and JSON (--json) that
// scripts/plots.py draws as a Pareto panel per workload.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
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
#include "lattice_workloads.h"
#include "reply_agreement.h"

namespace kvl::cli {
namespace {

// One cell: a workload under one KV configuration.
struct Cell {
  std::string policy;          // "keep-all", "keep-all (repeat)", or a --kv-policy value
  double budget_fraction = 0;  // 0: keep-all (the engine's own pool)
  int64_t budget_bytes = 0;
  double wall_ms = 0;
  double cpu_ms = 0;           // the process's CPU time over the same spans
  int64_t generated = 0;
  double tok_s = 0;
  double cpu_tok_s = 0;        // tokens per second of the process's CPU time
  // Every run's tok/s and CPU tok/s, in round order (RunRounds; one entry for a single run).
  std::vector<double> run_tok_s, run_cpu_tok_s;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double agreement = 0;        // mean over requests of LeadingAgreement with keep-all's reply
  int64_t identical = 0;       // replies equal to keep-all's
  int64_t requests = 0;
  double kld = 0;              // mean over the positions compared
  int64_t kld_positions = 0;
  int64_t resident_peak = 0;
  int64_t preemptions = 0;
  ActionPages action_pages{};
  // Of those pages, the ones brought back (promoted, restored, recomputed at a resume); a page
  // let go at a preemption that the resume finds in its tier is never brought back.
  ActionPages restored_pages{};
  // What bringing them back took, measured by the engine (rebuilds inside decode steps
  // included): the time the policy's choices cost, beside the run's wall time.
  double bring_back_ms = 0;
  std::string error;           // why the cell stopped early
  // Kept for the comparisons, not written out.
  std::vector<std::vector<int32_t>> prompts;   // per request, in script order
  std::vector<DrivenReply> replies;
};

// Fixed policies that move pages to a tier get a RAM tier large enough for the whole workload;
// `auto` gets the same tier (and may compress: balanced quality), so that every action is open
// to it. The RAM tier is memory outside the budget: what the budget bounds is the pool.
bool UsesRamTier(const std::string& policy) {
  return policy == "auto" || policy == "demote" || policy == "recompute-residual";
}

EngineOptions CellOptions(const BenchLatticeArgs& args, const LatticeWorkload& w,
                          const std::string& policy, int64_t budget_bytes, int64_t tier_bytes) {
  EngineOptions o = args.engine;
  o.context_length = w.context;
  o.max_seqs = w.concurrency;
  o.prefix_cache = true;
  o.kv_budget_bytes = budget_bytes;  // 0 (keep-all): room for every sequence's whole context
  o.kv_tiers.clear();
  o.kv_quality = "";
  o.kv_policy = policy.starts_with("keep-all") ? "keep" : policy;
  if (policy == "auto") o.kv_quality = "balanced";
  if (UsesRamTier(policy)) o.kv_tiers = {fmt::format("ram:{}", tier_bytes)};
  return o;
}

// The process's CPU time (all its threads), in ms.
double ProcessCpuMs() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// KL(keep-all || cell) at one position, over keep-all's top tokens: a token missing from the
// cell's list is given the cell's smallest listed log-probability, the most it can have.
double TopLogprobKld(const std::vector<TokenLogprob>& ref, const std::vector<TokenLogprob>& run) {
  if (ref.empty() || run.empty()) return 0;
  double kld = 0;
  for (const TokenLogprob& r : ref) {
    float run_lp = run.back().logprob;
    for (const TokenLogprob& x : run) {
      if (x.token == r.token) {
        run_lp = x.logprob;
        break;
      }
    }
    kld += std::exp(static_cast<double>(r.logprob)) * (static_cast<double>(r.logprob) - run_lp);
  }
  return std::max(0.0, kld);
}

// The workload's script under one configuration, in a fresh engine. An engine that cannot be
// made, or a request that fails, ends the cell with `error` set.
Cell RunCell(const BenchLatticeArgs& args, const LatticeWorkload& w, const std::string& policy,
             double fraction, int64_t budget_bytes, int64_t tier_bytes) {
  using Clock = std::chrono::steady_clock;
  Cell cell;
  cell.policy = policy;
  cell.budget_fraction = fraction;
  cell.budget_bytes = budget_bytes;
  StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(CellOptions(args, w, policy, budget_bytes, tier_bytes));
  if (!engine.ok()) {
    cell.error = engine.status().ToString();
    return cell;
  }
  const std::vector<int32_t>& first = w.rounds[0][0].append;
  if (Status s = WarmUpEngine(**engine, first[1 % first.size()], first[2 % first.size()]); !s.ok()) {
    cell.error = s.ToString();
    return cell;
  }
  const EngineMetrics before = (*engine)->Metrics();
  std::map<int32_t, std::vector<int32_t>> history;  // per stream
  std::vector<double> ttfts;
  for (const std::vector<ScriptedRequest>& round : w.rounds) {
    std::vector<Request> requests;
    for (const ScriptedRequest& s : round) {
      std::vector<int32_t>& h = history[s.stream];
      h.insert(h.end(), s.append.begin(), s.append.end());
      Request r;
      r.prompt_ids = h;
      r.max_new_tokens = s.max_new_tokens;
      r.ignore_eos = true;
      r.sampling.temperature = 0;
      r.top_logprobs = kMaxTopLogprobs;
      cell.prompts.push_back(h);
      requests.push_back(std::move(r));
    }
    const Clock::time_point start = Clock::now();
    const double cpu_start = ProcessCpuMs();
    StatusOr<std::vector<DrivenReply>> replies = DriveRequests(**engine, std::move(requests));
    cell.wall_ms += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    cell.cpu_ms += ProcessCpuMs() - cpu_start;
    if (!replies.ok()) {
      cell.error = replies.status().ToString();
      break;
    }
    for (size_t i = 0; i < round.size(); ++i) {
      DrivenReply& reply = (*replies)[i];
      if (!reply.error.ok() && cell.error.empty()) cell.error = reply.error.ToString();
      // EOS is ignored: a shorter reply is a sequence the budget could not hold to its end
      // (the engine says so on stderr), and a cell that did less work is no comparison.
      if (cell.error.empty() && static_cast<int32_t>(reply.tokens.size()) < round[i].max_new_tokens) {
        cell.error = fmt::format("a request stopped at {} of {} tokens (finish reason {}): the "
                                 "budget could not hold it",
                                 reply.tokens.size(), round[i].max_new_tokens, reply.finish_reason);
      }
      ttfts.push_back(reply.ttft_ms);
      cell.generated += static_cast<int64_t>(reply.tokens.size());
      std::vector<int32_t>& h = history[round[i].stream];
      h.insert(h.end(), reply.tokens.begin(), reply.tokens.end());
      cell.replies.push_back(std::move(reply));
    }
    if (!cell.error.empty()) break;
  }
  const EngineMetrics after = (*engine)->Metrics();
  cell.requests = static_cast<int64_t>(cell.replies.size());
  cell.tok_s = cell.wall_ms > 0 ? 1000.0 * static_cast<double>(cell.generated) / cell.wall_ms : 0;
  cell.cpu_tok_s = cell.cpu_ms > 0 ? 1000.0 * static_cast<double>(cell.generated) / cell.cpu_ms : 0;
  cell.run_tok_s = {cell.tok_s};
  cell.run_cpu_tok_s = {cell.cpu_tok_s};
  cell.ttft_p50_ms = Percentile(ttfts, 0.50);
  cell.ttft_p99_ms = Percentile(ttfts, 0.99);
  cell.resident_peak = after.kv_resident_bytes_peak;
  cell.preemptions = after.preemptions - before.preemptions;
  cell.action_pages = ActionPagesBetween(before, after);
  for (size_t a = 0; a < cell.restored_pages.size(); ++a) {
    cell.restored_pages[a] = after.kv_actions[a].pages_restored - before.kv_actions[a].pages_restored;
    cell.bring_back_ms += after.kv_actions[a].measured_ms - before.kv_actions[a].measured_ms;
  }
  cell.bring_back_ms +=
      after.kv_rebuilt_in_step.measured_ms - before.kv_rebuilt_in_step.measured_ms;
  return cell;
}

// One cell's configuration, run once per round (RunRounds).
struct CellSpec {
  std::string policy;
  double fraction = 0;
  int64_t budget_bytes = 0;
  int64_t tier_bytes = 0;
};

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
// forward in even rounds and backward in odd ones. `first` holds runs already made in round 0
// (keep-all's, which sized the budgets), by cell index. A cell that fails runs no more.
std::vector<Cell> RunRounds(const BenchLatticeArgs& args, const LatticeWorkload& w,
                            const std::vector<CellSpec>& specs,
                            std::map<size_t, Cell> first) {
  std::vector<std::vector<Cell>> runs(specs.size());
  for (auto& [i, cell] : first) runs[i].push_back(std::move(cell));
  for (int32_t round = 0; round < args.runs; ++round) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const size_t i = round % 2 == 0 ? k : specs.size() - 1 - k;
      if (static_cast<int32_t>(runs[i].size()) > round) continue;  // made before the rounds
      if (!runs[i].empty() && !runs[i].back().error.empty()) continue;
      const CellSpec& c = specs[i];
      if (c.fraction > 0) {
        fmt::print(stderr, "kvl: {} at 1/{:.0f}: {} (run {} of {}) ...\n", w.name,
                   1 / c.fraction, c.policy, round + 1, args.runs);
      }
      runs[i].push_back(RunCell(args, w, c.policy, c.fraction, c.budget_bytes, c.tier_bytes));
    }
  }
  std::vector<Cell> cells;
  for (std::vector<Cell>& r : runs) cells.push_back(MedianOfRuns(std::move(r)));
  return cells;
}

// Quality against keep-all: per request, leading agreement; per position before the first
// difference where the prompts were the same (a chat whose earlier reply differed asks another
// question), the KL divergence of the next-token distributions.
void CompareWithReference(const Cell& reference, Cell* cell) {
  double agreement = 0, kld = 0;
  int64_t positions = 0;
  const size_t n = std::min(cell->replies.size(), reference.replies.size());
  for (size_t i = 0; i < n; ++i) {
    const DrivenReply& ref = reference.replies[i];
    const DrivenReply& run = cell->replies[i];
    agreement += LeadingAgreement(run.tokens, ref.tokens);
    cell->identical += run.tokens == ref.tokens ? 1 : 0;
    if (cell->prompts[i] != reference.prompts[i]) continue;
    const size_t common = std::min({ref.top_logprobs.size(), run.top_logprobs.size(),
                                    ref.tokens.size(), run.tokens.size()});
    for (size_t p = 0; p < common; ++p) {
      kld += TopLogprobKld(ref.top_logprobs[p], run.top_logprobs[p]);
      ++positions;
      if (run.tokens[p] != ref.tokens[p]) break;  // the histories part here
    }
  }
  // Requests that never ran (the cell stopped early) count as no agreement.
  cell->agreement = reference.replies.empty()
                        ? 0
                        : agreement / static_cast<double>(reference.replies.size());
  cell->kld = positions > 0 ? kld / static_cast<double>(positions) : 0;
  cell->kld_positions = positions;
}

// Whether two cells made the same page choices: the same pages per action, the same pages brought
// back, the same preemptions. Then their work differs by what the engine does around the
// choices (nothing the policy decides), and their tok/s by the machine's run-to-run spread.
bool SameChoices(const Cell& a, const Cell& b) {
  return a.action_pages == b.action_pages && a.restored_pages == b.restored_pages &&
         a.preemptions == b.preemptions;
}

// `auto` at one budget against the fixed policies of equal or better quality there (agreement
// at least auto's, KLD at most auto's): the best of them by tok/s, and whether auto is within 5%
// of it; and whether auto beats every fixed policy that completed, whatever its quality, with
// choices none of them made.
struct Verdict {
  double budget_fraction = 0;
  std::string best_policy;   // empty: no fixed policy of equal or better quality completed
  double best_tok_s = 0;
  double auto_tok_s = 0;
  double ratio = 0;          // auto / best, of the cells' median tok/s
  // auto / best within each round (the two runs nearest in time), over the rounds.
  double round_ratio_min = 0, round_ratio_median = 0, round_ratio_max = 0;
  double cpu_ratio = 0;      // auto / best, of the median tok/s per second of CPU time
  bool within_5pct = false;
  // Faster than every fixed policy that completed, and by other choices: where a fixed policy
  // made auto's choices page for page (SameChoices), auto being faster is the machine's spread,
  // not a win of the cost model.
  bool strictly_best = false;
  std::vector<std::string> same_choices_as;  // the fixed policies that did
  // Why auto is not within 5% of the best, or not strictly best (VerdictNote); empty where it
  // is both.
  std::string note;
};

Verdict JudgeAuto(const std::vector<Cell>& cells, double fraction) {
  Verdict v;
  v.budget_fraction = fraction;
  const Cell* automatic = nullptr;
  for (const Cell& c : cells) {
    if (c.policy == "auto" && c.budget_fraction == fraction) automatic = &c;
  }
  if (automatic == nullptr || !automatic->error.empty()) return v;
  v.auto_tok_s = automatic->tok_s;
  v.strictly_best = true;
  for (const Cell& c : cells) {
    if (c.budget_fraction != fraction || c.policy == "auto" || !c.error.empty()) continue;
    if (c.tok_s >= automatic->tok_s) v.strictly_best = false;
    if (SameChoices(c, *automatic)) {
      v.strictly_best = false;
      v.same_choices_as.push_back(c.policy);
    }
    const bool as_good = c.agreement >= automatic->agreement - 1e-9 && c.kld <= automatic->kld + 1e-12;
    if (as_good && c.tok_s > v.best_tok_s) {
      v.best_tok_s = c.tok_s;
      v.best_policy = c.policy;
    }
  }
  v.ratio = v.best_tok_s > 0 ? v.auto_tok_s / v.best_tok_s : 0;
  const Cell* best = nullptr;
  for (const Cell& c : cells) {
    if (c.budget_fraction == fraction && c.policy == v.best_policy) best = &c;
  }
  if (best != nullptr) {
    std::vector<double> ratios;
    const size_t rounds = std::min(automatic->run_tok_s.size(), best->run_tok_s.size());
    for (size_t r = 0; r < rounds; ++r) {
      if (best->run_tok_s[r] > 0) ratios.push_back(automatic->run_tok_s[r] / best->run_tok_s[r]);
    }
    if (!ratios.empty()) {
      std::sort(ratios.begin(), ratios.end());
      v.round_ratio_min = ratios.front();
      v.round_ratio_median = ratios[ratios.size() / 2];
      v.round_ratio_max = ratios.back();
    }
    v.cpu_ratio = best->cpu_tok_s > 0 ? automatic->cpu_tok_s / best->cpu_tok_s : 0;
  }
  v.within_5pct = v.best_policy.empty() || v.ratio >= 0.95;
  return v;
}

// "demote-ram 50 (2 back), recompute-tokens 77 (0 back)": each action's pages and how many of
// them were brought back.
std::string ActionsText(const Cell& c) {
  std::string out;
  for (size_t a = 0; a < c.action_pages.size(); ++a) {
    if (c.action_pages[a] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {} ({} back)", KvActionName(static_cast<KvAction>(a)),
                       c.action_pages[a], c.restored_pages[a]);
  }
  return out.empty() ? "-" : out;
}

// The closing note of one budget's verdict: where auto is more than 5% slower than the best fixed
// policy of its quality, and where it is not strictly best, why, from what the cells measured:
// the same choices (the gap is the spread keep-all shows against its own repeat), a faster policy
// that loses quality, or other choices with their measured bring-back times.
std::string VerdictNote(const Verdict& v, const std::vector<Cell>& cells, const Cell& reference,
                        const Cell& repeat) {
  const Cell* automatic = nullptr;
  for (const Cell& c : cells) {
    if (c.policy == "auto" && c.budget_fraction == v.budget_fraction && c.error.empty()) {
      automatic = &c;
    }
  }
  if (automatic == nullptr) return "auto did not complete";
  const double spread =
      reference.tok_s > 0 ? 100 * std::abs(repeat.tok_s / reference.tok_s - 1) : 0;
  const double auto_wall_share =
      automatic->wall_ms > 0 ? 100 * automatic->bring_back_ms / automatic->wall_ms : 0;
  // What sets `c` apart from auto, after "which".
  auto why = [&](const Cell& c) -> std::string {
    if (c.agreement < automatic->agreement - 1e-9 || c.kld > automatic->kld + 1e-12) {
      return fmt::format("loses quality (agreement {:.1f}%, KLD {:.2e})", 100 * c.agreement,
                         c.kld);
    }
    const std::string spread_text =
        fmt::format("the gap is run-to-run spread (keep-all's repeat ran {:.1f}% off keep-all)",
                    spread);
    if (SameChoices(c, *automatic)) {
      return fmt::format("made auto's choices page for page, bringing pages back in {:.1f} ms "
                         "against auto's {:.1f} ms ({:.1f}% of auto's run): {}",
                         c.bring_back_ms, automatic->bring_back_ms, auto_wall_share, spread_text);
    }
    const bool auto_cheaper = automatic->bring_back_ms <= c.bring_back_ms &&
                              automatic->preemptions <= c.preemptions;
    return fmt::format("chose {} with {} preemptions, bringing pages back in {:.1f} ms, against "
                       "auto's {} with {} preemptions and {:.1f} ms{}",
                       ActionsText(c), c.preemptions, c.bring_back_ms, ActionsText(*automatic),
                       automatic->preemptions, automatic->bring_back_ms,
                       auto_cheaper ? ": auto's choices cost less as measured, " + spread_text
                                    : std::string());
  };
  auto named = [](const Cell& c) { return fmt::format("{} ({:.1f} tok/s)", c.policy, c.tok_s); };
  std::vector<std::string> parts;
  if (!v.within_5pct) {
    for (const Cell& c : cells) {
      if (c.budget_fraction == v.budget_fraction && c.policy == v.best_policy) {
        parts.push_back(SameChoices(c, *automatic)
                            ? fmt::format("more than 5% slower than {}, which made auto's "
                                          "choices page for page (below)",
                                          named(c))
                            : fmt::format("more than 5% slower than {}, which {}", named(c), why(c)));
      }
    }
  }
  if (!v.strictly_best) {
    // The faster policies with other choices, each with why; those that made auto's choices
    // once, together: no difference in speed from them says anything of the choices.
    std::vector<std::string> faster;
    const Cell* twin = nullptr;
    for (const Cell& c : cells) {
      if (c.budget_fraction != v.budget_fraction || c.policy == "auto" || !c.error.empty()) continue;
      if (SameChoices(c, *automatic)) {
        if (twin == nullptr) twin = &c;
        continue;
      }
      if (c.tok_s >= automatic->tok_s) faster.push_back(fmt::format("{}, which {}", named(c), why(c)));
    }
    if (twin != nullptr) {
      faster.push_back(fmt::format("{} {}; auto faster or slower than {} is no win or loss of "
                                   "its choices",
                                   fmt::join(v.same_choices_as, " and "), why(*twin),
                                   v.same_choices_as.size() > 1 ? "them" : "it"));
    }
    parts.push_back(fmt::format("not strictly best: {}", fmt::join(faster, "; ")));
  }
  return fmt::format("{}", fmt::join(parts, ". "));
}

void PrintWorkloadTable(const LatticeWorkload& w, const Cell& reference, const Cell& repeat,
                        const std::vector<Cell>& cells, const std::vector<Verdict>& verdicts) {
  fmt::print("\n### {}: {}\n", w.name, w.description);
  fmt::print("{} requests, {} tokens generated per cell; keep-all's peak resident KV {}\n\n",
             w.requests, w.generated_tokens, FormatBytes(reference.resident_peak));
  fmt::print("| {:>6} | {:<18} | {:>8} | {:>13} | {:>9} | {:>7} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>7} | {:>9} | {:<34} |\n",
             "budget", "policy", "tok/s", "runs' range", "CPU tok/s", "vs ref", "TTFT p50",
             "TTFT p99", "agreement", "identical", "KLD", "preempt", "back ms", "pages per action");
  fmt::print("| {:->6} | {:-<18} | {:->8} | {:->13} | {:->9} | {:->7} | {:->9} | {:->9} | {:->9} | {:->9} | {:->9} | {:->7} | {:->9} | {:-<34} |\n",
             ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":");
  auto row = [&](const Cell& c) {
    const std::string budget =
        c.budget_fraction > 0 ? fmt::format("1/{:.0f}", 1 / c.budget_fraction) : "all";
    if (!c.error.empty()) {
      fmt::print("| {:>6} | {:<18} | failed: {} |\n", budget, c.policy, c.error);
      return;
    }
    const auto [lo, hi] = std::minmax_element(c.run_tok_s.begin(), c.run_tok_s.end());
    const std::string range =
        c.run_tok_s.size() > 1 ? fmt::format("{:.0f}-{:.0f}", *lo, *hi) : std::string("-");
    fmt::print("| {:>6} | {:<18} | {:>8.1f} | {:>13} | {:>9.1f} | {:>6.2f}x | {:>9.1f} | {:>9.1f} | {:>8.1f}% | {:>9} | {:>9.2e} | {:>7} | {:>9.1f} | {:<34} |\n",
               budget, c.policy, c.tok_s, range, c.cpu_tok_s,
               reference.tok_s > 0 ? c.tok_s / reference.tok_s : 0,
               c.ttft_p50_ms, c.ttft_p99_ms, 100 * c.agreement,
               fmt::format("{}/{}", c.identical, c.requests), c.kld, c.preemptions,
               c.bring_back_ms, ActionsText(c));
  };
  row(reference);
  row(repeat);
  for (const Cell& c : cells) row(c);
  fmt::print("\n| {:>6} | {:<40} | {:>10} | {:>16} | {:>9} | {:>10} |\n", "budget",
             "auto vs the best fixed policy of equal or better quality", "auto / best",
             "rounds' range", "CPU time", "best of all");
  fmt::print("| {:->6} | {:-<40} | {:->10} | {:->16} | {:->9} | {:->10} |\n", ":", ":", ":", ":",
             ":", ":");
  for (const Verdict& v : verdicts) {
    const std::string budget = fmt::format("1/{:.0f}", 1 / v.budget_fraction);
    if (v.auto_tok_s <= 0) {
      fmt::print("| {:>6} | {:<40} | {:>10} | {:>16} | {:>9} | {:>10} |\n", budget,
                 "auto did not complete", "-", "-", "-", "-");
      continue;
    }
    const std::string against =
        v.best_policy.empty()
            ? "no fixed policy reached auto's quality"
            : fmt::format("{} ({:.1f} tok/s){}", v.best_policy, v.best_tok_s,
                          v.within_5pct ? "" : ": auto more than 5% slower");
    const bool rounds = !v.best_policy.empty() && v.round_ratio_max > 0;
    fmt::print("| {:>6} | {:<40} | {:>10} | {:>16} | {:>9} | {:>10} |\n", budget, against,
               v.best_policy.empty() ? "-" : fmt::format("{:.2f}", v.ratio),
               rounds ? fmt::format("{:.2f} ({:.2f}-{:.2f})", v.round_ratio_median,
                                    v.round_ratio_min, v.round_ratio_max)
                      : std::string("-"),
               v.best_policy.empty() || v.cpu_ratio <= 0 ? "-" : fmt::format("{:.2f}", v.cpu_ratio),
               v.strictly_best ? "auto" : "-");
  }
  // The goal's closing note: why, where auto is not within 5% or not strictly best.
  fmt::print("\n");
  for (const Verdict& v : verdicts) {
    if (v.note.empty()) continue;
    fmt::print("- 1/{:.0f}: {}.\n", 1 / v.budget_fraction, v.note);
  }
  (void)FlushStdout();
}

nlohmann::json CellJson(const Cell& c) {
  const nlohmann::json actions = ActionPagesJson(c.action_pages);
  return {{"policy", c.policy},         {"budget_fraction", c.budget_fraction},
          {"budget_bytes", c.budget_bytes}, {"wall_ms", c.wall_ms},
          {"cpu_ms", c.cpu_ms},         {"cpu_tok_s", c.cpu_tok_s},
          {"run_tok_s", c.run_tok_s},   {"run_cpu_tok_s", c.run_cpu_tok_s},
          {"generated_tokens", c.generated}, {"tok_s", c.tok_s},
          {"ttft_p50_ms", c.ttft_p50_ms}, {"ttft_p99_ms", c.ttft_p99_ms},
          {"agreement", c.agreement},   {"identical", c.identical},
          {"requests", c.requests},     {"kld", c.kld},
          {"kld_positions", c.kld_positions}, {"resident_peak", c.resident_peak},
          {"preemptions", c.preemptions}, {"actions", actions},
          {"actions_restored", ActionPagesJson(c.restored_pages)},
          {"bring_back_ms", c.bring_back_ms}, {"error", c.error}};
}

nlohmann::json VerdictJson(const Verdict& v) {
  return {{"budget_fraction", v.budget_fraction}, {"best_policy", v.best_policy},
          {"best_tok_s", v.best_tok_s},           {"auto_tok_s", v.auto_tok_s},
          {"ratio", v.ratio},                     {"within_5pct", v.within_5pct},
          {"round_ratio_min", v.round_ratio_min}, {"round_ratio_median", v.round_ratio_median},
          {"round_ratio_max", v.round_ratio_max}, {"cpu_ratio", v.cpu_ratio},
          {"strictly_best", v.strictly_best}, {"same_choices_as", v.same_choices_as},
          {"note", v.note}};
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
  fmt::print("kvl bench lattice: model {} ({}, {} layers, kv_dim {}); budgets {} of keep-all's "
             "peak; policies {}\n",
             std::filesystem::path(args.engine.model_path).filename().string(), mc.name,
             mc.num_layers, mc.kv_dim(), fmt::join(args.budgets, ", "),
             fmt::join(args.policies, ", "));
  (void)FlushStdout();

  nlohmann::json out = {{"bench", "lattice"},
                        {"model", args.engine.model_path},
                        {"model_name", mc.name},
                        {"num_layers", mc.num_layers},
                        {"kv_dim", mc.kv_dim()},
                        {"threads", args.engine.num_threads},
                        {"runs", args.runs},
                        {"budgets", args.budgets},
                        {"policies", args.policies},
                        {"workloads", nlohmann::json::array()}};
  bool reference_failed = false;
  for (const std::string& name : args.workloads) {
    const LatticeWorkload w =
        MakeLatticeWorkload(name, args, *tokenizer, args.engine.block_tokens);
    // Keep-all's first run sizes the budgets (its peak is the same in every run): it is the
    // reference's run of round 0.
    Cell sizing = RunCell(args, w, "keep-all", 0, 0, 0);
    if (!sizing.error.empty()) {
      fmt::print(stderr, "kvl: workload {}: keep-all failed: {}\n", name, sizing.error);
      reference_failed = true;
      continue;
    }
    // The tier holds the whole workload's pages (or residuals) several times over.
    const int64_t tier_bytes = 8 * sizing.resident_peak + (64ll << 20);
    std::vector<CellSpec> specs = {{"keep-all", 0, 0, 0}, {"keep-all (repeat)", 0, 0, 0}};
    for (double fraction : args.budgets) {
      const int64_t budget = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(sizing.resident_peak) * fraction));
      for (const std::string& policy : args.policies) {
        specs.push_back({policy, fraction, budget, tier_bytes});
      }
    }
    std::map<size_t, Cell> first;
    first.emplace(0, std::move(sizing));
    std::vector<Cell> all = RunRounds(args, w, specs, std::move(first));
    Cell reference = std::move(all[0]);
    Cell repeat = std::move(all[1]);
    if (!reference.error.empty()) {
      fmt::print(stderr, "kvl: workload {}: keep-all failed: {}\n", name, reference.error);
      reference_failed = true;
      continue;
    }
    CompareWithReference(reference, &repeat);
    std::vector<Cell> cells(std::make_move_iterator(all.begin() + 2),
                            std::make_move_iterator(all.end()));
    std::vector<Verdict> verdicts;
    for (Cell& cell : cells) CompareWithReference(reference, &cell);
    for (double fraction : args.budgets) {
      verdicts.push_back(JudgeAuto(cells, fraction));
      verdicts.back().note = VerdictNote(verdicts.back(), cells, reference, repeat);
    }
    CompareWithReference(reference, &reference);
    PrintWorkloadTable(w, reference, repeat, cells, verdicts);
    nlohmann::json wj = {{"name", w.name},
                         {"description", w.description},
                         {"requests", w.requests},
                         {"generated_tokens", w.generated_tokens},
                         {"concurrency", w.concurrency},
                         {"context", w.context},
                         {"keep_all_peak_bytes", reference.resident_peak},
                         {"tier_bytes", tier_bytes},
                         {"reference", CellJson(reference)},
                         {"repeat", CellJson(repeat)},
                         {"cells", nlohmann::json::array()},
                         {"auto_verdicts", nlohmann::json::array()}};
    for (const Cell& c : cells) wj["cells"].push_back(CellJson(c));
    for (const Verdict& v : verdicts) wj["auto_verdicts"].push_back(VerdictJson(v));
    out["workloads"].push_back(std::move(wj));
  }
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
