// ObtainProfile: the engine's way to a cost profile (found, measured now, or assumed), saying on
// the messages stream whatever takes time or writes a file; the analytic defaults and the time
// estimate, both from the model's FLOPs at assumed rates; and the per-page prices of the policy.
#include "kvl/cost_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "calibration_internal.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"

namespace kvl {
namespace {

using calibration_internal::KvProjectionFlopsPerToken;
using calibration_internal::LayerFlopsPerToken;

// Rates assumed when nothing is measured: those of a modest machine (a few GFLOP/s per core from
// quantized kernels, a single memory channel, a SATA SSD), so the defaults overprice rather than
// promise; `kvl calibrate` replaces them with this machine's.
constexpr double kAssumedGflopsPerThread = 2.0;
constexpr double kAssumedMemoryGbps = 5.0;
constexpr double kAssumedDiskReadGbps = 0.5;
constexpr double kAssumedDiskWriteGbps = 0.25;
constexpr double kAssumedDiskLatencyUs = 200.0;

double AssumedFlopsPerSecond(const ops::OpsContext& ctx) {
  const int threads = ctx.pool() != nullptr ? ctx.pool()->num_threads() : 1;
  return kAssumedGflopsPerThread * threads * 1e9;
}

// FLOPs to recompute one kCalibrationPageTokens-token page, every layer: from residual
// checkpoints the K and V projections; from tokens every projection (attention over the page's
// few tokens is negligible next to them).
double ResidualRecomputeFlops(const ModelConfig& c) {
  return static_cast<double>(kCalibrationPageTokens * c.num_layers) * KvProjectionFlopsPerToken(c);
}
double TokenRecomputeFlops(const ModelConfig& c) {
  return static_cast<double>(kCalibrationPageTokens * c.num_layers) * LayerFlopsPerToken(c);
}

std::string ModelSummary(const CalibrationModel& m) {
  return fmt::format("'{}': dim {}, {} layers, {} heads / {} kv heads, ffn {}, {}", m.name, m.dim,
                     m.layers, m.heads, m.kv_heads, m.ffn_dim, m.weight_type);
}

// A profile is priced for the shapes it was measured at: another model's is unusable.
Status CheckProfileModel(const MachineProfile& profile, const Model& model,
                         const std::string& path) {
  const CalibrationModel expected = calibration_internal::DescribeModel(model);
  if (profile.model == expected) return Status::Ok();
  return InvalidArgumentError(fmt::format("profile '{}' is for model {}, not for model {}", path,
                                          ModelSummary(profile.model), ModelSummary(expected)));
}

// One line on the messages stream ("kvl: ..."), nothing when it is null.
template <typename... Args>
void Say(FILE* out, fmt::format_string<Args...> format, Args&&... args) {
  if (out == nullptr) return;
  fmt::print(out, "kvl: {}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(out);
}

}  // namespace

MachineProfile AnalyticProfile(const Model& model, const ops::OpsContext& ctx) {
  const ModelConfig& c = model.config();
  const double flops_per_second = AssumedFlopsPerSecond(ctx);
  MachineProfile p = calibration_internal::NewProfile(model, ctx, kProfileSourceDefault);
  for (int64_t n : calibration_internal::kMatmulTokenCounts) {
    p.matmul.push_back({n, flops_per_second / 1e9, flops_per_second / 1e9});
  }
  p.recompute_page_tokens = kCalibrationPageTokens;
  p.recompute_from_residual_ms = ResidualRecomputeFlops(c) / flops_per_second * 1e3;
  p.recompute_from_tokens_ms = TokenRecomputeFlops(c) / flops_per_second * 1e3;
  p.memory_read_gbps = kAssumedMemoryGbps;
  p.memory_copy_gbps = kAssumedMemoryGbps;
  p.disk_write_gbps = kAssumedDiskWriteGbps;
  p.disk_read_gbps = kAssumedDiskReadGbps;
  p.disk_random_read_median_us = kAssumedDiskLatencyUs;
  p.disk_random_read_p99_us = kAssumedDiskLatencyUs;
  return p;
}

int64_t EstimateCalibrationSeconds(const Model& model, const ops::OpsContext& ctx,
                                   const CalibrateOptions& options) {
  const CalibrateOptions o = calibration_internal::ResolveDefaults(options);
  const ModelConfig& c = model.config();
  const double flops_per_second = AssumedFlopsPerSecond(ctx);
  // A measurement is a warm-up call and `repetitions` samples of at least min_sample_seconds.
  auto measurement = [&](double flops) {
    return (o.repetitions + 1) * std::max(o.min_sample_seconds, flops / flops_per_second);
  };
  double seconds = 0;
  for (int64_t n : calibration_internal::kMatmulTokenCounts) {
    const double tokens = static_cast<double>(n);
    seconds += measurement(KvProjectionFlopsPerToken(c) * tokens) +
               measurement(LayerFlopsPerToken(c) * tokens);
  }
  seconds += measurement(ResidualRecomputeFlops(c)) + measurement(TokenRecomputeFlops(c));
  const double memory_pass = static_cast<double>(o.memory_bytes) / (kAssumedMemoryGbps * 1e9);
  seconds += 2 * memory_pass +  // filling both buffers
             2 * (o.repetitions + 1) * std::max(o.min_sample_seconds, memory_pass);
  const double disk_bytes = static_cast<double>(o.disk_bytes);
  seconds += o.disk_repetitions * (disk_bytes / (kAssumedDiskWriteGbps * 1e9) +
                                   disk_bytes / (kAssumedDiskReadGbps * 1e9)) +
             static_cast<double>(o.random_reads) * kAssumedDiskLatencyUs * 1e-6;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds)));
}

