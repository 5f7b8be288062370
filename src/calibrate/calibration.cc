// Calibrate: the measurements in the order they run (matmul, recompute, memory, disk, tiers,
// compress, quality), the compute and memory ones here (recompute curves in
// calibration_recompute.cc, tiers and compress in calibration_tiers.cc, the raw disk test in
// calibration_disk.cc, quality in kv_quality.cc), and the timing helpers they share.
#include "kvl/calibration.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <tuple>

#include "calibration_internal.h"
#include "kvl/kv_quality.h"
#include "kvl/kv_tier.h"  // ParseByteSize
#include "kvl/machine_load.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"

namespace kvl {
namespace calibration_internal {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> values) {
  KVL_CHECK(!values.empty());
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

double Percentile(std::vector<double> values, double p) {
  KVL_CHECK(!values.empty() && p >= 0 && p <= 100);
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least p% of the sample at or below it.
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t index = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return values[std::min(index, values.size() - 1)];
}

namespace {
thread_local SampleSpreadLog* open_spread_log = nullptr;
}  // namespace

SampleSpreadLog::SampleSpreadLog() : outer_(open_spread_log) { open_spread_log = this; }
SampleSpreadLog::~SampleSpreadLog() { open_spread_log = outer_; }

void SampleSpreadLog::Record(const std::vector<double>& samples) {
  if (open_spread_log == nullptr || samples.size() < 3) return;
  open_spread_log->spreads_.push_back(SampleSpread(samples));
}

namespace {
thread_local const std::atomic<bool>* open_stop_flag = nullptr;
}  // namespace

StopScope::StopScope(const std::atomic<bool>* flag) : outer_(open_stop_flag) {
  open_stop_flag = flag;
}
StopScope::~StopScope() { open_stop_flag = outer_; }

bool StopRequested() {
  return open_stop_flag != nullptr && open_stop_flag->load(std::memory_order_relaxed);
}

double SampleSpreadLog::MedianSpread() const {
  return spreads_.empty() ? 0.0 : Median(spreads_);
}

StageProgress::StageProgress(const CalibrationProgress& progress, std::string_view stage,
                             int64_t total_steps)
    : progress_(progress), stage_(stage), total_steps_(std::max<int64_t>(1, total_steps)) {
  if (progress_) progress_(stage_, 0.0);
}

void StageProgress::Step() {
  done_steps_ = std::min(done_steps_ + 1, total_steps_);
  // Exactly 1.0 is left to Finish, so a stage reports completion once.
  const double fraction = std::min(0.999, static_cast<double>(done_steps_) / total_steps_);
  if (progress_) progress_(stage_, fraction);
}

void StageProgress::Finish() {
  done_steps_ = total_steps_;
  if (progress_) progress_(stage_, 1.0);
}

CalibrateOptions ResolveDefaults(const CalibrateOptions& in) {
  CalibrateOptions o = in;
  if (o.memory_bytes <= 0) o.memory_bytes = 256 * kMiB;
  if (o.disk_bytes <= 0) o.disk_bytes = (o.quick ? 64 : 256) * kMiB;
  if (o.random_reads <= 0) o.random_reads = o.quick ? 500 : 2000;
  if (o.repetitions <= 0) o.repetitions = o.quick ? 3 : 7;
  if (o.disk_repetitions <= 0) o.disk_repetitions = o.quick ? 2 : 3;
  if (o.min_sample_seconds <= 0) o.min_sample_seconds = o.quick ? 0.01 : 0.05;
  if (o.curve_seconds <= 0) o.curve_seconds = o.quick ? 1.0 : 20.0;
  return o;
}

std::string UtcTimestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

CalibrationModel DescribeModel(const Model& model) {
  const ModelConfig& c = model.config();
  CalibrationModel m;
  m.name = c.name;
  m.dim = c.dim;
  m.layers = c.num_layers;
  m.heads = c.num_heads;
  m.kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.ffn_dim = c.ffn_dim;
  m.weight_type = model.weight_type_name();
  m.kv_bytes_per_token_per_layer_f32 = c.KvBytesPerTokenPerLayer(DType::kF32);
  m.residual_bytes_per_token_per_layer_f32 = c.ResidualBytesPerTokenPerLayer(DType::kF32);
  return m;
}

int ContextThreads(const ops::OpsContext& ctx) {
  return ctx.pool() != nullptr ? ctx.pool()->num_threads() : 1;
}

MachineProfile NewProfile(const Model& model, const ops::OpsContext& ctx, std::string_view source) {
  MachineProfile p;
  p.version = kProfileVersion;
  p.source = std::string(source);
  p.timestamp = UtcTimestamp();
  p.cpu_features = ops::CpuFeatureString();
  p.isa = std::string(ops::IsaName(ctx.isa()));
  p.threads = ContextThreads(ctx);
  p.cache_bytes = LastLevelCacheBytes();
  p.model = DescribeModel(model);
  return p;
}

double KvProjectionFlopsPerToken(const ModelConfig& c) {
  return 2.0 * 2.0 * static_cast<double>(c.kv_dim()) * static_cast<double>(c.dim);
}

double LayerFlopsPerToken(const ModelConfig& c) {
  const double d = static_cast<double>(c.dim);
  // Wq, Wo; Wk, Wv; gate, up, down (of each expert a token runs, and the router, in an MoE model).
  const double ffns = c.is_moe() ? static_cast<double>(c.moe.num_experts_used) : 1.0;
  const double router = c.is_moe() ? d * static_cast<double>(c.moe.num_experts) : 0.0;
  return 2.0 * (2.0 * d * static_cast<double>(c.q_dim()) + 2.0 * d * static_cast<double>(c.kv_dim()) +
                ffns * 3.0 * d * static_cast<double>(c.ffn_dim) + router);
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

}  // namespace calibration_internal

namespace {

using calibration_internal::RandomFloats;

using calibration_internal::kMatmulTokenCounts;
using calibration_internal::MedianSecondsPerCall;
using calibration_internal::StageProgress;

bool IsQuantized(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }

// Matrices sharing one input, as the forward pass runs them: one MatMulGroup when their formats
// allow it, else one MatMul each.
void MatMulShared(ops::OpsContext& ctx, std::initializer_list<const MatrixView*> ws, const float* x,
                  int64_t n, std::initializer_list<float*> ys) {
  MatrixView views[ops::kMaxGroup];
  float* outs[ops::kMaxGroup];
  size_t count = 0;
  bool same_class = true;
  for (const MatrixView* w : ws) {
    views[count] = *w;
    same_class = same_class && IsQuantized(w->type) == IsQuantized(views[0].type);
    ++count;
  }
  count = 0;
  for (float* y : ys) outs[count++] = y;
  if (same_class) {
    ops::MatMulGroup(ctx, std::span<const MatrixView>(views, count), x, n,
                     std::span<float* const>(outs, count));
  } else {
    for (size_t m = 0; m < count; ++m) ops::MatMul(ctx, views[m], x, n, outs[m]);
  }
}

// 1. GFLOP/s of the K+V projections and of a whole layer's projections, on layer 0's weights.
std::vector<MatmulRate> MeasureMatmul(const Model& model, ops::OpsContext& ctx,
                                      const CalibrateOptions& o,
                                      const CalibrationProgress& progress) {
  const ModelConfig& c = model.config();
  const int64_t max_tokens = kMatmulTokenCounts[std::size(kMatmulTokenCounts) - 1];
  const int64_t max_cols = std::max({c.dim, c.q_dim(), c.ffn_dim});
  auto rows = [](int64_t n, int64_t width) { return static_cast<size_t>(n * width); };
  // Any input works for timing; a normal sample keeps the quantizer on its usual path.
  const std::vector<float> x = RandomFloats(rows(max_tokens, max_cols), 1);
  std::vector<float> q(rows(max_tokens, c.q_dim())), k(rows(max_tokens, c.kv_dim())),
      v(rows(max_tokens, c.kv_dim())), out(rows(max_tokens, c.dim)),
      gate(rows(max_tokens, c.ffn_dim)), up(rows(max_tokens, c.ffn_dim)),
      router_logits(rows(max_tokens, c.moe.num_experts));

  StageProgress stage(progress, "matmul",
                      2 * static_cast<int64_t>(std::size(kMatmulTokenCounts)) * o.repetitions);
  // Each call takes the next layer's weights, as a pass over the model does: one layer's weights
  // used again and again would sit in cache and overstate the rate at small n_tokens, where
  // streaming the weights from memory is the real cost. (Every llama layer has the same shapes.)
  int64_t next_layer = 0;
  auto layer = [&]() -> const LayerWeights& {
    const LayerWeights& w = model.layer(next_layer);
    next_layer = (next_layer + 1) % c.num_layers;
    return w;
  };
  std::vector<MatmulRate> rates;
  for (int64_t n : kMatmulTokenCounts) {
    MatmulRate rate;
    rate.n_tokens = n;
    const double kv_seconds = MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
      const LayerWeights& lw = layer();
      MatMulShared(ctx, {&lw.wk, &lw.wv}, x.data(), n, {k.data(), v.data()});
    });
    const double tokens = static_cast<double>(n);
    rate.kv_proj_gflops = calibration_internal::KvProjectionFlopsPerToken(c) * tokens / kv_seconds / 1e9;
    const double layer_seconds =
        MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
          const LayerWeights& lw = layer();
          MatMulShared(ctx, {&lw.wq, &lw.wk, &lw.wv}, x.data(), n, {q.data(), k.data(), v.data()});
          ops::MatMul(ctx, lw.wo, x.data(), n, out.data());
          if (!c.is_moe()) {
            MatMulShared(ctx, {&lw.w_gate, &lw.w_up}, x.data(), n, {gate.data(), up.data()});
            ops::MatMul(ctx, lw.w_down, x.data(), n, out.data());
            return;
          }
          // An MoE layer: the router, then top-k experts over the n rows (as if every token chose
          // the same ones; a prefill's rows spread over more experts, each over fewer rows).
          ops::MatMul(ctx, lw.router, x.data(), n, router_logits.data());
          for (int64_t e = 0; e < c.moe.num_experts_used; ++e) {
            const MatrixView g = lw.gate_exps.Expert(e), u = lw.up_exps.Expert(e);
            MatMulShared(ctx, {&g, &u}, x.data(), n, {gate.data(), up.data()});
            ops::MatMul(ctx, lw.down_exps.Expert(e), x.data(), n, out.data());
          }
        });
    rate.layer_gflops = calibration_internal::LayerFlopsPerToken(c) * tokens / layer_seconds / 1e9;
    rates.push_back(rate);
  }
  stage.Finish();
  return rates;
}

