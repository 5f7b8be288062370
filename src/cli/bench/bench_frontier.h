// What `kvl bench frontier` measured (cmd_bench_frontier.cc) and how it is reported: the tables,
// the crossovers and the JSON (bench_frontier_report.cc).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvl/calibration.h"
#include "kvl/kv_policy.h"
#include "kvl/model.h"

namespace kvl::cli::frontier {

// The three ways back, in the order of every table and JSON object.
enum Way { kResidual = 0, kTokens, kTransfer, kNumWays };
inline constexpr const char* kWayNames[kNumWays] = {"recompute-residual", "recompute-tokens",
                                                    "transfer"};
inline constexpr Phase kPhases[] = {Phase::kPrefill, Phase::kDecode};
inline const char* PhaseName(Phase p) { return p == Phase::kPrefill ? "prefill" : "decode"; }

// One point of the sweep: a page of page_tokens tokens missing its first `depth` layers, brought
// back from `tier` in `phase`.
struct Point {
  std::string tier;
  Phase phase = Phase::kPrefill;
  int64_t page_tokens = 0;
  int64_t depth = 0;
  double measured[kNumWays] = {};
  double predicted[kNumWays] = {};
  double residual_read_ms = 0;  // of measured[kResidual] (prefill), the checkpoints' read
  double rebuild_ms = 0;        // and the rebuild
  int winner = 0;
  int predicted_winner = 0;
};

struct Sweep {
  std::vector<int64_t> page_tokens;  // ascending
  std::vector<int64_t> depths;       // ascending
};

// Everything the report shows.
struct FrontierReport {
  std::string model_path;
  const ModelConfig* config = nullptr;
  std::string weight_type;
  int threads = 0;
  int64_t position = 0;
  int repetitions = 0;
  Sweep sweep;
  std::vector<std::string> tier_labels;  // "ram", "disk", "redis", as --tiers named them
  std::vector<std::string> tier_names;   // what each tier called itself
  double decode_step_ms = 0;
  double prefill_token_ms = 0;
  double idle_fraction = 0;
  bool rebuilt_bit_exact = true;
  // The share of the machine's CPU other processes took while the points were measured
  // (OthersCpuShare); nullopt where /proc could not be read. Predictions from a quiet profile
  // are compared with a quiet machine's times only where this stays under kBusyOthersCpuShare.
  std::optional<double> others_cpu_share;
  const TransferCurve* redis_read = nullptr;  // the Redis server's read curve, where one was swept
  std::vector<Point> points;
};

double Median(std::vector<double> v);
// (predicted - measured) / measured in percent; 0 where nothing was measured.
double ErrorPercent(double predicted, double measured);

// The Markdown tables: every point per phase, the prediction error per phase and tier, and the
// crossovers measured and predicted.
void PrintFrontierTables(const FrontierReport& report, const MachineProfile& profile);
nlohmann::json FrontierJson(const FrontierReport& report, const MachineProfile& profile);

}  // namespace kvl::cli::frontier
