// Calibration: measures this machine for the KV cost model (ARCHITECTURE.md, "Cost model") and
// keeps the result as a JSON profile. It measures curves, not points: each quantity is timed at a
// few shapes (short timed loops, repeated, reduced to the median) and a small linear model is
// fitted to them, so the cost model can price a page of any tokens, depth and position:
//   - matmul throughput of the project's own kernels at decode, page and prefill batch sizes,
//     and from it the compute a decode step leaves idle;
//   - recompute of K/V from residual checkpoints and from tokens, by tokens, layers and the
//     position the page sits at (attention over the context before it);
//   - memory read and copy bandwidth;
//   - the RAM and disk tiers (buffered and O_DIRECT), written and read as the pager does;
//   - disk sequential bandwidth and 4 KiB random read latency (the raw device, for the table);
//   - int8 / int4 page encoding time with the project's codec;
//   - the KL divergence int8 / int4 pages cause, teacher-forced on a built-in text.
// The profile is per machine *and* per model shape: rates depend on the shapes and weight type.
// Calibrate measures the model the caller has loaded, on the caller's thread pool: the engine
// passes its own (kvl/cost_profile.h), `kvl calibrate` loads the model and starts a pool first.
//
// Thread-safety: Calibrate uses the whole pool (and big buffers, scratch files); run one at a
// time, and nothing else on that pool meanwhile. The profile functions are free of shared state.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/kv_policy.h"  // kDefaultInt8Kld, kDefaultInt4Kld: the KLDs where unmeasured
#include "kvl/status.h"

namespace kvl {
class KvTier;  // kvl/kv_tier.h
}  // namespace kvl

namespace kvl {

class Model;
namespace ops {
class OpsContext;
}

// Bumped whenever a field changes meaning or is added; LoadProfile rejects other versions.
// 2: `source` says whether the numbers were measured or are analytic defaults.
// 3: curves instead of points: recompute by tokens, layers and position; transfers per tier as
//    fitted latency + bytes / bandwidth; compress time; measured KLD; decode's idle compute.
// 4: decode's idle fraction as a curve over the context ("decode": {"points": [...]}); transfer
//    curves with a second bandwidth above a measured size ("knee_bytes", "large_gbps").
// 5: a tier's reads measured cold and warm ("read", "warm_read") and the last-level cache's size
//    ("cache_bytes") that chooses between them.
inline constexpr int64_t kProfileVersion = 5;
// Tokens per page the table of `kvl calibrate` shows (the paged KV manager's default block).
inline constexpr int64_t kCalibrationPageTokens = 16;
// The decode idle fraction (DecodeIdleCurve) is measured with a 1-token step against a batch of
// kIdlePrefillTokens at DecodeIdleContexts: kIdleShortContextTokens, the longest context where
// the batch still fits the model's context (at most kIdleLongContextTokens: the KV rows of a 7B
// model's 1024 positions are already 1 GiB), and the middle of the two.
inline constexpr int64_t kIdlePrefillTokens = 128;
inline constexpr int64_t kIdleShortContextTokens = 16;
inline constexpr int64_t kIdleLongContextTokens = 1024;
// Rows of pages rebuilt from checkpoints that ride in the decode step timed at each of those
// contexts (4 pages of 16 tokens): the step's time with them against without them is the
// rebuild's marginal price in the step (DecodeIdlePoint::RebuildRowMs).
inline constexpr int64_t kStepRebuildRows = 64;
// Those contexts for a model of `context_length` tokens (0: unknown), increasing, no repeats.
std::vector<int64_t> DecodeIdleContexts(int64_t context_length);

// Bytes of the largest CPU cache (the last level, shared by the cores), as the kernel lists it
// in /sys/devices/system/cpu/cpu0/cache (sysconf where that is missing: some hypervisors make
// glibc's CPUID reading report 10x the real size); 0 when neither says.
int64_t LastLevelCacheBytes();

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
  // Seconds each recompute curve may take (its points are chosen, smallest first, to fit):
  // 20, 1 with quick.
  double curve_seconds = 0;
  // The built-in text (kKvQualityText) as the model's tokenizer encodes it: the int8 / int4 KLD
  // is measured teacher-forced on it. Empty: the KLDs stay the named defaults, marked so.
  // (Calibrate has no tokenizer of its own: the caller, which loaded the model, encodes it.)
  std::vector<int32_t> quality_tokens;
  // Set by another thread to stop a calibration that is no longer wanted (an engine that measures
  // while idle, when a request arrives): nothing more is timed, and Calibrate returns CANCELLED
  // at its next stage. Null: it runs to the end.
  const std::atomic<bool>* stop = nullptr;
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

// One timed recompute: `tokens` tokens at positions [position, position + tokens) through
// `layers` layers, the median of the samples in milliseconds.
struct RecomputePoint {
  int64_t tokens = 0;
  int64_t layers = 0;
  int64_t position = 0;
  double ms = 0;

