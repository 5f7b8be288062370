// The report of `kvl bench frontier` (bench_frontier.h): the tables, the crossovers where the
// winner changes, measured and as the cost model says, and the JSON the plots are drawn from.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bench_frontier.h"

namespace kvl::cli::frontier {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ErrorPercent(double predicted, double measured) {
  return measured > 0 ? 100.0 * (predicted - measured) / measured : 0.0;
}

namespace {

// Where the winner changes between neighbouring points of one row of the sweep (page tokens at a
// fixed depth, or depth at a fixed page size), with the crossing interpolated where the two
// curves meet: in log(page tokens), or linearly in depth.
struct Crossover {
  std::string tier;
  Phase phase = Phase::kPrefill;
  std::string axis;    // "page_tokens" or "depth"
  int64_t fixed = 0;   // the other coordinate
  int from = 0, to = 0;
  int64_t lo = 0, hi = 0;
  double at = 0;
  bool predicted = false;
};

std::vector<Crossover> FindCrossovers(const std::vector<const Point*>& row, bool predicted,
                                      const std::string& axis, int64_t fixed) {
  std::vector<Crossover> out;
  const bool by_tokens = axis == "page_tokens";
  for (size_t i = 1; i < row.size(); ++i) {
    const Point& a = *row[i - 1];
    const Point& b = *row[i];
    const int wa = predicted ? a.predicted_winner : a.winner;
    const int wb = predicted ? b.predicted_winner : b.winner;
    if (wa == wb) continue;
    const double* va = predicted ? a.predicted : a.measured;
    const double* vb = predicted ? b.predicted : b.measured;
    // ln(time of the old winner / time of the new one): < 0 at a, > 0 at b.
    const double ra = std::log(va[wa] / va[wb]);
    const double rb = std::log(vb[wa] / vb[wb]);
    const double xa = by_tokens ? std::log(static_cast<double>(a.page_tokens))
                                : static_cast<double>(a.depth);
    const double xb = by_tokens ? std::log(static_cast<double>(b.page_tokens))
                                : static_cast<double>(b.depth);
    const double share = rb - ra > 0 ? std::clamp(-ra / (rb - ra), 0.0, 1.0) : 0.5;
    const double x = xa + (xb - xa) * share;
    Crossover c;
    c.tier = a.tier;
    c.phase = a.phase;
    c.axis = axis;
    c.fixed = fixed;
    c.from = wa;
    c.to = wb;
    c.lo = by_tokens ? a.page_tokens : a.depth;
    c.hi = by_tokens ? b.page_tokens : b.depth;
    c.at = by_tokens ? std::exp(x) : x;
    c.predicted = predicted;
    out.push_back(c);
  }
  return out;
}

// Rows of the sweep: the points of one tier and phase along one axis, the other fixed.
std::vector<Crossover> AllCrossovers(const std::vector<Point>& points, const Sweep& sweep,
                                     const std::vector<std::string>& tiers, bool predicted) {
  std::vector<Crossover> out;
  auto find = [&](const std::string& tier, Phase phase, int64_t t, int64_t d) -> const Point* {
    for (const Point& p : points) {
      if (p.tier == tier && p.phase == phase && p.page_tokens == t && p.depth == d) return &p;
    }
    return nullptr;
  };
  for (const std::string& tier : tiers) {
    for (Phase phase : kPhases) {
      for (int64_t d : sweep.depths) {
        std::vector<const Point*> row;
        for (int64_t t : sweep.page_tokens) row.push_back(find(tier, phase, t, d));
        for (const Crossover& c : FindCrossovers(row, predicted, "page_tokens", d)) out.push_back(c);
      }
      for (int64_t t : sweep.page_tokens) {
        std::vector<const Point*> row;
        for (int64_t d : sweep.depths) row.push_back(find(tier, phase, t, d));
        for (const Crossover& c : FindCrossovers(row, predicted, "depth", t)) out.push_back(c);
      }
    }
  }
  return out;
}

std::string ShortWay(int way) {
  static constexpr const char* kShort[kNumWays] = {"residual", "tokens", "transfer"};
  return kShort[way];
}

// Median and 90th percentile of |error| in percent over a set of points, for one way.
std::pair<double, double> AbsErrorStats(const std::vector<const Point*>& pts, int way) {
  std::vector<double> e;
  for (const Point* p : pts) e.push_back(std::abs(ErrorPercent(p->predicted[way], p->measured[way])));
  if (e.empty()) return {0, 0};
  std::sort(e.begin(), e.end());
  const size_t p90 = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(e.size()))) - 1;
  return {Median(e), e[std::min(p90, e.size() - 1)]};
}

}  // namespace