// Sum of n words with eight independent accumulators: the compiler vectorizes it, and the
// independent chains keep enough loads in flight to be bound by memory, not by add latency.
uint64_t SumWords(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += p[i + static_cast<size_t>(j)];
  }
  for (; i < n; ++i) a[0] += p[i];
  uint64_t sum = 0;
  for (uint64_t x : a) sum += x;
  return sum;
}

// 2. Read (sum) and copy (memcpy) bandwidth over memory_bytes, split across the pool.
std::pair<double, double> MeasureMemory(ThreadPool& pool, const CalibrateOptions& o,
                                        const CalibrationProgress& progress) {
  StageProgress stage(progress, "memory", 2 * o.repetitions);
  const size_t words = static_cast<size_t>(o.memory_bytes) / sizeof(uint64_t);
  // Filled (so every page is mapped and resident) before anything is timed.
  std::vector<uint64_t> src(words, 0x0123456789abcdefull);
  std::vector<uint64_t> dst(words, 0);
  const int64_t num_tasks = 4 * pool.num_threads();  // a few per thread for balance
  const size_t chunk =
      (words + static_cast<size_t>(num_tasks) - 1) / static_cast<size_t>(num_tasks);
  std::vector<uint64_t> partial(static_cast<size_t>(num_tasks));
  volatile uint64_t sink = 0;

  const double read_seconds = MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
    pool.ParallelFor(num_tasks, [&](int64_t task, int) {
      const size_t begin = std::min(words, static_cast<size_t>(task) * chunk);
      const size_t end = std::min(words, begin + chunk);
      partial[static_cast<size_t>(task)] = SumWords(src.data() + begin, end - begin);
    });
    uint64_t total = 0;
    for (uint64_t p : partial) total += p;
    sink = sink + total;
  });
  const double copy_seconds = MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
    pool.ParallelFor(num_tasks, [&](int64_t task, int) {
      const size_t begin = std::min(words, static_cast<size_t>(task) * chunk);
      const size_t end = std::min(words, begin + chunk);
      std::memcpy(dst.data() + begin, src.data() + begin, (end - begin) * sizeof(uint64_t));
    });
  });
  sink = sink + dst[words / 2];
  stage.Finish();
  const double bytes = static_cast<double>(words * sizeof(uint64_t));
  return {bytes / read_seconds / 1e9, bytes / copy_seconds / 1e9};
}

