// kvl calibrate: measures this machine at a model's shapes (kvl/calibration.h), shows each stage
// live on stderr, prints a table of the results and writes the profile the KV cost model reads.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cli.h"
#include "kvl/calibration.h"
#include "kvl/kv_quality.h"
#include "kvl/machine_load.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {
namespace {

// One stderr line per stage: on a terminal it is redrawn in place with \r as the stage advances
// ("  matmul       [ 42%] |"); elsewhere (logs, pipes) only the finished line is written.
class ProgressDisplay {
 public:
  ProgressDisplay() : live_(::isatty(::fileno(stderr)) == 1) {}

  void Update(std::string_view stage, double fraction) {
    const auto now = std::chrono::steady_clock::now();
    if (stage != stage_) {
      stage_ = std::string(stage);
      stage_start_ = now;
      spin_ = 0;
    }
    if (fraction >= 1.0) {
      const double seconds = std::chrono::duration<double>(now - stage_start_).count();
      fmt::print(stderr, "\r  {:<10} [100%] done in {:.1f} s\n", stage_, seconds);
      std::fflush(stderr);
      return;
    }
    if (!live_) return;
    static constexpr char kSpinner[] = {'|', '/', '-', '\\'};
    // Floor, so "100%" appears only once the stage is done.
    fmt::print(stderr, "\r  {:<10} [{:3d}%] {}", stage_, static_cast<int>(100.0 * fraction),
               kSpinner[spin_++ % 4]);
    std::fflush(stderr);
  }

