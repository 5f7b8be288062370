// ObtainProfile: the engine's way to a cost profile (found, measured now, or assumed), saying on
// the messages stream whatever takes time or writes a file; the analytic defaults and the time
// estimate, both from the model's FLOPs at assumed rates; and the per-page prices of the policy.
#include "kvl/cost_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "calibration_internal.h"
#include "kvl/machine_load.h"
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

// A forward run over a batch of tokens reads the weights once for all of them: assumed this many
// times the rate above (a conservative tenth of what AVX-512 VNNI cores reach at 128 tokens).
constexpr double kAssumedBatchSpeedup = 10;

double AssumedFlopsPerSecond(const ops::OpsContext& ctx) {
  return kAssumedGflopsPerThread * calibration_internal::ContextThreads(ctx) * 1e9;
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

// An assumed transfer: bandwidth only, latency per page.
TransferCurve AssumedTransfer(double gbps, double page_latency_ms) {
  TransferCurve t;
  t.page_ms = page_latency_ms;
  t.gbps = gbps;
  return t;
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

// And for the kernels and threads it was measured with: a profile of one thread prices every
// matmul and recompute about twice what two threads take. "" where they match.
std::string ProfileMachineMismatch(const MachineProfile& profile, const ops::OpsContext& ctx) {
  const int threads = calibration_internal::ContextThreads(ctx);
  const std::string_view isa = ops::IsaName(ctx.isa());
  if (profile.threads == threads && profile.isa == isa) return "";
  return fmt::format("it was measured with {} kernels on {} thread(s), this run uses {} on {}",
                     profile.isa, profile.threads, isa, threads);
}

// One line on the messages stream ("kvl: ..."), nothing when it is null.
template <typename... Args>
void Say(FILE* out, fmt::format_string<Args...> format, Args&&... args) {
  if (out == nullptr) return;
  fmt::print(out, "kvl: {}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(out);
}

// What a measured profile prices with that is not a measurement, for the line that names the
// profile: "" when everything was measured.
std::string DefaultsNote(const MachineProfile& p) {
  if (p.source != kProfileSourceMeasured || p.kld_tokens > 0) return "";
  return fmt::format("; the page KLDs are named defaults (int8 {:.0e}, int4 {:.0e}), not "
                     "measured: `kvl calibrate --explain` says how each input was obtained",
                     p.int8_kld, p.int4_kld);
}

// With ProfileOptions::explain, every input and where it came from.
void SayExplanation(FILE* out, const MachineProfile& p, bool explain) {
  if (out == nullptr || !explain) return;
  fmt::print(out, "{}", ExplainProfile(p));
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
  // Compute-bound per token and layer; attention over the context at the same rate, 4 FLOPs per
  // query channel and position (q.k and p.v).
  const double layers = static_cast<double>(c.num_layers);
  p.recompute_from_residual.token_layer_ms =
      ResidualRecomputeFlops(c) / flops_per_second * 1e3 / (kCalibrationPageTokens * layers);
  p.recompute_from_tokens.token_layer_ms =
      TokenRecomputeFlops(c) / flops_per_second * 1e3 / (kCalibrationPageTokens * layers);
  p.recompute_from_tokens.context_token_layer_ms =
      4.0 * static_cast<double>(c.q_dim()) / flops_per_second * 1e3;
  // No warm reads: a default prices every read cold.
  p.ram = {AssumedTransfer(kAssumedMemoryGbps, 0), AssumedTransfer(kAssumedMemoryGbps, 0), {}};
  p.ram_zstd = p.ram;
  p.disk_buffered = {AssumedTransfer(kAssumedDiskWriteGbps, kAssumedDiskLatencyUs / 1e3),
                     AssumedTransfer(kAssumedDiskReadGbps, kAssumedDiskLatencyUs / 1e3), {}};
  p.disk_direct = p.disk_buffered;
  // Encoding reads the f32 page once and writes a quarter of it: about a memory pass.
  p.compress_int8 = AssumedTransfer(kAssumedMemoryGbps, 0);
  p.compress_int4 = AssumedTransfer(kAssumedMemoryGbps, 0);
  // Decode's idle share is not assumed: nothing is hidden (decode_idle stays without points).
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
  // The recompute curves take their budget each (fewer points when the model is small).
  seconds += 2 * o.curve_seconds;
  // The decode idle fraction's runs (a step and a 128-token batch at each of
  // DecodeIdleContexts) are left out, as they were when there was one context: at the assumed
  // rate a 1B model's batch alone would count two minutes where it takes a second.
  // Tiers: 4 kinds x their points x 3 timings (a write, a cold and a warm read), each a warm-up
  // and SamplesFor samples of at least min_sample_seconds, and the bytes at the assumed rates:
  // the large points' calls, and every point's working set written once before the reads.
  const calibration_internal::TierPlan tiers = calibration_internal::PlanTiers(o, model);
  double tier_samples = 0, tier_bytes = 0;
  for (const auto& [count, size] : tiers.points) {
    const int64_t call_bytes = count * size;
    const int samples = calibration_internal::SamplesFor(o, call_bytes);
    tier_samples += 3 * (samples + 1);
    tier_bytes += static_cast<double>(3 * (samples + 1) * call_bytes +
                                      std::max(calibration_internal::WorkingSetBytes(o), call_bytes));
  }
  seconds += 4 * tier_samples * o.min_sample_seconds;
  seconds += tier_bytes * (2 / (kAssumedMemoryGbps * 1e9) +
                           2 * (1 / (kAssumedDiskWriteGbps * 1e9) + 1 / (kAssumedDiskReadGbps * 1e9)));
  // Quality: the text three times (f32, int8, int4), each one forward run over all of it: a
  // batch, whose arithmetic runs at many times the one-token rate above (that rate counted a
  // 1B model's 128 tokens as three minutes where they take seconds).
  const double quality_tokens = static_cast<double>(
      std::min<int64_t>(static_cast<int64_t>(o.quality_tokens.size()),
                        o.quick ? 8 * kCalibrationPageTokens : INT64_MAX));
  seconds += 3 * quality_tokens * static_cast<double>(c.num_layers) * LayerFlopsPerToken(c) /
             (kAssumedBatchSpeedup * flops_per_second);
  const double memory_pass = static_cast<double>(o.memory_bytes) / (kAssumedMemoryGbps * 1e9);
  seconds += 2 * memory_pass +  // filling both buffers
             2 * (o.repetitions + 1) * std::max(o.min_sample_seconds, memory_pass);
  const double disk_bytes = static_cast<double>(o.disk_bytes);
  seconds += o.disk_repetitions * (disk_bytes / (kAssumedDiskWriteGbps * 1e9) +
                                   disk_bytes / (kAssumedDiskReadGbps * 1e9)) +
             static_cast<double>(o.random_reads) * kAssumedDiskLatencyUs * 1e-6;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds)));
}

