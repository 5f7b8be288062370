// One cell of `kvl bench lattice`: a workload's script under one KV configuration, in a fresh
// engine, measured (tok/s, CPU time, TTFT, pages per action, the process's RSS less the weights
// against the budget) and compared with keep-all (top-1 agreement, KLD, identical replies).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_lattice.h"
#include "engine_drive.h"
#include "lattice_redis_link.h"
#include "lattice_workloads.h"

namespace kvl::cli {

// What every cell of one workload shares: the script and the lower tiers below the budget.
struct LatticeSetup {
  const BenchLatticeArgs* args = nullptr;
  const LatticeWorkload* workload = nullptr;
  // The disk tier every cell gets ("disk:PATH:SIZE[:direct]:scratch": started empty by each
  // cell's engine), and the Redis link (none where it was not started).
  std::string disk_tier;
  const RedisLink* redis = nullptr;
};

// One cell's configuration.
struct CellSpec {
  std::string policy;         // "keep-all", "keep-all (repeat)", or a --kv-policy value
  double fraction = 0;        // of the working set; 0: keep-all
  int64_t budget_bytes = 0;
  int index = 0;              // unique within the run (the cell's Redis key namespace)
  std::string skip_reason;    // set: the cell is not run (a Redis cell without the link)
};

struct Cell {
  std::string policy;
  // The quality the cell runs at: "lossless" for keep-all and the lossless policies, auto's
  // --auto-quality, "aggressive" for a fixed lossy policy (what the engine then allows).
  std::string quality;
  double budget_fraction = 0;  // 0: keep-all
  // --kv-budget as given; keep-all's is a budget that holds the whole working set.
  int64_t budget_bytes = 0;
  double wall_ms = 0;
  double cpu_ms = 0;           // the process's CPU time over the same spans
  int64_t generated = 0;
  double tok_s = 0;
  double cpu_tok_s = 0;        // tokens per second of the process's CPU time
  // Every run's tok/s and CPU tok/s, in round order (one entry for a single run).
  std::vector<double> run_tok_s, run_cpu_tok_s;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  // Against keep-all (CompareWithReference): top-1 agreement (the mean over requests of the
  // share of each greedy reply before its first difference), replies equal token for token,
  // mean KL divergence over the positions compared.
  double top1 = 0;
  int64_t identical = 0;
  int64_t requests = 0;
  bool replies_identical = false;  // every request ran and all of them are identical
  double kld_mean = 0;
  int64_t kld_positions = 0;
  int64_t resident_peak = 0;   // the engine's KV resident peak (its own account)
  // The process (kvl/process_memory.h): VmRSS less the weights at its most over the cell; the
  // fixed part of it (what the process holds beside the KV: measured after the engine was made
  // and warmed up, less the pool and the budget's buffers); and whether what is left is within
  // the budget: rss_minus_weights_peak - fixed <= budget + 5%.
  int64_t rss_minus_weights_peak = 0;
  int64_t fixed_bytes = 0;
  bool rss_bound_holds = false;
  int64_t preemptions = 0;
  ActionPages action_pages{};
  // Of those pages, the ones brought back (promoted, restored, recomputed at a resume).
  ActionPages restored_pages{};
  // What bringing them back took, measured by the engine (rebuilds inside decode steps included).
  double bring_back_ms = 0;
  std::string skipped;         // why the cell did not run (then `error` says so too)
  std::string error;           // why the cell stopped early
  // Kept for the comparisons, not written out.
  std::vector<std::vector<int32_t>> prompts;   // per request, in script order
  std::vector<DrivenReply> replies;
};

// The RSS bound's slack: 5% of the budget.
inline constexpr double kRssBoundSlack = 0.05;

// The workload's script under `spec`, in a fresh engine. An engine that cannot be made, or a
// request that fails, ends the cell with `error` set.
Cell RunCell(const LatticeSetup& setup, const CellSpec& spec);

// Quality against keep-all: per request, leading agreement and whether the reply is identical;
// per position up to the first difference where the prompts were the same (a chat whose earlier
// reply differed asks another question), the KL divergence of the next-token distributions.
void CompareWithReference(const Cell& reference, Cell* cell);

// KV bytes of one token of this model at the engine's cache types (-ctk / -ctv).
int64_t KvBytesPerToken(const ModelConfig& config, const EngineOptions& engine);

}  // namespace kvl::cli