  bool operator==(const RecomputePoint&) const = default;
};

// Recompute time as a function of the page's shape, fitted (non-negative least squares on the
// relative error) to the points it keeps:
//   ms = call_ms + layer_ms * layers + token_layer_ms * tokens * layers
//        + context_token_layer_ms * tokens * AttendedPositions(tokens, position) * layers
// call_ms is paid once per call (per forward pass), layer_ms once per layer of a call (weights
// streamed, threads woken), token_layer_ms per token and layer (the projections),
// context_token_layer_ms per token, layer and position it attends to (attention: the context
// before the page and, on average, half the page's own tokens).
// Positions one of `tokens` tokens at [position, position + tokens) attends to, on average:
// position + (tokens + 1) / 2.
double AttendedPositions(int64_t tokens, int64_t position);

struct RecomputeCurve {
  double call_ms = 0;
  double layer_ms = 0;
  double token_layer_ms = 0;
  double context_token_layer_ms = 0;
  std::vector<RecomputePoint> points;

  double Ms(int64_t tokens, int64_t layers, int64_t position) const;
  bool operator==(const RecomputeCurve&) const = default;
};

// One timed transfer: `pages` pages of `page_bytes` each in one call.
struct TransferPoint {
  int64_t pages = 0;
  int64_t page_bytes = 0;
  double ms = 0;

  bool operator==(const TransferPoint&) const = default;
};

// A transfer's time as latency + bytes / bandwidth, fitted like RecomputeCurve:
//   ms = call_ms + page_ms * pages + BytesMs(pages * page_bytes)
//   BytesMs(b) = min(b, knee_bytes) / (gbps * 1e6) + max(0, b - knee_bytes) / (large_gbps * 1e6)
// (a tier call coalesces its pages into few I/O operations, so the latency splits into a part per
// call and a part per page). The bytes of a call go at gbps while they fit the CPU caches, and at
// large_gbps beyond knee_bytes, where they stream from and to DRAM (a RAM copy of a 1024-token
// page set runs at about 2/3 of the rate of a 16-token one). The fit tries each measured call
// size as the knee and keeps the best (FitTransferCurve); knee_bytes = 0: one bandwidth for every
// size (large_gbps unused). gbps = 0 means bytes cost nothing measurable.
struct TransferCurve {
  double call_ms = 0;
  double page_ms = 0;
  double gbps = 0;
  int64_t knee_bytes = 0;
  double large_gbps = 0;
  std::vector<TransferPoint> points;

  double Ms(int64_t pages, int64_t page_bytes) const;
  // The bytes' part of a call moving `bytes` in all, and the bandwidth it averages.
  double BytesMs(int64_t bytes) const;
  double EffectiveGbps(int64_t bytes) const;  // gbps where bytes cost nothing measurable
  bool operator==(const TransferCurve&) const = default;
};

// A tier's two directions, measured through the tier itself (kv_tier.h) with the pages a KV
// page really becomes: one tier page per layer, written and read in one call. A read costs more
// when the tier's copy of the pages is cold in the CPU caches (last touched long ago, as a page
// restored after the engine streamed its weights and pool since it left) than when it is warm
// (the pages were just moved, as a set read again and again): on a Zen 4 VM a RAM tier reads a
// 16-token page set of 0.2 MiB cold at half its warm rate. Both are measured.
struct TierCurves {
  TransferCurve write;      // Put, cycling through pages that outgrow the caches
  TransferCurve read;       // Get of pages cold in the caches (checksums verified, as always)
  TransferCurve warm_read;  // Get of the pages the call before got (in the caches where they fit)

  // The read a caller sees whose working set (every byte it touches between two reads of a page:
  // weights, pool, tier pages; 0 if unknown) is `working_set_bytes`: warm_read where it fits in
  // the last-level cache of `cache_bytes` and warm_read was measured, else read.
  const TransferCurve& ReadFor(int64_t working_set_bytes, int64_t cache_bytes) const;
  bool operator==(const TierCurves&) const = default;
};

// One action's measured correction of the profile's bring-back prices (kvl/kv_price_feedback.h):
// what the engine found the profile's predictions off by, written back into the profile
// (kvl/profile_corrections.h) so that the next run starts from it.
struct PriceCorrection {
  std::string key;     // the action's name (KvActionName), or "redis" for the KV store's Redis tier
  double scale = 1;    // measured / predicted: the median over the last events
  int64_t events = 0;  // bring-back events measured since the profile was
  bool operator==(const PriceCorrection&) const = default;
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
  // The last-level CPU cache (LastLevelCacheBytes; 0: unknown): a working set that fits
  // reads tier pages warm (TierCurves::ReadFor).
  int64_t cache_bytes = 0;
  // The 1-minute load average when calibration started: well above 0 means other processes
  // competed for the cores and the rates below are low (re-run on a quiet machine).
  double load_average = 0;
  // While calibration ran: the share of the machine's CPU time other processes took
  // (kvl/machine_load.h), and the median relative spread of the timed samples, (slowest -
  // fastest) / median per measurement. MeasuredUnderLoad judges them. Both 0 in profiles written
  // before they were recorded.
  double others_cpu_share = 0;
  double sample_spread = 0;
  // Why this profile was measured where a run measured it again ("the correction of
  // recompute-tokens drifted to 1.82x over 12 events"); empty for a first measurement. A profile
  // measured again for a drift is not measured again for another one (ProfileKeeper): a drift that
  // survives a fresh measurement is a cost calibration cannot see, and stays a correction.
  std::string measured_because;

