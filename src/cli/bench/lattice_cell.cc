#include "lattice_cell.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>

#include "kvl/dtype.h"
#include "kvl/kv_policy.h"
#include "kvl/process_memory.h"
#include "reply_agreement.h"

namespace kvl::cli {
namespace {

bool IsKeepAll(const std::string& policy) { return policy.starts_with("keep-all"); }

std::string CellQuality(const std::string& policy, const std::string& auto_quality) {
  if (IsKeepAll(policy)) return "lossless";
  if (policy == "auto") return auto_quality;
  const StatusOr<KvPolicyChoice> choice = ParseKvPolicy(policy);
  return choice.ok() && IsLossless(choice->fixed) ? "lossless" : "aggressive";
}

// The RAM tier a policy cannot run without, demote (to RAM) and recompute-residual (whose
// checkpoints live in it), and the one `auto` may choose: `ram:auto`, carved from the budget
// with the engine choosing the split between the pool and the tier (kvl/kv_budget.h), so that a
// page in the tier is memory the budget pays for, as a page in the pool is.
std::string RamTierFor(const std::string& policy) {
  if (policy != "demote" && policy != "recompute-residual" && policy != "auto") return "";
  return "ram:auto";
}

// Every cell but keep-all gets the same budget and the same lower tiers: the disk tier, and
// Redis where its link is up. Keep-all is the reference: its pool holds the whole working set.
EngineOptions CellOptions(const LatticeSetup& setup, const CellSpec& spec) {
  const BenchLatticeArgs& args = *setup.args;
  EngineOptions o = args.engine;
  o.context_length = setup.workload->context;
  o.max_seqs = setup.workload->concurrency;
  o.prefix_cache = true;
  o.kv_budget_bytes = spec.budget_bytes;
  o.kv_tiers.clear();
  o.kv_quality = "";
  if (IsKeepAll(spec.policy)) {
    o.kv_policy = "keep";
    return o;
  }
  o.kv_policy = spec.policy;
  if (spec.policy == "auto") o.kv_quality = args.auto_quality;
  if (const std::string ram = RamTierFor(spec.policy); !ram.empty()) {
    o.kv_tiers.push_back(ram);
  }
  o.kv_tiers.push_back(setup.disk_tier);
  if (setup.redis != nullptr && !setup.redis->tier_spec.empty()) {
    o.kv_tiers.push_back(CellRedisTierSpec(*setup.redis, spec.index));
  }
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

// ---- The process's memory -----------------------------------------------------------------

constexpr int64_t kRssSampleSteps = 8;

// The weights this process holds resident: the packed copies (anonymous) and what of the model
// file is resident (every mapping of it: the bench's own and the engine's).
int64_t ResidentWeightBytes(const Engine& engine) {
  return engine.packed_weight_bytes() +
         ReadMappedFileResidentBytes(engine.options().model_path).value_or(0);
}

// Hands the heap's free pages back (the engine before this one is gone: without this, a cell's
// RSS would carry the last one's garbage) and starts VmHWM afresh from VmRSS now, so that the
// cell's own peak is what VmHWM says at its end. False where clear_refs cannot be written.
bool StartRssPeakAfresh() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good();
}

// What the process holds beside the KV, weights aside (activations for the largest step,
// scratch, stacks, tokenizer, libraries), as the engine measured it at its start and after its
// first step (EngineMetrics::kv_fixed_bytes).
int64_t FixedBytes(const Engine& engine) { return engine.Metrics().kv_fixed_bytes; }

// VmRSS less the weights, now; nullopt where /proc cannot be read.
std::optional<int64_t> RssMinusWeights(const Engine& engine) {
  const std::optional<ProcessMemory> m = ReadProcessMemory();
  if (!m) return std::nullopt;
  return m->rss_bytes - ResidentWeightBytes(engine);
}

}  // namespace

int64_t KvBytesPerToken(const ModelConfig& config, const EngineOptions& engine) {
  const DType k = ParseDType(engine.cache_type_k).value_or(DType::kF32);
  const DType v = ParseDType(engine.cache_type_v).value_or(DType::kF32);
  return config.num_layers * (RowBytes(k, config.kv_dim()) + RowBytes(v, config.kv_dim()));
}

Cell RunCell(const LatticeSetup& setup, const CellSpec& spec) {
  using Clock = std::chrono::steady_clock;
  const BenchLatticeArgs& args = *setup.args;
  const LatticeWorkload& w = *setup.workload;
  Cell cell;
  cell.policy = spec.policy;
  cell.quality = CellQuality(spec.policy, args.auto_quality);
  cell.budget_fraction = spec.fraction;
  cell.budget_bytes = spec.budget_bytes;
  if (!spec.skip_reason.empty()) {
    cell.skipped = spec.skip_reason;
    cell.error = "skipped: " + spec.skip_reason;
    return cell;
  }
  const bool peak_afresh = StartRssPeakAfresh();
  StatusOr<std::unique_ptr<Engine>> made = Engine::Create(CellOptions(setup, spec));
  if (!made.ok()) {
    cell.error = made.status().ToString();
    return cell;
  }
  Engine& engine = **made;
  const std::vector<int32_t>& first = w.rounds[0][0].append;
  if (Status s = WarmUpEngine(engine, first[1 % first.size()], first[2 % first.size()]); !s.ok()) {
    cell.error = s.ToString();
    return cell;
  }
  const std::optional<int64_t> start_rss = RssMinusWeights(engine);
  cell.fixed_bytes = FixedBytes(engine);
  cell.rss_minus_weights_peak = start_rss.value_or(0);
  auto sample_rss = [&] {
    if (const std::optional<int64_t> now = RssMinusWeights(engine)) {
      cell.rss_minus_weights_peak = std::max(cell.rss_minus_weights_peak, *now);
    }
  };
  const EngineMetrics before = engine.Metrics();
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
    StatusOr<std::vector<DrivenReply>> replies =
        DriveRequests(engine, std::move(requests), [&](int64_t step) {
          if (step % kRssSampleSteps == 0) sample_rss();
        });
    cell.wall_ms += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    cell.cpu_ms += ProcessCpuMs() - cpu_start;
    sample_rss();
    if (!replies.ok()) {
      cell.error = replies.status().ToString();
      break;
    }
    for (size_t i = 0; i < round.size(); ++i) {
      DrivenReply& reply = (*replies)[i];
      if (!reply.error.ok() && cell.error.empty()) cell.error = reply.error.ToString();
      // EOS is ignored: a shorter reply is a sequence the budget could not hold to its end
      // (the engine says so on stderr), and a cell that did less work is no comparison.
      if (cell.error.empty() &&
          static_cast<int32_t>(reply.tokens.size()) < round[i].max_new_tokens) {
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
  // VmHWM, started afresh before the engine was made, catches a peak between two samples; the
  // weights are read at the end (they only grow as the model's pages are read).
  if (const std::optional<ProcessMemory> m = ReadProcessMemory(); m && peak_afresh) {
    cell.rss_minus_weights_peak =
        std::max(cell.rss_minus_weights_peak, m->rss_peak_bytes - ResidentWeightBytes(engine));
  }
  const EngineMetrics after = engine.Metrics();
  if (IsKeepAll(spec.policy)) {
    // Keep-all's budget is the one its engine took (room for the whole working set): the bound
    // is checked against that.
    cell.budget_bytes = after.kv_budget_bytes;
  }
  cell.rss_bound_holds =
      static_cast<double>(cell.rss_minus_weights_peak - cell.fixed_bytes) <=
      static_cast<double>(cell.budget_bytes) * (1 + kRssBoundSlack);
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
    cell.restored_pages[a] =
        after.kv_actions[a].pages_restored - before.kv_actions[a].pages_restored;
    cell.bring_back_ms += after.kv_actions[a].measured_ms - before.kv_actions[a].measured_ms;
  }
  cell.bring_back_ms +=
      after.kv_rebuilt_in_step.measured_ms - before.kv_rebuilt_in_step.measured_ms;
  return cell;
}

void CompareWithReference(const Cell& reference, Cell* cell) {
  double agreement = 0, kld = 0;
  int64_t positions = 0;
  cell->identical = 0;
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
  cell->top1 = reference.replies.empty()
                   ? 0
                   : agreement / static_cast<double>(reference.replies.size());
  cell->kld_mean = positions > 0 ? kld / static_cast<double>(positions) : 0;
  cell->kld_positions = positions;
  cell->replies_identical = cell->error.empty() && !reference.replies.empty() &&
                            cell->identical == static_cast<int64_t>(reference.replies.size());
}

}  // namespace kvl::cli