void PrintFrontierTables(const FrontierReport& r, const MachineProfile& profile) {
  const ModelConfig& c = *r.config;
  fmt::print("model     {}: dim {}, {} layers, {} heads / {} kv heads x {}, ffn {}, {}\n", c.name,
             c.dim, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.ffn_dim,
             r.weight_type);
  fmt::print("per token per layer: K+V f32 {} B, residual checkpoint {} B ({:.2f}x K+V)\n",
             c.KvBytesPerTokenPerLayer(DType::kF32), c.ResidualBytesPerTokenPerLayer(DType::kF32),
             static_cast<double>(c.ResidualBytesPerTokenPerLayer(DType::kF32)) /
                 static_cast<double>(c.KvBytesPerTokenPerLayer(DType::kF32)));
  fmt::print("threads   {}, pages after {} tokens of context, median of up to {} runs\n",
             r.threads, r.position, r.repetitions);
  fmt::print("decode    step {:.2f} ms vs {:.3f} ms per token in a 128-token run: idle fraction "
             "{:.2f} (reported only; the profile's curve gives {:.2f}). Decode recompute = the "
             "step's time with the page riding in it less without it, measured\n",
             r.decode_step_ms, r.prefill_token_ms, r.idle_fraction,
             profile.decode_idle.FractionAt(r.position));
  fmt::print("tiers     ");
  for (size_t i = 0; i < r.tier_names.size(); ++i) {
    fmt::print("{}{} = {}", i ? ", " : "", r.tier_labels[i], r.tier_names[i]);
  }
  fmt::print("\nmodel's profile: {} ({})\n", profile.source, profile.timestamp);
  if (r.others_cpu_share) {
    fmt::print("machine   other processes took {:.0f}% of the CPU while this measured{}\n",
               100 * *r.others_cpu_share,
               *r.others_cpu_share > kBusyOthersCpuShare
                   ? ": the times are a busy machine's, not what a quiet profile predicts"
                   : "");
  }
  fmt::print("rebuilt K/V bit-exact with the run's: {}\n\n", r.rebuilt_bit_exact ? "yes" : "NO");

  for (Phase phase : kPhases) {
    fmt::print("### {}\n\n", PhaseName(phase));
    fmt::print("| tier  | tokens | depth | residual ms | tokens ms | transfer ms | winner    | "
               "model: res |  model: tok | model: xfer | model says | err res % | tok % | xfer % |\n");
    fmt::print("|-------|-------:|------:|------------:|----------:|------------:|-----------|"
               "-----------:|------------:|------------:|------------|----------:|------:|-------:|\n");
    for (const Point& p : r.points) {
      if (p.phase != phase) continue;
      fmt::print("| {:<5} | {:>6} | {:>5} | {:>11.4g} | {:>9.4g} | {:>11.4g} | {:<9} | {:>10.4g} | "
                 "{:>11.4g} | {:>11.4g} | {:<10} | {:>9.0f} | {:>5.0f} | {:>6.0f} |\n",
                 p.tier, p.page_tokens, p.depth, p.measured[kResidual], p.measured[kTokens],
                 p.measured[kTransfer], ShortWay(p.winner), p.predicted[kResidual],
                 p.predicted[kTokens], p.predicted[kTransfer], ShortWay(p.predicted_winner),
                 ErrorPercent(p.predicted[kResidual], p.measured[kResidual]),
                 ErrorPercent(p.predicted[kTokens], p.measured[kTokens]),
                 ErrorPercent(p.predicted[kTransfer], p.measured[kTransfer]));
    }
    fmt::print("\n");
  }

  fmt::print("### prediction error, |predicted - measured| / measured\n\n");
  fmt::print("| phase   | tier  | residual median / p90 % | tokens median / p90 % | transfer median / p90 % | winner right |\n");
  fmt::print("|---------|-------|------------------------:|----------------------:|------------------------:|-------------:|\n");
  for (Phase phase : kPhases) {
    for (const std::string& tier : r.tier_labels) {
      std::vector<const Point*> pts;
      int right = 0;
      for (const Point& p : r.points) {
        if (p.phase != phase || p.tier != tier) continue;
        pts.push_back(&p);
        right += p.winner == p.predicted_winner;
      }
      std::string cells;
      for (int w = 0; w < kNumWays; ++w) {
        const auto [median, p90] = AbsErrorStats(pts, w);
        cells += fmt::format(" {:>23} |", fmt::format("{:.0f} / {:.0f}", median, p90));
      }
      fmt::print("| {:<7} | {:<5} |{} {:>12} |\n", PhaseName(phase), tier, cells,
                 fmt::format("{}/{}", right, pts.size()));
    }
  }
  fmt::print("\n### crossovers: where the winner changes\n\n");
  fmt::print("| tier  | phase   | along       | at           | measured                       | model says |\n");
  fmt::print("|-------|---------|-------------|--------------|--------------------------------|------------|\n");
  const std::vector<Crossover> measured = AllCrossovers(r.points, r.sweep, r.tier_labels, false);
  const std::vector<Crossover> predicted = AllCrossovers(r.points, r.sweep, r.tier_labels, true);
  auto describe = [](const Crossover& c) {
    return fmt::format("{} -> {} at ~{:.0f} ({}..{})", ShortWay(c.from), ShortWay(c.to), c.at,
                       c.lo, c.hi);
  };
  for (const std::string& tier : r.tier_labels) {
    for (Phase phase : kPhases) {
      for (const char* axis : {"page_tokens", "depth"}) {
        // Every line of the sweep on which either the measurement or the model has a crossover.
        const std::vector<int64_t>& fixed_values =
            std::string(axis) == "page_tokens" ? r.sweep.depths : r.sweep.page_tokens;
        for (int64_t fixed : fixed_values) {
          std::string m, p;
          for (const Crossover& c : measured) {
            if (c.tier == tier && c.phase == phase && c.axis == axis && c.fixed == fixed)
              m += (m.empty() ? "" : "; ") + describe(c);
          }
          for (const Crossover& c : predicted) {
            if (c.tier == tier && c.phase == phase && c.axis == axis && c.fixed == fixed)
              p += (p.empty() ? "" : "; ") + describe(c);
          }
          if (m.empty() && p.empty()) continue;
          const std::string at = std::string(axis) == "page_tokens"
                                     ? fmt::format("depth {}", fixed)
                                     : fmt::format("{} tokens", fixed);
          fmt::print("| {:<5} | {:<7} | {:<11} | {:<12} | {:<30} | {} |\n", tier,
                     PhaseName(phase), axis, at, m.empty() ? "none" : m, p.empty() ? "none" : p);
        }
      }
    }
  }
  fmt::print("\n");
}