  // Written back by the engine as it runs (absent in a profile no engine has used): the measured
  // corrections of this profile's bring-back prices, which the next engine starts from, and why
  // the next run must measure the machine again (a correction drifted past
  // --kv-profile-drift), which ObtainProfile does at a default path. Neither is a measurement of
  // calibration's: Calibrate leaves them empty.
  std::vector<PriceCorrection> corrections;
  std::string remeasure_reason;

  CalibrationModel model;

  std::vector<MatmulRate> matmul;  // n_tokens = 1 (decode), 16 (a page), 128 (a prefill chunk)
  // The fraction of the machine's arithmetic a decode step leaves idle, by the step's context:
  // at each of DecodeIdleContexts, 1 - (ms per token of a kIdlePrefillTokens-token forward run)
  // / (ms of a 1-token run), both after that many tokens of context. Decode runs one token per
  // pass over the weights, at the memory's pace (and pays every per-step cost for one token); a
  // batch shows what the same cores do when arithmetic is the limit. The difference is the
  // compute recompute could use for free; it grows with the context, since a step's attention
  // over the context is arithmetic the batch spreads over its tokens. The same 1-token step is
  // also timed with kStepRebuildRows rebuilt rows riding in it: what the engine's rebuilds in the
  // step really cost, and the only thing the policy prices them by. No points: nothing hidden
  // (the analytic defaults assume none).
  DecodeIdleCurve decode_idle;

  //   from_residual: RmsNorm + Wk/Wv projections + RoPE of stored layer inputs, through the
  //                  forward pass's own KvRebuilder, plus nothing else (the read is a transfer);
  //   from_tokens:   a forward pass of the page's tokens after `position` tokens of context, so
  //                  attention over everything before the page counts.
  RecomputeCurve recompute_from_residual;
  RecomputeCurve recompute_from_tokens;

  // Memory bandwidth with `threads` threads over a memory_bytes buffer. copy_gbps counts the
  // bytes copied (not read + written), i.e. what moving a page in RAM achieves.
  int64_t memory_bytes = 0;
  double memory_read_gbps = 0;
  double memory_copy_gbps = 0;

  // The tiers, measured through the tier code the engine runs, with K/V-like data cycling through
  // more than the CPU caches hold: a RAM tier (plain and zstd), and a scratch disk
  // tier file in disk_dir opened buffered (as --kv-tier disk: is by default; reads of pages
  // written moments ago come from the page cache) and with O_DIRECT (disk:...:direct; the
  // device itself). disk_direct_measured is false when the filesystem refused O_DIRECT: then
  // disk_direct is a copy of disk_buffered.
  TierCurves ram;
  TierCurves ram_zstd;  // a RAM tier that compresses its pages (--kv-tier ram:SIZE:zstd)
  TierCurves disk_buffered;
  TierCurves disk_direct;
  bool disk_direct_measured = false;

  // Disk: sequential 1 MiB requests over a disk_bytes file in disk_dir; write time includes
  // fsync. read_direct says whether reads bypassed the page cache with O_DIRECT (otherwise the
  // cache was dropped with posix_fadvise first). The device's raw rates, for the table.
  std::string disk_dir;
  int64_t disk_bytes = 0;
  double disk_write_gbps = 0;
  double disk_read_gbps = 0;
  bool disk_read_direct = false;
  bool disk_random_read_direct = false;
  double disk_random_read_median_us = 0;  // one 4 KiB read at a random aligned offset
  double disk_random_read_p99_us = 0;

  // Encoding one page with the project's codec (kv_codec.h), as a TransferCurve with pages =
  // layers and page_bytes = one layer's f32 K+V bytes.
  TransferCurve compress_int8;
  TransferCurve compress_int4;

  // The mean KL divergence of the next-token distribution when every page before the current
  // one is int8 / int4 (encoded and decoded with kv_codec), teacher-forced on kv_quality_tokens
  // tokens of kKvQualityText against the same model with f32 pages. kld_tokens = 0: not measured,
  // and the KLDs are kDefaultInt8Kld / kDefaultInt4Kld.
  int64_t kld_tokens = 0;
  double int8_kld = kDefaultInt8Kld;
  double int4_kld = kDefaultInt4Kld;