 private:
  bool live_;
  std::string stage_;
  std::chrono::steady_clock::time_point stage_start_;
  unsigned spin_ = 0;
};

void PrintTable(const MachineProfile& p, const std::string& profile_path) {
  const CalibrationModel& m = p.model;
  fmt::print("machine       {} threads, {} kernels ({}), load average {:.2f}; {}\n", p.threads,
             p.isa, p.cpu_features, p.load_average, LoadDescription(p));
  fmt::print("model         {}: dim {}, {} layers, {} heads / {} kv heads x {}, ffn {}, {}\n",
             m.name, m.dim, m.layers, m.heads, m.kv_heads, m.head_dim, m.ffn_dim, m.weight_type);
  fmt::print("KV f32        {} per token per layer; residual checkpoint {}\n",
             FormatBytes(m.kv_bytes_per_token_per_layer_f32),
             FormatBytes(m.residual_bytes_per_token_per_layer_f32));
  fmt::print("\n");

  fmt::print("| matmul GFLOP/s       |");
  for (const MatmulRate& r : p.matmul) fmt::print(" {:>9} |", fmt::format("n={}", r.n_tokens));
  fmt::print("\n|----------------------|");
  for (size_t i = 0; i < p.matmul.size(); ++i) fmt::print("-----------|");
  fmt::print("\n| K+V projections      |");
  for (const MatmulRate& r : p.matmul) fmt::print(" {:>9.2f} |", r.kv_proj_gflops);
  fmt::print("\n| full layer           |");
  for (const MatmulRate& r : p.matmul) fmt::print(" {:>9.2f} |", r.layer_gflops);
  fmt::print("\n\n");

  // By the step's context: 1 - ms per token of a 128-token forward run / ms of a 1-token step.
  // And the same step with kStepRebuildRows rows of pages rebuilt from checkpoints riding in it:
  // the rebuild's marginal price in the step, per row.
  fmt::print("| decode idle fraction | context | 1-token step ms | {}-token run ms/token | "
             "with {} rebuilt rows ms | ms per rebuilt row |\n",
             kIdlePrefillTokens, kStepRebuildRows);
  fmt::print("|----------------------|---------|-----------------|------------------------|"
             "------------------------|--------------------|\n");
  for (int i = 0; i < p.decode_idle.num_points; ++i) {
    const DecodeIdlePoint& d = p.decode_idle.points[static_cast<size_t>(i)];
    fmt::print("| {:>20.3f} | {:>7} | {:>15.4f} | {:>22.4f} | {:>22.4f} | {:>18.5f} |\n",
               d.Fraction(), d.context, d.step_ms, d.batch_ms_per_token, d.step_with_rebuild_ms,
               d.RebuildRowMs());
  }
  fmt::print("\n");

  // What one page costs each way, from the fitted curves, at a few shapes: the table answers
  // "recompute or fetch?" at a glance, and shows how the answer moves with size and position.
  const int64_t layer_kv = m.kv_bytes_per_token_per_layer_f32;
  const int64_t layer_residual = m.residual_bytes_per_token_per_layer_f32;
  fmt::print("| {:<34} | {:>9} | {:>9} | {:>9} | {:>9} |\n", "ms per page, all layers (f32)",
             "16 tok", "16 @2048", "256 tok", "256 @2048");
  fmt::print("|------------------------------------|-----------|-----------|-----------|-----------|\n");
  struct Shape {
    int64_t tokens, position;
  };
  constexpr Shape kShapes[] = {{16, 0}, {16, 2048}, {256, 0}, {256, 2048}};
  auto row = [&](std::string_view name, auto&& ms) {
    fmt::print("| {:<34} |", name);
    for (const Shape& s : kShapes) fmt::print(" {:>9.3f} |", ms(s));
    fmt::print("\n");
  };
  row("recompute K/V from residual", [&](const Shape& s) {
    return p.recompute_from_residual.Ms(s.tokens, m.layers, 0) +
           p.ram.read.Ms(m.layers, s.tokens * layer_residual);
  });
  row("recompute K/V from tokens", [&](const Shape& s) {
    return p.recompute_from_tokens.Ms(s.tokens, m.layers, s.position);
  });
  // Cold: the page restored long after it left, as the engine prices it once its weights and
  // pool outgrow the last-level cache; warm: read again at once (TierCurves::ReadFor).
  row("RAM tier read (cold)",
      [&](const Shape& s) { return p.ram.read.Ms(m.layers, s.tokens * layer_kv); });
  if (!p.ram.warm_read.points.empty()) {
    row("RAM tier read (warm)",
        [&](const Shape& s) { return p.ram.warm_read.Ms(m.layers, s.tokens * layer_kv); });
  }
  row("disk tier read (buffered)",
      [&](const Shape& s) { return p.disk_buffered.read.Ms(m.layers, s.tokens * layer_kv); });
  row(p.disk_direct_measured ? "disk tier read (O_DIRECT)" : "disk tier read (O_DIRECT refused)",
      [&](const Shape& s) { return p.disk_direct.read.Ms(m.layers, s.tokens * layer_kv); });
  row("compress int8", [&](const Shape& s) { return p.compress_int8.Ms(m.layers, s.tokens * layer_kv); });
  row("compress int4", [&](const Shape& s) { return p.compress_int4.Ms(m.layers, s.tokens * layer_kv); });
  fmt::print("\n");
  fmt::print("page KLD      int8 {:.3e}, int4 {:.3e} ({})\n\n", p.int8_kld, p.int4_kld,
             p.kld_tokens > 0 ? fmt::format("measured on {} tokens", p.kld_tokens)
                              : std::string("named defaults: not measured"));

  fmt::print("| {:<30} |      GB/s |\n",
             fmt::format("memory, {}, {} threads", FormatBytes(p.memory_bytes), p.threads));
  fmt::print("|--------------------------------|-----------|\n");
  fmt::print("| read (sum)                     | {:>9.2f} |\n", p.memory_read_gbps);
  fmt::print("| copy (memcpy, bytes copied)    | {:>9.2f} |\n", p.memory_copy_gbps);
  fmt::print("\n");

  fmt::print("disk device   {} ({} file, 1 MiB requests)\n", p.disk_dir, FormatBytes(p.disk_bytes));
  fmt::print("| {:<30} |     value |\n", "disk");
  fmt::print("|--------------------------------|-----------|\n");
  fmt::print("| write + fsync, GB/s            | {:>9.3f} |\n", p.disk_write_gbps);
  fmt::print("| read, GB/s                     | {:>9.3f} |  {}\n", p.disk_read_gbps,
             p.disk_read_direct ? "O_DIRECT" : "buffered, cache dropped");
  fmt::print("| 4 KiB random read median, us   | {:>9.1f} |  {}\n", p.disk_random_read_median_us,
             p.disk_random_read_direct ? "O_DIRECT" : "buffered, cache dropped");
  fmt::print("| 4 KiB random read p99, us      | {:>9.1f} |\n", p.disk_random_read_p99_us);
  fmt::print("\n");
  fmt::print("profile       {} (version {}, {})\n", profile_path, p.version, p.timestamp);
}

}  // namespace

