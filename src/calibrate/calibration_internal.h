// Pieces of calibration shared between its files: timing, progress per stage, the disk test, and
// the model facts both the measurements and the analytic defaults use. Internal to
// src/calibrate; the public interface is kvl/calibration.h and kvl/cost_profile.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/calibration.h"
#include "kvl/machine_load.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/status.h"
#include "kvl/thread_pool.h"

namespace kvl::calibration_internal {

inline constexpr int64_t kMiB = int64_t{1} << 20;
// Batch sizes the matmul rates are measured at: decode, a page, a prefill chunk.
inline constexpr int64_t kMatmulTokenCounts[] = {1, kCalibrationPageTokens, 128};

// A recompute point (or decode idle batch) expected to take longer than this is sampled once
// (after its warm-up): one call is already long enough to time well, and a quick calibration of
// a 1B model stays short.
inline constexpr double kLongPointSeconds = 0.2;
// Options with every 0 replaced by the default for the mode.
CalibrateOptions ResolveDefaults(const CalibrateOptions& in);
// The model facts a profile records (and is checked against when loaded for a model).
CalibrationModel DescribeModel(const Model& model);
// The threads ctx runs its kernels on: its pool's, or 1 without one.
int ContextThreads(const ops::OpsContext& ctx);
// A profile of `model` stamped now, with this CPU, ctx's ISA and pool size and the given source;
// its rates are left for the caller.
MachineProfile NewProfile(const Model& model, const ops::OpsContext& ctx, std::string_view source);
// FLOPs per token (2 per multiply-add) of one layer's K and V projections, and of every
// projection of one layer (Wq, Wk, Wv, Wo, gate, up, down).
double KvProjectionFlopsPerToken(const ModelConfig& c);
double LayerFlopsPerToken(const ModelConfig& c);

// n samples of a standard normal, the same for the same seed (inputs to time kernels on).
std::vector<float> RandomFloats(size_t n, uint32_t seed);
// Random residual checkpoints laid out as a restore stages a page's layers, each layer its own
// page ([layer][tokens][dim]), and the K and V rows rebuilt from them ([layer][tokens][kv_dim]):
// what a rebuild is timed on, so that each layer's input comes from memory as a restore's does,
// not from the core's cache, where one page shared by every layer would stay. Holds `rows`
// rows (tokens x layers of the largest page set timed, or fewer): a page set of more rows takes
// the pages in turn, layer l on page l mod (rows / tokens), which is as good where its pages are
// far past any core's cache.
class RebuildPages {
 public:
  RebuildPages(int64_t rows, const ModelConfig& c, uint32_t seed);
  // Layer `layer`'s page of a page set of `tokens` tokens per layer.
  const float* Checkpoints(int64_t layer, int64_t tokens) const;
  float* K(int64_t layer, int64_t tokens);
  float* V(int64_t layer, int64_t tokens);

 private:
  // The first row of that page (KVL_CHECKs that one page fits).
  int64_t FirstRow(int64_t layer, int64_t tokens) const;
  int64_t rows_, dim_, kv_dim_;
  std::vector<float> checkpoints_, k_, v_;
};
// Monotonic wall-clock seconds.
double NowSeconds();
// Median and nearest-rank percentile (p in [0, 100]) of a non-empty sample.
double Median(std::vector<double> values);
double Percentile(std::vector<double> values, double p);

// Reports one stage's progress as a count of equal steps; Finish() reports exactly 1.0.
class StageProgress {
 public:
  StageProgress(const CalibrationProgress& progress, std::string_view stage, int64_t total_steps);
  void Step();
  void Finish();

 private:
  const CalibrationProgress& progress_;
  std::string_view stage_;
  int64_t total_steps_;
  int64_t done_steps_ = 0;
};

// The relative spread of each timed measurement's samples, (slowest - fastest) / median, kept while
// a log is open on this thread (Calibrate opens one for its run): how steady the machine was as
// the measurements saw it. Logs nest; the innermost open one records.
class SampleSpreadLog {
 public:
  SampleSpreadLog();
  ~SampleSpreadLog();
  SampleSpreadLog(const SampleSpreadLog&) = delete;
  SampleSpreadLog& operator=(const SampleSpreadLog&) = delete;

