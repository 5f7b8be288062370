// Calibration: measures this machine for the KV cost model (ARCHITECTURE.md, "Cost model") and
// keeps the result as a JSON profile. What it measures, each as a short timed loop repeated and
// reduced to its median:
//   - matmul throughput of the project's own kernels at the model's projection shapes;
//   - the time to recompute one page of K/V across all layers, from residual checkpoints and from
//     tokens;
//   - memory read and copy bandwidth;
//   - disk sequential write/read bandwidth and 4 KiB random read latency.
// The profile is per machine *and* per model shape: rates depend on the shapes and weight type.
// Calibrate measures the model the caller has loaded, on the caller's thread pool: the engine
// passes its own (kvl/cost_profile.h), `kvl calibrate` loads the model and starts a pool first.
//
// Thread-safety: Calibrate uses the whole pool (and big buffers, a scratch file); run one at a
// time, and nothing else on that pool meanwhile. The profile functions are free of shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/status.h"

namespace kvl {

class Model;
namespace ops {
class OpsContext;
}

// Bumped whenever a field changes meaning or is added; LoadProfile rejects other versions.
// 2: `source` says whether the numbers were measured or are analytic defaults.
inline constexpr int64_t kProfileVersion = 2;
// Tokens per page the recompute times are measured for (the paged KV manager's block size).
inline constexpr int64_t kCalibrationPageTokens = 16;

// MachineProfile::source: how the numbers were obtained.
inline constexpr std::string_view kProfileSourceMeasured = "measured";
inline constexpr std::string_view kProfileSourceDefault = "default (no calibration)";

struct CalibrateOptions {
  std::string disk_dir;    // directory for the scratch file; empty = the system temp dir
  bool quick = false;      // fewer repetitions and smaller buffers: a few seconds in all

  // Sizes and repetitions; 0 picks the default for the mode (tests make them small).
  int64_t memory_bytes = 0;       // memory test buffer: 256 MiB
  int64_t disk_bytes = 0;         // disk test file: 256 MiB, 64 MiB with quick
  int64_t random_reads = 0;       // 4 KiB random reads timed: 2000, 500 with quick
  int repetitions = 0;            // samples per measurement (median taken): 7, 3 with quick
  int disk_repetitions = 0;       // write+read passes over the disk file: 3, 2 with quick
  double min_sample_seconds = 0;  // a sample repeats its loop at least this long: 0.05, 0.01
};

struct CalibrationModel {
  std::string name;
  int64_t dim = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  std::string weight_type;                             // "q8_0", "f32", ... or "mixed"
  int64_t kv_bytes_per_token_per_layer_f32 = 0;        // K and V rows
  int64_t residual_bytes_per_token_per_layer_f32 = 0;  // the layer's input row

  bool operator==(const CalibrationModel&) const = default;
};

// Matmul throughput for one batch size, counting 2 * rows * cols FLOPs per token per matrix.
struct MatmulRate {
  int64_t n_tokens = 0;
  double kv_proj_gflops = 0;  // Wk and Wv ([kv_dim x dim] each) as one MatMulGroup
  double layer_gflops = 0;    // every projection of one layer (Wq/Wk/Wv, Wo, gate/up, down)

  bool operator==(const MatmulRate&) const = default;
};

struct MachineProfile {
  int64_t version = kProfileVersion;
  // kProfileSourceMeasured, or kProfileSourceDefault when every rate below is an assumption
  // computed from the model's shape (AnalyticProfile); then the measurement sizes (memory_bytes,
  // disk_bytes) are 0 and disk_dir is empty.
  std::string source = std::string(kProfileSourceMeasured);
  std::string timestamp;     // UTC, ISO 8601: "2025-01-31T12:00:00Z"
  std::string cpu_features;  // ops::CpuFeatureString()
  std::string isa;           // the kernel path measured: ops::IsaName(ops::BestIsa())
  int64_t threads = 0;
  // The 1-minute load average when calibration started: well above 0 means other processes
  // competed for the cores and the rates below are low (re-run on a quiet machine).
  double load_average = 0;