StatusOr<MachineProfile> ObtainProfile(const Model& model, ops::OpsContext& ctx,
                                       const ProfileOptions& options) {
  const bool users_path = !options.path.empty() && options.path_from_user;
  const std::string path =
      options.path.empty() ? DefaultProfilePath(model.config().name) : options.path;
  FILE* out = options.messages;

  StatusOr<MachineProfile> loaded = LoadProfile(path);
  if (loaded.ok()) {
    const Status usable = CheckProfileModel(*loaded, model, path);
    if (usable.ok()) {
      Say(out, "cost profile {} ({}, {})", path, loaded->source, loaded->timestamp);
      return loaded;
    }
    loaded = usable;
  }
  const Status& problem = loaded.status();
  const bool missing = problem.code() == StatusCode::kNotFound;
  if (!missing && users_path) {
    return Status(problem.code(),
                  fmt::format("{}; the file is left as it is: fix or remove it, or measure this "
                              "machine into it with `kvl calibrate -m MODEL -o {}`",
                              problem.message(), path));
  }
  const std::string why = missing ? fmt::format("no cost profile at {}", path)
                                  : fmt::format("unusable cost profile: {}", problem.message());

  if (!options.calibrate) {
    Say(out, "{}: using analytic defaults from the model's shape, not measured{} (run `kvl "
        "calibrate` to measure this machine)",
        why, missing ? "" : "; the file is left as it is");
    return AnalyticProfile(model, ctx);
  }

  // A user's path must take the result: find out before spending the time.
  if (users_path) KVL_RETURN_IF_ERROR(CheckProfileWritable(path));
  Say(out, "{}: measuring this machine{} ({}calibration, about {} s)...", why,
      missing ? "" : " to replace it", options.calibration.quick ? "quick " : "",
      EstimateCalibrationSeconds(model, ctx, options.calibration));
  auto stage_start = std::chrono::steady_clock::now();
  const CalibrationProgress progress = [&](std::string_view stage, double fraction) {
    const auto now = std::chrono::steady_clock::now();
    if (fraction == 0.0) stage_start = now;
    if (fraction < 1.0) return;
    Say(out, "  {:<10} done in {:.1f} s", stage,
        std::chrono::duration<double>(now - stage_start).count());
  };
  KVL_ASSIGN_OR_RETURN(MachineProfile profile,
                       Calibrate(model, ctx, options.calibration, progress));

  const Status saved = SaveProfile(profile, path);
  if (saved.ok()) {
    Say(out, "cost profile saved to {}", path);
  } else if (users_path) {
    return saved;
  } else {
    Say(out, "warning: {}; the measured profile is used for this run only", saved.ToString());
  }
  return profile;
}

void FillPagePrices(const MachineProfile& profile, int64_t block_tokens, PageCostProfile* prices) {
  // Recompute time grows linearly with the page's tokens (the projections dominate).
  const double scale =
      static_cast<double>(block_tokens) / static_cast<double>(profile.recompute_page_tokens);
  prices->recompute_residual_ms = profile.recompute_from_residual_ms * scale;
  prices->recompute_tokens_ms = profile.recompute_from_tokens_ms * scale;
  prices->ram_gbps = profile.memory_copy_gbps;
  prices->disk_read_gbps = profile.disk_read_gbps;
  prices->disk_write_gbps = profile.disk_write_gbps;
  prices->disk_latency_ms = profile.disk_random_read_median_us / 1000.0;
}

}  // namespace kvl
