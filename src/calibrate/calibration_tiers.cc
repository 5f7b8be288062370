// The transfer and compress curves of calibration: the RAM (plain and zstd) and disk tiers
// written and read through their own code (kvl/kv_tier.h), and pages encoded with the project's
// codec (kvl/kv_codec.h).
//
// A KV page goes to a tier as one tier page per layer, all of them in one Put and read back in
// one Get (the pager's tier mover: KvTierMover::WriteLayerPages / ReadIntoBlock), so each point
// is `pages` tier pages of `page_bytes` in one call: 1 page and one per layer, at a few sizes
// around the model's own layer page. The disk tier is measured twice, as it can be opened:
// buffered (the default, where a page read moments after it was written comes from the page
// cache) and O_DIRECT (the device).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "calibration_internal.h"
#include "kvl/kv_codec.h"
#include "kvl/kv_tier.h"

namespace kvl::calibration_internal {
namespace {

// Tier page sizes besides the model's own: a small one (latency shows) and a larger one
// (bandwidth shows); up to 1 MiB in a full calibration (a quick one stays a few seconds on a
// 1B model, where 22 pages of 1 MiB per call take long through zstd).
constexpr int64_t kQuickPageSizes[] = {4096, 64 << 10};
constexpr int64_t kFullPageSizes[] = {4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20};
// The page sets a restore and `kvl bench frontier` move: the model's layer page times these
// (64, 256 and 1024-token pages), one tier page per layer, in one call. Their bytes outgrow the
// CPU caches, where the small points above stay inside them: the curve's second bandwidth.
constexpr int64_t kLargePageMultiples[] = {4, 16, 64};
// The most bytes one large call moves; a page set beyond it is timed with fewer layers (the
// curve is per byte past its knee, so a part of the set shows its rate).
constexpr int64_t kQuickMaxCallBytes = 64 << 20;
constexpr int64_t kFullMaxCallBytes = 256 << 20;
// For a tier measured at engine start (Redis), which must stay under a second: the largest page
// set alone, at most 32 MiB a call.
constexpr int64_t kOneTierMaxCallBytes = 32 << 20;

// The model's layer page: kCalibrationPageTokens tokens of K and V at f32.
int64_t LayerPageBytes(const Model& model) {
  return kCalibrationPageTokens * model.config().KvBytesPerTokenPerLayer(DType::kF32);
}

// 1 page per call and one per layer (what a KV page is); a full calibration adds a middle count.
std::vector<int64_t> PageCounts(const CalibrateOptions& o, int64_t num_layers) {
  std::vector<int64_t> counts = {1, num_layers};
  if (!o.quick) counts.push_back(std::max<int64_t>(1, num_layers / 2));
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

// The large page sets: `multiples` of the layer page, `layers` of them a call, fewer where that
// passes max_call_bytes; only those larger than every small point.
void AddLargePoints(std::span<const int64_t> multiples, int64_t layer_page_bytes, int64_t layers,
                    int64_t max_call_bytes, TierPlan* plan) {
  int64_t small_max = 0;
  for (const auto& [count, size] : plan->points) small_max = std::max(small_max, count * size);
  for (int64_t m : multiples) {
    const int64_t size = m * layer_page_bytes;
    if (size > max_call_bytes) break;
    const int64_t count = std::clamp<int64_t>(max_call_bytes / size, 1, layers);
    if (count * size > small_max) plan->points.push_back({count, size});
  }
}

}  // namespace

TierPlan PlanTiers(const CalibrateOptions& o, const Model& model) {
  const int64_t layers = model.config().num_layers;
  const int64_t layer_page = LayerPageBytes(model);
  std::vector<int64_t> sizes = o.quick ? std::vector<int64_t>(std::begin(kQuickPageSizes),
                                                              std::end(kQuickPageSizes))
                                       : std::vector<int64_t>(std::begin(kFullPageSizes),
                                                              std::end(kFullPageSizes));
  sizes.push_back(layer_page);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  TierPlan plan;
  for (int64_t size : sizes) {
    for (int64_t count : PageCounts(o, layers)) plan.points.push_back({count, size});
  }
  AddLargePoints(kLargePageMultiples, layer_page, layers,
                 o.quick ? kQuickMaxCallBytes : kFullMaxCallBytes, &plan);
  return plan;
}

namespace {

// Bytes shaped like K/V: f32 samples of a normal distribution, so a compressing tier (zstd)
// finds what it finds in real pages (the exponents repeat, the mantissas do not).
std::vector<uint8_t> KvLikeBytes(int64_t n) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
    const float f = dist(rng);
    std::memcpy(&bytes[i], &f, sizeof(f));
  }
  return bytes;
}

// A call of this many bytes or more takes milliseconds on any tier: timed once after its
// warm-up, so that the large page sets keep a tier's measurement at engine start short.
constexpr int64_t kLongCallBytes = 4 << 20;
// At most this many groups of keys (below): 16 MiB of 4 KiB single-page calls, where a call's
// latency, not its bytes, is what the point shows.
constexpr int64_t kMaxGroups = 4096;
// For a tier measured at engine start (Redis), which must stay short: 64 groups (a few MiB of
// keys for a small model's pages). With kMaxGroups, writing 48 MiB of keys to a loopback Redis
// first made TinyLlama's measurement 2.6 s instead of 1.35 s (both beside a CI build).
constexpr int64_t kOneTierMaxGroups = 64;

}  // namespace