nlohmann::json FrontierJson(const FrontierReport& r, const MachineProfile& profile) {
  const ModelConfig& c = *r.config;
  nlohmann::json j;
  j["bench"] = "frontier";
  j["model"] = r.model_path;
  j["model_name"] = c.name;
  j["weight_type"] = r.weight_type;
  j["shape"] = {{"dim", c.dim},         {"layers", c.num_layers},   {"heads", c.num_heads},
                {"kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim}, {"ffn_dim", c.ffn_dim}};
  j["kv_bytes_per_token_layer"] = c.KvBytesPerTokenPerLayer(DType::kF32);
  j["residual_bytes_per_token_layer"] = c.ResidualBytesPerTokenPerLayer(DType::kF32);
  j["threads"] = r.threads;
  j["position"] = r.position;
  j["repetitions"] = r.repetitions;
  j["page_tokens"] = r.sweep.page_tokens;
  j["depths"] = r.sweep.depths;
  j["decode"] = {{"step_ms", r.decode_step_ms},
                 {"prefill_ms_per_token", r.prefill_token_ms},
                 {"idle_fraction", r.idle_fraction},
                 {"model_idle_fraction", profile.decode_idle.FractionAt(r.position)},
                 {"how", "decode recompute = the 1-token step's time with the page riding in "
                         "it less its time without (residual: the checkpoint read plus the page's "
                         "rows in the step's K and V matmuls; tokens: the page's tokens in the "
                         "step's batch, times the share of the run before the depth); idle = 1 - "
                         "(ms per token of a 128-token run) / (ms of a 1-token run), reported "
                         "only; transfers cost the same in both phases"}};
  j["profile"] = {{"source", profile.source}, {"timestamp", profile.timestamp}};
  // The Redis server's read curve, measured at the start (MeasureTierCurves), where one was.
  if (r.redis_read != nullptr) {
    const TransferCurve& redis = *r.redis_read;
    j["redis_read_curve"] = {{"call_ms", redis.call_ms},       {"page_ms", redis.page_ms},
                             {"gbps", redis.gbps},             {"knee_bytes", redis.knee_bytes},
                             {"large_gbps", redis.large_gbps}, {"points", redis.points.size()}};
  }
  j["rebuilt_bit_exact"] = r.rebuilt_bit_exact;
  j["others_cpu_share"] = r.others_cpu_share ? nlohmann::json(*r.others_cpu_share) : nlohmann::json();
  nlohmann::json tiers = nlohmann::json::array();
  for (size_t i = 0; i < r.tier_labels.size(); ++i) {
    tiers.push_back({{"tier", r.tier_labels[i]},
                     {"name", i < r.tier_names.size() ? r.tier_names[i] : ""}});
  }
  j["tiers"] = tiers;
  nlohmann::json points = nlohmann::json::array();
  for (const Point& p : r.points) {
    nlohmann::json measured, predicted, error;
    for (int w = 0; w < kNumWays; ++w) {
      measured[kWayNames[w]] = p.measured[w];
      predicted[kWayNames[w]] = p.predicted[w];
      error[kWayNames[w]] = ErrorPercent(p.predicted[w], p.measured[w]);
    }
    points.push_back({{"tier", p.tier},
                      {"phase", PhaseName(p.phase)},
                      {"page_tokens", p.page_tokens},
                      {"depth", p.depth},
                      {"measured_ms", measured},
                      {"residual_read_ms", p.residual_read_ms},
                      {"rebuild_ms", p.rebuild_ms},
                      {"winner", kWayNames[p.winner]},
                      {"predicted_ms", predicted},
                      {"predicted_winner", kWayNames[p.predicted_winner]},
                      {"error_percent", error}});
  }
  j["points"] = points;
  nlohmann::json crossovers = nlohmann::json::array();
  for (bool predicted_side : {false, true}) {
    for (const Crossover& c : AllCrossovers(r.points, r.sweep, r.tier_labels, predicted_side)) {
      crossovers.push_back({{"source", predicted_side ? "model" : "measured"},
                            {"tier", c.tier},
                            {"phase", PhaseName(c.phase)},
                            {"axis", c.axis},
                            {"fixed", c.fixed},
                            {"from", kWayNames[c.from]},
                            {"to", kWayNames[c.to]},
                            {"between", {c.lo, c.hi}},
                            {"at", c.at}});
    }
  }
  j["crossovers"] = crossovers;
  return j;
}


}  // namespace kvl::cli::frontier