int CalibrateCommand(const CalibrateArgs& args) {
  if (args.model_path.empty()) {
    fmt::print(stderr,
               "kvl calibrate: a model is required (-m MODEL.gguf): the profile is measured at "
               "the model's own shapes\n");
    return 1;
  }
  StatusOr<std::unique_ptr<Model>> model = Model::Load(args.model_path);
  if (!model.ok()) {
    fmt::print(stderr, "kvl: {}\n", model.status().ToString());
    return 1;
  }
  const int threads = ThreadsOrEveryCore(args.num_threads);
  StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(threads);
  if (!pool.ok()) {
    fmt::print(stderr, "kvl calibrate: {}\n", pool.status().ToString());
    return 1;
  }
  ops::OpsContext ctx(ops::BestIsa(), pool->get());
  // The output is checked before anything is measured, so a bad -o fails at once.
  const std::string path =
      args.output.empty() ? DefaultProfilePath(ProfileKey(**model, ctx)) : args.output;
  if (const Status writable = CheckProfileWritable(path); !writable.ok()) {
    fmt::print(stderr, "kvl calibrate: {}\n", writable.ToString());
    return 1;
  }
  CalibrateOptions options;
  options.disk_dir = args.disk_dir;
  options.quick = args.quick;
  // The page KLD is measured on the built-in text as this model's tokenizer encodes it; a model
  // without one keeps the named defaults (and --explain says so).
  if (StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf((*model)->file());
      tokenizer.ok()) {
    options.quality_tokens = (*tokenizer)->Encode(kKvQualityText, /*add_bos=*/true);
  } else {
    fmt::print(stderr, "kvl calibrate: no tokenizer ({}): the page KLDs stay named defaults\n",
               tokenizer.status().ToString());
  }

  fmt::print(stderr, "kvl calibrate: {}{}\n", args.model_path, args.quick ? " (quick)" : "");
  ProgressDisplay display;
  auto measure = [&] {
    return Calibrate(**model, ctx, options, [&](std::string_view stage, double fraction) {
      display.Update(stage, fraction);
    });
  };
  StatusOr<MachineProfile> profile = measure();
  // Busy while measuring but quiet now: the load was passing, so once more.
  if (profile.ok() && MeasuredUnderLoad(*profile)) {
    const std::optional<double> others_now = MeasureOthersCpuShare(0.25);
    if (others_now && *others_now <= kBusyOthersCpuShare) {
      fmt::print(stderr, "\nkvl calibrate: the machine was busy ({}) and is quiet now: measuring "
                 "again\n", LoadDescription(*profile));
      profile = measure();
    }
  }
  if (!profile.ok()) {
    fmt::print(stderr, "\nkvl: {}\n", profile.status().ToString());
    return 1;
  }
  const Status saved = SaveProfile(*profile, path);
  fmt::print(stderr, "\n");
  if (MeasuredUnderLoad(*profile)) {
    fmt::print(stderr,
               "kvl calibrate: warning: measured on a busy machine ({}; load average {:.2f}): "
               "the rates are low; calibrate again on a quiet machine (a run that finds the "
               "machine quiet measures a default-path profile again by itself)\n\n",
               LoadDescription(*profile), profile->load_average);
  }
  PrintTable(*profile, path);
  if (args.explain) fmt::print("\n{}", ExplainProfile(*profile));
  if (!saved.ok()) {
    fmt::print(stderr, "kvl: {}\n", saved.ToString());
    return 1;
  }
  return 0;
}

}  // namespace kvl::cli