int SamplesFor(const CalibrateOptions& o, int64_t call_bytes) {
  return call_bytes >= kLongCallBytes ? 1 : o.repetitions;
}

int64_t WarmSetBytes(int64_t core_cache_bytes, int64_t last_level_cache_bytes) {
  const int64_t core = core_cache_bytes > 0 ? core_cache_bytes : int64_t{2} << 20;
  const int64_t last_level = last_level_cache_bytes > 0 ? last_level_cache_bytes : int64_t{32} << 20;
  return std::min(2 * core, last_level / 2);
}

int64_t WarmGroups(int64_t call_bytes, int64_t warm_set_bytes, int64_t groups) {
  KVL_CHECK(call_bytes > 0 && groups > 0);
  return std::clamp<int64_t>((warm_set_bytes + call_bytes - 1) / call_bytes, 1, groups);
}

int64_t WorkingSetBytes(const CalibrateOptions& o) {
  // Half as much again as the cache: a cycle through more than the cache holds misses it at
  // every call (the least recently used lines are the next ones read). The cache one core sees
  // is at most ~100 MiB on today's CPUs; a larger figure (a CPUID reading through a hypervisor)
  // is held at 128 MiB, so that a calibration never writes gigabytes of keys.
  static const int64_t cache_bytes = std::min<int64_t>(LastLevelCacheBytes(), 128 << 20);
  return std::max<int64_t>((o.quick ? 16 : 64) << 20, cache_bytes + cache_bytes / 2);
}

namespace {

// Groups of keys a call of `call_bytes` cycles through in the cold timings: together at least
// WorkingSetBytes, at most `max_groups` of them.
int64_t Groups(const CalibrateOptions& o, int64_t call_bytes, int64_t max_groups) {
  return std::clamp<int64_t>(WorkingSetBytes(o) / call_bytes, 1, max_groups);
}

struct TierTimes {
  double put_ms = 0;
  double get_ms = 0;       // cold
  double warm_get_ms = 0;  // the same pages again and again
};

// Put and Get of `count` pages of `page_bytes` in one call each, on `tier`. Cold: each call on
// the next of `groups` groups of keys, whose pages together outgrow the CPU caches (Groups), so
// every call moves pages the caches no longer hold, as a page restored long after it left. Warm:
// the first WarmGroups of them again and again, in the last-level cache but not the core's own. The source bytes come from `source`, at least
// groups * count * page_bytes of them (made once per stage: generating them takes longer than
// timing a large call).
StatusOr<TierTimes> TimeTier(KvTier& tier, int64_t count, int64_t page_bytes, int64_t groups,
                             std::span<const uint8_t> source, const CalibrateOptions& o,
                             StageProgress& stage) {
  const int64_t call_bytes = count * page_bytes;
  KVL_CHECK(static_cast<int64_t>(source.size()) >= groups * call_bytes);
  std::vector<uint8_t> sink(static_cast<size_t>(call_bytes));
  std::vector<std::vector<PageWrite>> writes(static_cast<size_t>(groups));
  std::vector<std::vector<PageRead>> reads(static_cast<size_t>(groups));
  std::vector<PageKey> keys;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < count; ++i) {
      const PageKey key = static_cast<PageKey>(g * count + i + 1);
      const size_t at = static_cast<size_t>((g * count + i) * page_bytes);
      writes[static_cast<size_t>(g)].push_back(
          {key, std::span<const uint8_t>(&source[at], static_cast<size_t>(page_bytes))});
      reads[static_cast<size_t>(g)].push_back(
          {key, std::span<uint8_t>(&sink[static_cast<size_t>(i * page_bytes)],
                                   static_cast<size_t>(page_bytes))});
      keys.push_back(key);
    }
  }
  Status failed;
  size_t next = 0;
  const int samples = SamplesFor(o, call_bytes);
  TierTimes times;
  times.put_ms = 1e3 * MedianSecondsPerCall(samples, o.min_sample_seconds, stage, [&] {
    const Status s = tier.Put(writes[next]);
    next = (next + 1) % writes.size();
    if (!s.ok()) failed = s;
  });
  // Every group written (the warm-up and samples may not have reached them all; one group has
  // been, by the warm-up).
  if (groups > 1) {
    for (const std::vector<PageWrite>& w : writes) {
      if (const Status s = tier.Put(w); !s.ok()) failed = s;
    }
  }
  auto get = [&](size_t group) {
    for (const Status& s : tier.Get(reads[group])) {
      if (!s.ok()) failed = s;
    }
  };
  next = 0;
  times.get_ms = 1e3 * MedianSecondsPerCall(samples, o.min_sample_seconds, stage, [&] {
    get(next);
    next = (next + 1) % reads.size();
  });
  // Warm: the pages are in the last-level cache but not in the reading core's own (WarmSetBytes).
  static const int64_t warm_set_bytes =
      WarmSetBytes(::sysconf(_SC_LEVEL2_CACHE_SIZE), LastLevelCacheBytes());
  const int64_t warm_groups = WarmGroups(call_bytes, warm_set_bytes, groups);
  next = 0;
  times.warm_get_ms = 1e3 * MedianSecondsPerCall(samples, o.min_sample_seconds, stage, [&] {
    get(next);
    next = (next + 1) % static_cast<size_t>(warm_groups);
  });
  KVL_RETURN_IF_ERROR(failed);
  tier.Erase(keys);
  return times;
}