std::string ProfilePath(const Model& model, const ops::OpsContext& ctx,
                        const ProfileOptions& options) {
  return options.path.empty() ? DefaultProfilePath(ProfileKey(model, ctx)) : options.path;
}

StatusOr<MachineProfile> ObtainProfile(const Model& model, ops::OpsContext& ctx,
                                       const ProfileOptions& options) {
  const bool users_path = !options.path.empty() && options.path_from_user;
  const std::string path = ProfilePath(model, ctx, options);
  FILE* out = options.messages;
  // Whether the machine is quiet now, for a profile measured while it was not.
  auto quiet_now = [&]() {
    const std::optional<double> share = options.current_others_cpu_share
                                            ? options.current_others_cpu_share()
                                            : MeasureOthersCpuShare(0.25);
    return share.has_value() && *share <= kBusyOthersCpuShare;
  };

  StatusOr<MachineProfile> loaded = LoadProfile(path);
  bool remeasure_busy = false;
  bool remeasure_drift = false;
  if (loaded.ok()) {
    Status usable = CheckProfileModel(*loaded, model, path);
    const std::string other_machine = ProfileMachineMismatch(*loaded, ctx);
    if (usable.ok() && !other_machine.empty()) {
      // The user's file is used as given (the measured corrections take the difference out as
      // pages come back); one at a default path is measured anew for this run's threads.
      if (users_path) {
        Say(out, "cost profile {}: {}; its prices are used as they are", path, other_machine);
      } else {
        usable = InvalidArgumentError(fmt::format("profile '{}': {}", path, other_machine));
      }
    }
    // A run found one of its measured corrections drifted past the bound
    // (kvl/profile_corrections.h) and asked for a new measurement at this start. A profile
    // measured on a busy machine prices everything slow; once the machine is quiet it is measured
    // again. A user's file is left as given in both cases, with a word.
    remeasure_drift = usable.ok() && !loaded->remeasure_reason.empty() && !users_path &&
                      options.calibrate;
    remeasure_busy = usable.ok() && !remeasure_drift && MeasuredUnderLoad(*loaded) &&
                     !users_path && options.calibrate && quiet_now();
    if (usable.ok() && !remeasure_busy && !remeasure_drift) {
      Say(out, "cost profile {} ({}, {}){}", path, loaded->source, loaded->timestamp,
          DefaultsNote(*loaded));
      if (MeasuredUnderLoad(*loaded)) {
        Say(out, "note: this profile was measured on a busy machine ({}): its prices are slow "
            "for a quiet one; `kvl calibrate -m MODEL{}` measures it again",
            LoadDescription(*loaded), users_path ? " -o " + path : std::string());
      }
      if (!loaded->remeasure_reason.empty()) {
        Say(out, "note: a run found this profile off ({}); `kvl calibrate -m MODEL{}` measures "
            "it again",
            loaded->remeasure_reason, users_path ? " -o " + path : std::string());
      }
      SayExplanation(out, *loaded, options.explain);
      return loaded;
    }
    if (!remeasure_busy && !remeasure_drift) loaded = usable;
  }
  const bool remeasure = remeasure_busy || remeasure_drift;
  const Status& problem = loaded.status();
  const bool missing = !remeasure && problem.code() == StatusCode::kNotFound;
  if (!remeasure && !missing && users_path) {
    return Status(problem.code(),
                  fmt::format("{}; the file is left as it is: fix or remove it, or measure this "
                              "machine into it with `kvl calibrate -m MODEL -o {}`",
                              problem.message(), path));
  }
  const std::string why =
      remeasure_drift ? fmt::format("cost profile {}: a run found it off ({})", path,
                                    loaded->remeasure_reason)
      : remeasure_busy
          ? fmt::format("cost profile {} was measured on a busy machine ({}) and the machine is "
                        "quiet now",
                        path, LoadDescription(*loaded))
      : missing ? fmt::format("no cost profile at {}", path)
                : fmt::format("unusable cost profile: {}", problem.message());

  if (!options.calibrate) {
    Say(out, "{}: using analytic defaults from the model's shape, not measured{} (run `kvl "
        "calibrate` to measure this machine)",
        why, missing ? "" : "; the file is left as it is");
    MachineProfile defaults = AnalyticProfile(model, ctx);
    SayExplanation(out, defaults, options.explain);
    return defaults;
  }

  // A user's path must take the result: find out before spending the time.
  if (users_path) KVL_RETURN_IF_ERROR(CheckProfileWritable(path));
  auto measure = [&](const std::string& reason,
                     std::string_view action) -> StatusOr<MachineProfile> {
    Say(out, "{}: measuring this machine{} ({}calibration, about {} s)...", reason, action,
        options.calibration.quick ? "quick " : "",
        EstimateCalibrationSeconds(model, ctx, options.calibration));
    auto stage_start = std::chrono::steady_clock::now();
    const CalibrationProgress progress = [&](std::string_view stage, double fraction) {
      const auto now = std::chrono::steady_clock::now();
      if (fraction == 0.0) stage_start = now;
      if (fraction < 1.0) return;
      Say(out, "  {:<10} done in {:.1f} s", stage,
          std::chrono::duration<double>(now - stage_start).count());
    };
    return Calibrate(model, ctx, options.calibration, progress);
  };
  KVL_ASSIGN_OR_RETURN(MachineProfile profile,
                       measure(why, missing ? "" : remeasure ? " again" : " to replace it"));
  // Busy while measuring but quiet now: the load was passing, so once more.
  if (MeasuredUnderLoad(profile) && quiet_now()) {
    KVL_ASSIGN_OR_RETURN(
        profile, measure(fmt::format("the machine was busy while measuring ({}) and is quiet now",
                                     LoadDescription(profile)),
                         " again"));
  }
  if (remeasure_drift) {
    profile.measured_because = loaded->remeasure_reason;
  } else if (remeasure_busy) {
    profile.measured_because = fmt::format("busy: the last measurement was on a busy machine ({})",
                                           LoadDescription(*loaded));
  }
  if (MeasuredUnderLoad(profile)) {
    Say(out, "note: measured on a busy machine ({}): the prices are slow for a quiet one; the "
        "profile is measured again when a run finds the machine quiet",
        LoadDescription(profile));
  }

  const Status saved = SaveProfile(profile, path);
  if (saved.ok()) {
    Say(out, "cost profile saved to {}{}", path, DefaultsNote(profile));
  } else if (users_path) {
    return saved;
  } else {
    Say(out, "warning: {}; the measured profile is used for this run only", saved.ToString());
  }
  SayExplanation(out, profile, options.explain);
  return profile;
}

