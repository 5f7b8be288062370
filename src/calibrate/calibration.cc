// Calibrate: the compute and memory measurements, in the order they run (matmul, recompute,
// memory; the disk test is in calibration_disk.cc), and the timing helpers they share.
#include "kvl/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <memory>
#include <random>

#include "calibration_internal.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
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

MachineProfile NewProfile(const Model& model, const ops::OpsContext& ctx, std::string_view source) {
  MachineProfile p;
  p.version = kProfileVersion;
  p.source = std::string(source);
  p.timestamp = UtcTimestamp();
  p.cpu_features = ops::CpuFeatureString();
  p.isa = std::string(ops::IsaName(ctx.isa()));
  p.threads = ctx.pool() != nullptr ? ctx.pool()->num_threads() : 1;
  p.model = DescribeModel(model);
  return p;
}

double KvProjectionFlopsPerToken(const ModelConfig& c) {
  return 2.0 * 2.0 * static_cast<double>(c.kv_dim()) * static_cast<double>(c.dim);
}

double LayerFlopsPerToken(const ModelConfig& c) {
  const double d = static_cast<double>(c.dim);
  // Wq, Wo; Wk, Wv; gate, up, down.
  return 2.0 * (2.0 * d * static_cast<double>(c.q_dim()) + 2.0 * d * static_cast<double>(c.kv_dim()) +
                3.0 * d * static_cast<double>(c.ffn_dim));
}

}  // namespace calibration_internal

namespace {

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

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
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
      gate(rows(max_tokens, c.ffn_dim)), up(rows(max_tokens, c.ffn_dim));

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
          MatMulShared(ctx, {&lw.w_gate, &lw.w_up}, x.data(), n, {gate.data(), up.data()});
          ops::MatMul(ctx, lw.w_down, x.data(), n, out.data());
        });
    rate.layer_gflops = calibration_internal::LayerFlopsPerToken(c) * tokens / layer_seconds / 1e9;
    rates.push_back(rate);
  }
  stage.Finish();
  return rates;
}

// 2. Milliseconds to recompute one page's K/V across all layers, from residual checkpoints and
// from tokens.
StatusOr<std::pair<double, double>> MeasureRecompute(const Model& model, ThreadPool& pool,
                                                     ops::OpsContext& ctx,
                                                     const CalibrateOptions& o,
                                                     const CalibrationProgress& progress) {
  const ModelConfig& c = model.config();
  constexpr int64_t T = kCalibrationPageTokens;
  const int64_t half = c.head_dim / 2;
  StageProgress stage(progress, "recompute", 2 * o.repetitions);

  // (a) From checkpoints: the stored input of every layer, [layer][token][dim]; the page's K and
  // V come out as [layer][token][kv_dim], as a page tier would store them.
  const std::vector<float> residual =
      RandomFloats(static_cast<size_t>(c.num_layers * T * c.dim), 2);
  std::vector<float> xn(static_cast<size_t>(T * c.dim));
  std::vector<float> page_k(static_cast<size_t>(c.num_layers * T * c.kv_dim()));
  std::vector<float> page_v(page_k.size());
  std::vector<float> rope_cos(static_cast<size_t>(T * half)), rope_sin(rope_cos.size());
  // theta_i = base^(-2i/d), once per model as the forward pass does.
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[static_cast<size_t>(i)] =
        std::pow(static_cast<double>(c.rope_freq_base),
                 -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
  }
  const double from_residual_seconds =
      MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
        // The angles are per page, so they count too.
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(t) * inv_freq[static_cast<size_t>(i)];
            rope_cos[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(angle));
            rope_sin[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(angle));
          }
        }
        for (int64_t l = 0; l < c.num_layers; ++l) {
          const LayerWeights& w = model.layer(l);
          for (int64_t t = 0; t < T; ++t) {
            ops::RmsNorm(ctx, &residual[static_cast<size_t>((l * T + t) * c.dim)], w.attn_norm,
                         c.dim, c.norm_eps, &xn[static_cast<size_t>(t * c.dim)]);
          }
          float* k = &page_k[static_cast<size_t>(l * T * c.kv_dim())];
          float* v = &page_v[static_cast<size_t>(l * T * c.kv_dim())];
          MatMulShared(ctx, {&w.wk, &w.wv}, xn.data(), T, {k, v});
          for (int64_t t = 0; t < T; ++t) {
            ops::Rope(ctx, k + t * c.kv_dim(), c.num_kv_heads, c.head_dim,
                      &rope_cos[static_cast<size_t>(t * half)],
                      &rope_sin[static_cast<size_t>(t * half)], c.rope_neox);
          }
        }
      });

  // (b) From tokens: a full forward pass of the page (no logits are needed to refill K/V).
  ForwardOptions fo;
  fo.max_batch_tokens = T;
  fo.max_logit_rows = 1;
  fo.max_context = T;
  ops::OpsContext forward_ctx(ctx.isa(), &pool);
  Forward forward(model, forward_ctx, fo);
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> cache,
                       ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, T));
  TokenBatch batch;
  for (int64_t t = 0; t < T; ++t) {
    batch.Add(static_cast<int32_t>((t * 7 + 1) % c.vocab_size), t, 0, false);
  }
  const double from_tokens_seconds = MedianSecondsPerCall(
      o.repetitions, o.min_sample_seconds, stage, [&] { forward.Run(batch, *cache); });
  stage.Finish();
  return std::make_pair(from_residual_seconds * 1e3, from_tokens_seconds * 1e3);
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

// 3. Read (sum) and copy (memcpy) bandwidth over memory_bytes, split across the pool.
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

}  // namespace

CalibrateOptions QuickCalibrateOptions() {
  CalibrateOptions o;
  o.quick = true;
  o.memory_bytes = 32 * calibration_internal::kMiB;
  o.disk_bytes = 16 * calibration_internal::kMiB;
  o.random_reads = 100;
  return o;
}

StatusOr<MachineProfile> Calibrate(const Model& model, ops::OpsContext& model_ctx,
                                   const CalibrateOptions& options,
                                   const CalibrationProgress& progress) {
  KVL_CHECK_MSG(model_ctx.pool() != nullptr, "Calibrate: the ops context needs a thread pool");
  if (options.memory_bytes < 0 || options.disk_bytes < 0 || options.random_reads < 0 ||
      options.repetitions < 0 || options.disk_repetitions < 0 ||
      !(options.min_sample_seconds >= 0)) {
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

  // A context of its own on the caller's pool: its scratch holds the 128-token batches measured
  // here, and the caller's stays sized for the caller's batches.
  ops::OpsContext ctx(model_ctx.isa(), &pool);
  ctx.Reserve(kMatmulTokenCounts[std::size(kMatmulTokenCounts) - 1],
              std::max({c.dim, c.q_dim(), c.ffn_dim}));

  p.matmul = MeasureMatmul(model, ctx, o, progress);

  KVL_ASSIGN_OR_RETURN(auto recompute, MeasureRecompute(model, pool, ctx, o, progress));
  p.recompute_page_tokens = kCalibrationPageTokens;
  p.recompute_from_residual_ms = recompute.first;
  p.recompute_from_tokens_ms = recompute.second;

  const auto [read_gbps, copy_gbps] = MeasureMemory(pool, o, progress);
  p.memory_bytes = static_cast<int64_t>(static_cast<size_t>(o.memory_bytes) / sizeof(uint64_t) *
                                        sizeof(uint64_t));
  p.memory_read_gbps = read_gbps;
  p.memory_copy_gbps = copy_gbps;

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
  return p;
}

}  // namespace kvl