// What a tier must hold for TimeTier of up to `max_count` pages of `page_bytes` a call: every
// group (the working set, or one call), and a Put's new copies beside the
// old ones, twice over; and each of those pages' slot overhead (a 64-byte record, rounded up to
// 4 KiB: under 8 KiB).
int64_t TierCapacity(const CalibrateOptions& o, int64_t max_count, int64_t page_bytes) {
  const int64_t max_call_bytes = max_count * page_bytes;
  const int64_t bytes = std::max(WorkingSetBytes(o), max_call_bytes) + 2 * max_call_bytes;
  const int64_t pages = bytes / page_bytes + 2 * max_count;
  return 2 * (bytes + pages * 8192) + (1 << 20);
}

// Source bytes for every point of a plan.
std::vector<uint8_t> SourceFor(const CalibrateOptions& o, const TierPlan& plan,
                               int64_t max_groups) {
  int64_t bytes = 0;
  for (const auto& [count, size] : plan.points) {
    bytes = std::max(bytes, Groups(o, count * size, max_groups) * count * size);
  }
  return KvLikeBytes(bytes);
}

// Times every point of `plan` on `tier_for(size)` (one tier per page size, opened for the
// largest call at that size) and fits the two curves.
template <typename TierFor>
StatusOr<TierCurves> MeasurePlan(const TierPlan& plan, int64_t max_groups,
                                 std::span<const uint8_t> source, const CalibrateOptions& o,
                                 StageProgress& stage, TierFor&& tier_for) {
  std::vector<TransferPoint> writes, reads, warm_reads;
  for (size_t i = 0; i < plan.points.size();) {
    const int64_t size = plan.points[i].second;
    size_t end = i;
    int64_t max_count = 0;
    while (end < plan.points.size() && plan.points[end].second == size) {
      max_count = std::max(max_count, plan.points[end++].first);
    }
    KVL_ASSIGN_OR_RETURN(KvTier * tier, tier_for(size, TierCapacity(o, max_count, size)));
    for (; i < end; ++i) {
      const int64_t count = plan.points[i].first;
      KVL_ASSIGN_OR_RETURN(const TierTimes times,
                           TimeTier(*tier, count, size, Groups(o, count * size, max_groups),
                                    source, o, stage));
      writes.push_back({count, size, times.put_ms});
      reads.push_back({count, size, times.get_ms});
      warm_reads.push_back({count, size, times.warm_get_ms});
    }
  }
  return TierCurves{FitTransferCurve(std::move(writes)), FitTransferCurve(std::move(reads)),
                    FitTransferCurve(std::move(warm_reads))};
}