void FillPagePrices(const MachineProfile& profile, const PagePriceOptions& options,
                    PageCostProfile* prices) {
  const int64_t tokens = options.block_tokens;
  const int64_t layers = options.layers > 0 ? options.layers : profile.model.layers;
  // A page goes to a tier as one tier page per layer in one call: the per-page latency of a
  // transfer is the curve's fixed part for `layers` tier pages; the bytes go at the bandwidth the
  // curve averages over the page's bytes (past its knee, partly at its DRAM rate). A curve whose
  // bytes were too cheap to measure moves them at the memory's copy rate.
  const int64_t page_bytes =
      options.page_bytes > 0 ? options.page_bytes
                             : tokens * layers * profile.model.kv_bytes_per_token_per_layer_f32;
  auto latency_ms = [&](const TransferCurve& t) {
    return t.call_ms + t.page_ms * static_cast<double>(layers);
  };
  auto gbps = [&](const TransferCurve& t) {
    const double g = t.EffectiveGbps(page_bytes);
    return g > 0 ? g : profile.memory_copy_gbps;
  };
  const TierCurves& disk = options.disk_direct ? profile.disk_direct : profile.disk_buffered;
  const TierCurves& ram = options.ram_compressed ? profile.ram_zstd : profile.ram;
  const TransferCurve& ram_read = ram.ReadFor(options.working_set_bytes, profile.cache_bytes);
  const TransferCurve& disk_read = disk.ReadFor(options.working_set_bytes, profile.cache_bytes);
  prices->ram_gbps = gbps(ram_read);
  prices->ram_latency_ms = latency_ms(ram_read);
  prices->ram_write_gbps = gbps(ram.write);
  prices->ram_write_latency_ms = latency_ms(ram.write);
  prices->disk_read_gbps = gbps(disk_read);
  prices->disk_latency_ms = latency_ms(disk_read);
  prices->disk_write_gbps = gbps(disk.write);
  prices->disk_write_latency_ms = latency_ms(disk.write);

  const RecomputeCurve& residual = profile.recompute_from_residual;
  prices->recompute_residual_ms = residual.Ms(tokens, layers, 0);
  // From tokens: the page's own tokens; attention over each position before it; and the forward
  // call's fixed part, which the tokens of its batch share (RecomputeTokensMs).
  const RecomputeCurve& from_tokens = profile.recompute_from_tokens;
  const double tl = static_cast<double>(tokens) * static_cast<double>(layers);
  prices->recompute_tokens_ms = from_tokens.token_layer_ms * tl +
                                from_tokens.context_token_layer_ms * tl * AttendedPositions(tokens, 0);
  prices->recompute_tokens_context_ms = from_tokens.context_token_layer_ms * tl;
  prices->recompute_tokens_call_ms =
      from_tokens.call_ms + from_tokens.layer_ms * static_cast<double>(layers);
  prices->block_tokens = tokens;
  prices->recompute_batch_tokens = options.recompute_batch_tokens;

  const int64_t layer_f32_bytes = tokens * profile.model.kv_bytes_per_token_per_layer_f32;
  prices->compress_ms = profile.compress_int8.Ms(layers, layer_f32_bytes);
  prices->compress_int4_ms = profile.compress_int4.Ms(layers, layer_f32_bytes);
  prices->int8_kld = profile.int8_kld;
  prices->int4_kld = profile.int4_kld;
  prices->decode_idle = profile.decode_idle;
}