  CalibrationModel model;

  std::vector<MatmulRate> matmul;  // n_tokens = 1 (decode), 16 (a page), 128 (a prefill chunk)

  // Milliseconds to recompute the K/V of one page (page_tokens tokens, every layer):
  //   from_residual: per layer RmsNorm + Wk/Wv projections + RoPE of K from stored layer inputs;
  //   from_tokens:   a full forward pass of the page's tokens (at positions 0..page_tokens-1, so
  //                  attention over earlier context is not included).
  int64_t recompute_page_tokens = kCalibrationPageTokens;
  double recompute_from_residual_ms = 0;
  double recompute_from_tokens_ms = 0;

  // Memory bandwidth with `threads` threads over a memory_bytes buffer. copy_gbps counts the
  // bytes copied (not read + written), i.e. what moving a page in RAM achieves.
  int64_t memory_bytes = 0;
  double memory_read_gbps = 0;
  double memory_copy_gbps = 0;

  // Disk: sequential 1 MiB requests over a disk_bytes file in disk_dir; write time includes
  // fsync. read_direct says whether reads bypassed the page cache with O_DIRECT (otherwise the
  // cache was dropped with posix_fadvise first).
  std::string disk_dir;
  int64_t disk_bytes = 0;
  double disk_write_gbps = 0;
  double disk_read_gbps = 0;
  bool disk_read_direct = false;
  bool disk_random_read_direct = false;
  double disk_random_read_median_us = 0;  // one 4 KiB read at a random aligned offset
  double disk_random_read_p99_us = 0;

  bool operator==(const MachineProfile&) const = default;
};

// Called as calibration advances: `stage` names the measurement ("matmul", "recompute",
// "memory", "disk"), `fraction` in [0, 1] is how much of that stage is done; every stage ends
// with a call at exactly 1.0. Called on the calibrating thread.
using CalibrationProgress = std::function<void(std::string_view stage, double fraction)>;

// Runs every measurement on `model` with ctx's ISA and thread pool (threads = the pool's size).
// ctx's scratch is left as it is: calibration reserves its own for its larger batches.
// INVALID_ARGUMENT for a bad option; NOT_FOUND / IO_ERROR when the disk directory cannot be used
// (checked before anything is measured).
StatusOr<MachineProfile> Calibrate(const Model& model, ops::OpsContext& ctx,
                                   const CalibrateOptions& options,
                                   const CalibrationProgress& progress);

// The sizes the engine calibrates with when it has no profile: a few seconds in all.
CalibrateOptions QuickCalibrateOptions();

// Whether SaveProfile could write `path`, checked without writing anything, so a command fails
// before it measures: INVALID_ARGUMENT when the path is empty, is a directory or is not a regular
// file (SaveProfile renames over it), or a part of its parent is a file; IO_ERROR when the
// nearest existing parent directory is not writable.
Status CheckProfileWritable(const std::string& path);

// Writes the profile as JSON (creating parent directories; replaced atomically by rename).
Status SaveProfile(const MachineProfile& profile, const std::string& path);
// Reads and validates a profile. NOT_FOUND for a missing file; DATA_LOSS for invalid JSON or a
// missing, mistyped, negative or non-finite field (the message names the field, e.g.
// "disk.read_gbps") or an unknown source; INVALID_ARGUMENT for a profile version this build does
// not read.
StatusOr<MachineProfile> LoadProfile(const std::string& path);

// Where a profile for `model_name` lives by default: $KVL_PROFILE when set, else
// $XDG_CACHE_HOME (or ~/.cache)/kvlattice/profile-<model name>.json, with the name reduced to
// [A-Za-z0-9._-].
std::string DefaultProfilePath(std::string_view model_name);

}  // namespace kvl