// The curves of one kind of tier: `make` opens a tier for a page size and capacity.
template <typename MakeTier>
StatusOr<TierCurves> MeasureTierKind(const TierPlan& plan, std::span<const uint8_t> source,
                                     const CalibrateOptions& o, StageProgress& stage,
                                     MakeTier&& make) {
  std::unique_ptr<KvTier> tier;
  return MeasurePlan(plan, kMaxGroups, source, o, stage,
                     [&](int64_t size, int64_t capacity) -> StatusOr<KvTier*> {
                       tier.reset();  // the last size's file or memory first
                       KVL_ASSIGN_OR_RETURN(tier, make(size, capacity));
                       return tier.get();
                     });
}

}  // namespace

StatusOr<TierCurves> MeasureOneTier(KvTier& tier, int64_t page_bytes, int64_t layers,
                                    const CalibrateOptions& o, StageProgress& stage) {
  // 1 and `layers` pages of 4 KiB and of a layer page, and the largest page set.
  TierPlan plan;
  for (int64_t size : {std::min<int64_t>(4096, page_bytes), page_bytes}) {
    for (int64_t count : PageCounts(o, layers)) plan.points.push_back({count, size});
  }
  AddLargePoints(std::span<const int64_t>(kLargePageMultiples).last(1), page_bytes, layers,
                 kOneTierMaxCallBytes, &plan);
  const std::vector<uint8_t> source = SourceFor(o, plan, kOneTierMaxGroups);
  return MeasurePlan(plan, kOneTierMaxGroups, source, o, stage,
                     [&](int64_t, int64_t) -> StatusOr<KvTier*> { return &tier; });
}

int64_t TierStageSteps(const CalibrateOptions& o, const Model& model) {
  int64_t steps = 0;
  for (const auto& [count, size] : PlanTiers(o, model).points) steps += 3 * SamplesFor(o, count * size);
  return 4 * steps;
}

StatusOr<TierMeasurement> MeasureTiers(const Model& model, const CalibrateOptions& o,
                                       StageProgress& stage) {
  const TierPlan plan = PlanTiers(o, model);
  const std::vector<uint8_t> source = SourceFor(o, plan, kMaxGroups);
  TierMeasurement m;
  for (bool zstd : {false, true}) {
    KVL_ASSIGN_OR_RETURN((zstd ? m.ram_zstd : m.ram),
                         MeasureTierKind(plan, source, o, stage,
                                         [zstd](int64_t, int64_t capacity)
                                             -> StatusOr<std::unique_ptr<KvTier>> {
                                           RamTierOptions r;
                                           r.capacity_bytes = capacity;
                                           r.compress = zstd;
                                           return MakeRamTier(r);
                                         }));
  }
  const std::string path =
      (std::filesystem::path(o.disk_dir) / fmt::format("kvl-calibrate-tier-{}.tmp", ::getpid()))
          .string();
  auto disk = [&](bool direct) {
    return [&, direct](int64_t size, int64_t capacity) -> StatusOr<std::unique_ptr<KvTier>> {
      DiskTierOptions d;
      d.path = path;
      d.page_bytes = size;
      d.capacity_bytes = capacity;
      d.direct_io = direct;
      d.persistent = false;
      d.identity = "kvl calibrate";
      KVL_ASSIGN_OR_RETURN(std::unique_ptr<DiskKvTier> tier, MakeDiskTier(d));
      if (direct && tier->name() != "disk:direct") m.direct_refused = std::string(tier->name());
      return std::unique_ptr<KvTier>(std::move(tier));
    };
  };
  KVL_ASSIGN_OR_RETURN(m.disk_buffered, MeasureTierKind(plan, source, o, stage, disk(false)));
  KVL_ASSIGN_OR_RETURN(m.disk_direct, MeasureTierKind(plan, source, o, stage, disk(true)));
  return m;
}

int64_t CompressStageSteps(const CalibrateOptions& o) { return 2 * 3 * o.repetitions; }