// How many tokens of the built-in text the KLD is measured on: all of them, or in a quick
// calibration as many as fit its curve budget (the text runs three times: f32, int8, int4),
// at most 8 pages. At most one page means none: the KLDs stay the named defaults.
int64_t QualityTokens(const Model& model, const CalibrateOptions& o, const MatmulRate& rate) {
  const int64_t available = static_cast<int64_t>(o.quality_tokens.size());
  if (!o.quick) return available;
  const ModelConfig& c = model.config();
  const double seconds_per_token = static_cast<double>(c.num_layers) *
                                   calibration_internal::LayerFlopsPerToken(c) /
                                   (rate.layer_gflops * 1e9);
  const int64_t affordable = static_cast<int64_t>(o.curve_seconds / (3 * seconds_per_token));
  const int64_t tokens = std::min({available, affordable, 8 * kCalibrationPageTokens});
  return tokens > kCalibrationPageTokens ? tokens : 0;
}

}  // namespace

CalibrateOptions QuickCalibrateOptions() {
  CalibrateOptions o;
  o.quick = true;
  o.memory_bytes = 32 * calibration_internal::kMiB;
  o.disk_bytes = 16 * calibration_internal::kMiB;
  o.random_reads = 100;
  return o;
}

int64_t LastLevelCacheBytes() {
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", index);
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;  // "32768K"
    if (!(level_file >> level) || !(size_file >> size) || level <= best_level) continue;
    const StatusOr<int64_t> bytes = ParseByteSize(size);
    best_level = level;
    best_bytes = bytes.ok() ? *bytes : 0;
  }
  if (best_bytes > 0) return best_bytes;
  const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l3 > 0 ? l3 : l2 > 0 ? l2 : 0;
}