void FillPagePrices(const MachineProfile& profile, int64_t block_tokens, PageCostProfile* prices) {
  PagePriceOptions options;
  options.block_tokens = block_tokens;
  FillPagePrices(profile, options, prices);
}

void FillRemoteTierPrices(const RemoteTierMeasurement& m, int64_t page_bytes, int64_t layers,
                          PageCostProfile* prices) {
  const double bytes = static_cast<double>(page_bytes * layers);
  // The bandwidth the read curve averages over the page's bytes; where its fit found the bytes
  // too cheap to tell from the latency (a loopback server on a busy machine), the page's median
  // read moves them all.
  double read_gbps = m.curves.read.EffectiveGbps(page_bytes * layers);
  if (read_gbps <= 0 && m.page_read_median_ms > 0) read_gbps = bytes / (m.page_read_median_ms * 1e6);
  prices->redis_read_gbps = read_gbps;
  // The page's price is its mean timed read (what the engine's reads of this very page shape
  // cost on average, tail included): the latency is what of it the bytes do not explain.
  prices->redis_latency_ms =
      read_gbps > 0 ? std::max(0.0, m.page_read_mean_ms - bytes / (read_gbps * 1e6)) : 0.0;
  const double write_gbps = m.curves.write.EffectiveGbps(page_bytes * layers);
  prices->redis_write_gbps = write_gbps > 0 ? write_gbps : read_gbps;
  prices->redis_write_latency_ms =
      m.curves.write.call_ms + m.curves.write.page_ms * static_cast<double>(layers);
  prices->redis_p99_ms = m.page_read_p99_ms;
}

}  // namespace kvl