std::pair<TransferCurve, TransferCurve> MeasureCompress(const Model& model,
                                                        const CalibrateOptions& o,
                                                        StageProgress& stage) {
  const ModelConfig& c = model.config();
  const int64_t kv_dim = c.kv_dim();
  // Points: a page of 16 tokens on one layer and on every layer, and a 4x longer page.
  const struct {
    int64_t tokens, layers;
  } shapes[] = {{kCalibrationPageTokens, 1},
                {kCalibrationPageTokens, c.num_layers},
                {4 * kCalibrationPageTokens, c.num_layers}};
  const int64_t max_values = 4 * kCalibrationPageTokens * c.num_layers * kv_dim;
  std::vector<float> k(static_cast<size_t>(max_values)), v(k.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = dist(rng);
    v[i] = dist(rng);
  }
  std::pair<TransferCurve, TransferCurve> curves;
  for (KvCodecType type : {KvCodecType::kInt8, KvCodecType::kInt4}) {
    std::vector<TransferPoint> points;
    for (const auto& s : shapes) {
      std::vector<uint8_t> out(
          static_cast<size_t>(CompressedPageBytes(type, s.tokens, s.layers, kv_dim)));
      const double seconds = MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
        EncodePage(type, k.data(), v.data(), s.tokens, s.layers, kv_dim, out.data());
      });
      const int64_t layer_bytes = 2 * s.tokens * kv_dim * static_cast<int64_t>(sizeof(float));
      points.push_back({s.layers, layer_bytes, seconds * 1e3});
    }
    (type == KvCodecType::kInt8 ? curves.first : curves.second) = FitTransferCurve(std::move(points));
  }
  return curves;
}

}  // namespace kvl::calibration_internal

namespace kvl {

StatusOr<TierCurves> MeasureTierCurves(KvTier& tier, int64_t page_bytes, int64_t layers,
                                       const CalibrateOptions& options) {
  if (page_bytes <= 0 || layers <= 0) {
    return InvalidArgumentError(fmt::format(
        "MeasureTierCurves: page_bytes {} and layers {} must be positive", page_bytes, layers));
  }
  const CalibrateOptions o = calibration_internal::ResolveDefaults(options);
  const CalibrationProgress none;
  calibration_internal::StageProgress stage(none, "tier", 1);
  return calibration_internal::MeasureOneTier(tier, page_bytes, layers, o, stage);
}

StatusOr<RemoteTierMeasurement> MeasureRemoteTier(KvTier& tier, int64_t page_bytes,
                                                  int64_t layers, const CalibrateOptions& options) {
  RemoteTierMeasurement m;
  KVL_ASSIGN_OR_RETURN(m.curves, MeasureTierCurves(tier, page_bytes, layers, options));
  // Keys past every key the curves used (their groups count from 1, fewer than 1 << 40).
  constexpr PageKey kFirstKey = PageKey{1} << 40;
  // Any bytes: a Redis server stores them as they are.
  std::vector<uint8_t> source(static_cast<size_t>(layers * page_bytes));
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<uint8_t> sink(source.size());
  std::vector<PageWrite> writes;
  std::vector<PageRead> reads;
  std::vector<PageKey> keys;
  for (int64_t l = 0; l < layers; ++l) {
    const size_t at = static_cast<size_t>(l * page_bytes);
    writes.push_back({kFirstKey + static_cast<PageKey>(l),
                      std::span<const uint8_t>(&source[at], static_cast<size_t>(page_bytes))});
    reads.push_back({kFirstKey + static_cast<PageKey>(l),
                     std::span<uint8_t>(&sink[at], static_cast<size_t>(page_bytes))});
    keys.push_back(kFirstKey + static_cast<PageKey>(l));
  }
  KVL_RETURN_IF_ERROR(tier.Put(writes));
  // About a second of reads at the curves' price, within [20, 100].
  const double expected_ms = std::max(1e-3, m.curves.read.Ms(layers, page_bytes));
  const int64_t samples = std::clamp<int64_t>(static_cast<int64_t>(1000.0 / expected_ms), 20, 100);
  std::vector<double> ms;
  Status failed;
  for (int64_t i = 0; i < samples; ++i) {
    const auto started = std::chrono::steady_clock::now();
    for (const Status& s : tier.Get(reads)) {
      if (!s.ok()) failed = s;
    }
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  }
  tier.Erase(keys);
  KVL_RETURN_IF_ERROR(failed);
  std::sort(ms.begin(), ms.end());
  m.page_reads = samples;
  m.page_read_median_ms = ms[ms.size() / 2];
  double sum = 0;
  for (double x : ms) sum += x;
  m.page_read_mean_ms = sum / static_cast<double>(ms.size());
  m.page_read_p99_ms = ms[std::min(ms.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(ms.size())))];
  return m;
}

}  // namespace kvl