  bool operator==(const MachineProfile&) const = default;
};

// A profile whose rates were measured while the machine was busy: others took more than
// kBusyOthersCpuShare of its CPU time, or the samples spread more than kBusySampleSpread. Such
// rates are slow for the machine once it is quiet (recomputes priced 69-117% too slow on the
// TinyLlama shape), so ObtainProfile measures again when it finds the machine quiet.
inline constexpr double kBusyOthersCpuShare = 0.25;
inline constexpr double kBusySampleSpread = 0.5;
bool MeasuredUnderLoad(const MachineProfile& profile);
// "other processes took 62% of the CPU, samples spread 71%": why MeasuredUnderLoad said so.
std::string LoadDescription(const MachineProfile& profile);

// Every input of the cost model, one line each: its value and how it was measured, or that it
// is a named default and why (`kvl calibrate --explain`, and the engine's profile message).
std::string ExplainProfile(const MachineProfile& profile);

// Called as calibration advances: `stage` names the measurement ("matmul", "recompute",
// "memory", "disk", "tiers", "compress", "quality"), `fraction` in [0, 1] is how much of that stage is done; every stage ends
// with a call at exactly 1.0. Called on the calibrating thread.
using CalibrationProgress = std::function<void(std::string_view stage, double fraction)>;

// Runs every measurement on `model` with ctx's ISA and thread pool (threads = the pool's size).
// ctx's scratch is left as it is: calibration reserves its own for its larger batches.
// INVALID_ARGUMENT for a bad option; NOT_FOUND / IO_ERROR when the disk directory cannot be used
// (checked before anything is measured).
StatusOr<MachineProfile> Calibrate(const Model& model, ops::OpsContext& ctx,
                                   const CalibrateOptions& options,
                                   const CalibrationProgress& progress);

// The curve fits Calibrate uses, for anyone with points of their own (`kvl bench frontier`, the
// tests): non-negative least squares on the relative error, so a 16-token page and a 4096-token
// one weigh alike; a term whose coefficient would come out negative is dropped and the rest
// refitted. The points are kept in the curve. An empty list gives an all-zero curve.
RecomputeCurve FitRecomputeCurve(std::vector<RecomputePoint> points);
TransferCurve FitTransferCurve(std::vector<TransferPoint> points);

// The sizes the engine calibrates with when it has no profile: a few seconds in all.
CalibrateOptions QuickCalibrateOptions();

// A tier calibration cannot reach on its own (the Redis server an engine is pointed at), measured
// as Calibrate measures RAM and disk: the tier's own Put and Get of 1 and `layers` pages, at
// 4 KiB and at `page_bytes`, and of the 1024-token page set (64 x `page_bytes` a page, up to
// `layers` of them within 32 MiB a call), fitted as latency + bytes / bandwidth with a knee;
// reads cold (cycling through 64 calls' keys, fewer than Calibrate's) and warm.
// Writes keys 1.. of `tier` and erases them: open it under an identity of its own. With
// QuickCalibrateOptions, about 1 s over loopback.
StatusOr<TierCurves> MeasureTierCurves(KvTier& tier, int64_t page_bytes, int64_t layers,
                                       const CalibrateOptions& options);

// A remote tier (Redis) measured through its link: MeasureTierCurves' curves, and one page
// (`layers` tier pages of `page_bytes`, one Get each) read again and again, each read timed, for
// the spread of its round trips (a network's tail, which the curves' medians hide): between 20
// and 100 reads, fewer where each takes long (about a second in all).
struct RemoteTierMeasurement {
  TierCurves curves;
  int64_t page_reads = 0;
  double page_read_median_ms = 0;
  double page_read_mean_ms = 0;
  double page_read_p99_ms = 0;
};
StatusOr<RemoteTierMeasurement> MeasureRemoteTier(KvTier& tier, int64_t page_bytes,
                                                  int64_t layers, const CalibrateOptions& options);

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

// Where a profile for `profile_key` (ProfileKey) lives by default: $KVL_PROFILE when set, else
// $XDG_CACHE_HOME (or ~/.cache)/kvlattice/profile-<key>.json, with the key reduced to
// [A-Za-z0-9._-].
std::string DefaultProfilePath(std::string_view profile_key);

// What a profile is measured for, as a file name: the model's name, dim x layers and weight
// type, the ISA and the threads, e.g. "llama-2048x22-q8_0-avx512-t2". Two models of one name
// (every llama-architecture file is "llama") or one model run on other threads keep profiles of
// their own instead of measuring over each other's at every switch.
std::string ProfileKey(const Model& model, const ops::OpsContext& ctx);

}  // namespace kvl