  // Adds the spread of `samples` (at least 3 of them: fewer say nothing) to the open log, if any.
  static void Record(const std::vector<double>& samples);
  // The median spread recorded; 0 with none.
  double MedianSpread() const;

 private:
  std::vector<double> spreads_;
  SampleSpreadLog* outer_;
};

// CalibrateOptions::stop, seen by the timing helpers of the calibrating thread while a scope is
// open (Calibrate opens one for its run): once the flag is set, MedianSecondsPerCall times nothing
// more, and Calibrate returns CANCELLED at its next stage.
class StopScope {
 public:
  explicit StopScope(const std::atomic<bool>* flag);
  ~StopScope();
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;

 private:
  const std::atomic<bool>* outer_;
};
// Whether the open scope's flag is set (false with none open).
bool StopRequested();

// Runs fn once as a warm-up, then `repetitions` samples, each calling fn until at least
// min_sample_seconds have passed, and returns the seconds per call the samples stand for
// (QuietSeconds: their median, or where they spread past kBusySampleSpread, the median of the
// fastest half). Samples are bounded by time rather than by a call count fixed up front: on a
// busy machine one call's time swings widely, and a count sized from a lucky fast call could run
// for seconds. A measurement whose samples spread past kBusySampleSpread takes `repetitions`
// samples more, once, so that the fastest half has more chances to be quiet ones. Steps
// `progress` once per first-round sample. Once StopRequested, nothing more is timed and the
// result means nothing (the caller discards the calibration).
template <typename Fn>
double MedianSecondsPerCall(int repetitions, double min_sample_seconds, StageProgress& progress,
                            Fn&& fn) {
  constexpr double kStoppedSeconds = 1e-3;  // any positive time: a stopped result is discarded
  if (StopRequested()) return kStoppedSeconds;
  fn();
  std::vector<double> samples;
  samples.reserve(2 * static_cast<size_t>(repetitions));
  auto take_sample = [&] {
    const double t0 = NowSeconds();
    double elapsed = 0;
    int64_t calls = 0;
    do {
      fn();
      ++calls;
      elapsed = NowSeconds() - t0;
    } while (elapsed < min_sample_seconds);
    samples.push_back(elapsed / static_cast<double>(calls));
  };
  for (int r = 0; r < repetitions && !StopRequested(); ++r) {
    take_sample();
    progress.Step();
  }
  if (SampleSpread(samples) > kBusySampleSpread) {
    for (int r = 0; r < repetitions && !StopRequested(); ++r) take_sample();
  }
  if (samples.empty()) return kStoppedSeconds;
  SampleSpreadLog::Record(samples);
  return QuietSeconds(std::move(samples), kBusySampleSpread);
}

struct DiskMeasurement {
  std::string dir;
  int64_t bytes = 0;
  double write_gbps = 0;
  double read_gbps = 0;
  bool read_direct = false;
  bool random_read_direct = false;
  double random_read_median_us = 0;
  double random_read_p99_us = 0;
};

struct DiskTestOptions {
  std::string dir;  // empty: the system temp dir
  int64_t bytes = 0;
  int64_t random_reads = 0;
  int repetitions = 0;
};

// The directory the disk test will use (options.dir, or the system temp dir when empty);
// NOT_FOUND / INVALID_ARGUMENT when it is missing or not a directory. Checked before anything
// slow runs, so a typo in --disk fails at once.
StatusOr<std::string> ResolveDiskDir(const std::string& dir);

// Writes, reads back and randomly reads a scratch file in options.dir, then removes it.
// Steps `progress` (repetitions + 1) times.
StatusOr<DiskMeasurement> MeasureDisk(const DiskTestOptions& options, StageProgress& progress);

struct RecomputeCurves {
  RecomputeCurve from_residual;
  RecomputeCurve from_tokens;
  // A decode step (1 token) and a prefill batch (kIdlePrefillTokens), per token, after each of
  // DecodeIdleContexts: MachineProfile's idle fraction.
  DecodeIdleCurve decode_idle;
};
// The recompute curves (calibration_recompute.cc), their points chosen from `rates` (the matmul
// rates measured just before) to fit o.curve_seconds each.
StatusOr<RecomputeCurves> MeasureRecomputeCurves(const Model& model, ThreadPool& pool,
                                                 const ops::OpsContext& ctx,
                                                 const CalibrateOptions& o,
                                                 std::span<const MatmulRate> rates,
                                                 const CalibrationProgress& progress);

struct TierMeasurement {
  TierCurves ram;
  TierCurves ram_zstd;
  TierCurves disk_buffered;
  TierCurves disk_direct;
  std::string direct_refused;  // the disk tier's name when O_DIRECT was refused, else empty
};
// The (pages per call, page bytes) points each local tier is timed at, grouped by page size: 1
// and `layers` pages of a few sizes around the model's layer page (inside the CPU caches), then
// the large page sets of 64..1024-token pages over the layers (beyond them).
struct TierPlan {
  std::vector<std::pair<int64_t, int64_t>> points;
};
TierPlan PlanTiers(const CalibrateOptions& o, const Model& model);
// Samples of each timing of a tier point moving `call_bytes` a call (after a warm-up call): a
// call of milliseconds is timed once.
int SamplesFor(const CalibrateOptions& o, int64_t call_bytes);
// The bytes a cold timing cycles through: at least 1.5 times the last-level cache.
int64_t WorkingSetBytes(const CalibrateOptions& o);
// The bytes a warm timing cycles through: twice the core's own cache (L2), so that no page read
// is still there, as a page read back some time after it was written is not, and at most half
// the last-level cache, so that every one is still in that. A warm timing that rereads one
// page set in a loop times the core's own cache instead: `kvl bench frontier` read a 128 KiB
// RAM-tier page at 4.9 GB/s where such a loop had priced 8.8 GB/s. Unknown sizes (0) are taken
// as 2 MiB and 32 MiB.
int64_t WarmSetBytes(int64_t core_cache_bytes, int64_t last_level_cache_bytes);
// How many of a cold timing's `groups` groups of keys a warm timing of `call_bytes` a call
// cycles through: enough for warm_set_bytes, at least 1, at most `groups`.
int64_t WarmGroups(int64_t call_bytes, int64_t warm_set_bytes, int64_t groups);
// The tiers' write and read curves (calibration_tiers.cc), with scratch files in o.disk_dir;
// TierStageSteps steps of `stage`.
int64_t TierStageSteps(const CalibrateOptions& o, const Model& model);
// One tier that is already open (a Redis server: calibration cannot reach one on its own), timed
// as MeasureTiers times each kind: Put and Get of 1 and `layers` pages, at 4 KiB and at
// `page_bytes`, and of 64 times `page_bytes` (at most 32 MiB a call), on keys 1.. (erased after).
// The tier must accept pages of any size.
StatusOr<TierCurves> MeasureOneTier(KvTier& tier, int64_t page_bytes, int64_t layers,
                                    const CalibrateOptions& o, StageProgress& stage);
StatusOr<TierMeasurement> MeasureTiers(const Model& model, const CalibrateOptions& o,
                                       StageProgress& stage);
// int8 and int4 page encoding curves; CompressStageSteps steps of `stage`.
int64_t CompressStageSteps(const CalibrateOptions& o);
std::pair<TransferCurve, TransferCurve> MeasureCompress(const Model& model,
                                                        const CalibrateOptions& o,
                                                        StageProgress& stage);

}  // namespace kvl::calibration_internal