StatusOr<MachineProfile> Calibrate(const Model& model, ops::OpsContext& model_ctx,
                                   const CalibrateOptions& options,
                                   const CalibrationProgress& progress) {
  KVL_CHECK_MSG(model_ctx.pool() != nullptr, "Calibrate: the ops context needs a thread pool");
  if (options.memory_bytes < 0 || options.disk_bytes < 0 || options.random_reads < 0 ||
      options.repetitions < 0 || options.disk_repetitions < 0 ||
      !(options.min_sample_seconds >= 0) || !(options.curve_seconds >= 0)) {
    return InvalidArgumentError("calibrate: sizes, counts and times must not be negative");
  }
  CalibrateOptions o = calibration_internal::ResolveDefaults(options);
  KVL_ASSIGN_OR_RETURN(o.disk_dir, calibration_internal::ResolveDiskDir(o.disk_dir));
  const ModelConfig& c = model.config();
  ThreadPool& pool = *model_ctx.pool();

  MachineProfile p = calibration_internal::NewProfile(model, model_ctx, kProfileSourceMeasured);
  double load[1] = {0};
  if (::getloadavg(load, 1) == 1 && std::isfinite(load[0]) && load[0] >= 0)
    p.load_average = load[0];
  // How busy the rest of the machine was while this ran, and how steady the samples came out
  // (MeasuredUnderLoad judges the two).
  const std::optional<CpuTicks> ticks_at_start = ReadCpuTicks();
  calibration_internal::SampleSpreadLog spreads;
  const calibration_internal::StopScope stop_scope(o.stop);
  // Checked between stages: a stopped calibration returns what nobody will read no sooner.
  auto stopped = [] {
    return calibration_internal::StopRequested()
               ? CancelledError("calibration stopped before it finished")
               : Status::Ok();
  };

  // A context of its own on the caller's pool: its scratch holds the 128-token batches measured
  // here, and the caller's stays sized for the caller's batches.
  ops::OpsContext ctx(model_ctx.isa(), &pool);
  ctx.Reserve(kMatmulTokenCounts[std::size(kMatmulTokenCounts) - 1],
              std::max({c.dim, c.q_dim(), c.ffn_dim}));

  p.matmul = MeasureMatmul(model, ctx, o, progress);
  KVL_RETURN_IF_ERROR(stopped());

  KVL_ASSIGN_OR_RETURN(const calibration_internal::RecomputeCurves recompute,
                       calibration_internal::MeasureRecomputeCurves(model, pool, ctx, o, p.matmul,
                                                                    progress));
  p.recompute_from_residual = recompute.from_residual;
  p.recompute_from_tokens = recompute.from_tokens;
  // Whole forward runs, not the matmuls alone: a decode step also pays attention, norms and the
  // step's fixed costs for its one token, which is what recompute can hide behind.
  p.decode_idle = recompute.decode_idle;
  KVL_RETURN_IF_ERROR(stopped());

  const auto [read_gbps, copy_gbps] = MeasureMemory(pool, o, progress);
  p.memory_bytes = static_cast<int64_t>(static_cast<size_t>(o.memory_bytes) / sizeof(uint64_t) *
                                        sizeof(uint64_t));
  p.memory_read_gbps = read_gbps;
  p.memory_copy_gbps = copy_gbps;
  KVL_RETURN_IF_ERROR(stopped());

  StageProgress disk_stage(progress, "disk", o.disk_repetitions + 1);
  calibration_internal::DiskTestOptions disk_options;
  disk_options.dir = o.disk_dir;
  disk_options.bytes = o.disk_bytes;
  disk_options.random_reads = o.random_reads;
  disk_options.repetitions = o.disk_repetitions;
  KVL_ASSIGN_OR_RETURN(calibration_internal::DiskMeasurement disk,
                       calibration_internal::MeasureDisk(disk_options, disk_stage));
  disk_stage.Finish();
  p.disk_dir = disk.dir;
  p.disk_bytes = disk.bytes;
  p.disk_write_gbps = disk.write_gbps;
  p.disk_read_gbps = disk.read_gbps;
  p.disk_read_direct = disk.read_direct;
  p.disk_random_read_direct = disk.random_read_direct;
  p.disk_random_read_median_us = disk.random_read_median_us;
  p.disk_random_read_p99_us = disk.random_read_p99_us;
  KVL_RETURN_IF_ERROR(stopped());

  StageProgress tier_stage(progress, "tiers", calibration_internal::TierStageSteps(o, model));
  KVL_ASSIGN_OR_RETURN(const calibration_internal::TierMeasurement tiers,
                       calibration_internal::MeasureTiers(model, o, tier_stage));
  tier_stage.Finish();
  p.ram = tiers.ram;
  p.ram_zstd = tiers.ram_zstd;
  p.disk_buffered = tiers.disk_buffered;
  p.disk_direct_measured = tiers.direct_refused.empty();
  p.disk_direct = p.disk_direct_measured ? tiers.disk_direct : tiers.disk_buffered;
  KVL_RETURN_IF_ERROR(stopped());

  StageProgress compress_stage(progress, "compress", calibration_internal::CompressStageSteps(o));
  std::tie(p.compress_int8, p.compress_int4) = calibration_internal::MeasureCompress(model, o, compress_stage);
  compress_stage.Finish();
  KVL_RETURN_IF_ERROR(stopped());

  // The KLD needs the caller's tokens of the built-in text; without them it stays a named default.
  const int64_t quality_tokens = QualityTokens(model, o, p.matmul.back());
  if (quality_tokens > kCalibrationPageTokens) {
    StageProgress quality_stage(progress, "quality", 1);
    const std::vector<std::vector<int32_t>> texts = {std::vector<int32_t>(
        o.quality_tokens.begin(), o.quality_tokens.begin() + quality_tokens)};
    KvQualityVariant int8, int4;
    int8.page_codec = KvCodecType::kInt8;
    int4.page_codec = KvCodecType::kInt4;
    const KvQualityVariant variants[] = {int8, int4};
    StatusOr<std::vector<KvQualityMeasurement>> q =
        MeasureKvQuality(model, ctx, texts, variants, KvQualityRows::kAfterFirstPage);
    KVL_RETURN_IF_ERROR(q.status());
    p.int8_kld = (*q)[0].mean_kld;
    p.int4_kld = (*q)[1].mean_kld;
    p.kld_tokens = quality_tokens;
    quality_stage.Finish();
  }
  KVL_RETURN_IF_ERROR(stopped());
  const std::optional<CpuTicks> ticks_at_end = ReadCpuTicks();
  if (ticks_at_start && ticks_at_end) p.others_cpu_share = OthersCpuShare(*ticks_at_start, *ticks_at_end);
  p.sample_spread = spreads.MedianSpread();
  return p;
}

}  // namespace kvl
