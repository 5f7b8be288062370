// The transfer and compress curves of calibration: the RAM (plain and zstd) and disk tiers
// written and read
// through their own code (kvl/kv_tier.h), and pages encoded with the project's codec
// (kvl/kv_codec.h).
//
// A KV page goes to a tier as one tier page per layer, all of them in one Put and read back in
// one Get (KvPager::WriteLayerPages / ReadLayerPages), so each point is `pages` tier pages of
// `page_bytes` in one call: 1 page and one per layer, at a few sizes around the model's own
// layer page. The disk tier is measured twice, as it can be opened: buffered (the default, where
// a page read moments after it was written comes from the page cache) and O_DIRECT (the device).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
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

std::vector<int64_t> PageSizes(const CalibrateOptions& o, int64_t model_page_bytes) {
  std::vector<int64_t> sizes = o.quick ? std::vector<int64_t>(std::begin(kQuickPageSizes),
                                                              std::end(kQuickPageSizes))
                                       : std::vector<int64_t>(std::begin(kFullPageSizes),
                                                              std::end(kFullPageSizes));
  sizes.push_back(model_page_bytes);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// 1 page per call and one per layer (what a KV page is); a full calibration adds a middle count.
std::vector<int64_t> PageCounts(const CalibrateOptions& o, int64_t num_layers) {
  std::vector<int64_t> counts = {1, num_layers};
  if (!o.quick) counts.push_back(std::max<int64_t>(1, num_layers / 2));
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

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

// Bytes a tier's timing cycles through: more than the CPU caches hold, so every call moves pages
// that are cold there, as a page restored long after it left is.
int64_t WorkingSetBytes(const CalibrateOptions& o) { return (o.quick ? 16 : 64) << 20; }

// Put and Get of `count` pages of `page_bytes` in one call each, on `tier`, each call on the next
// of a few groups of keys whose pages together outgrow the caches.
StatusOr<std::pair<double, double>> TimeTier(KvTier& tier, int64_t count, int64_t page_bytes,
                                             const CalibrateOptions& o, StageProgress& stage) {
  const int64_t call_bytes = count * page_bytes;
  const int64_t groups = std::clamp<int64_t>(WorkingSetBytes(o) / call_bytes, 1, 64);
  const std::vector<uint8_t> source = KvLikeBytes(groups * call_bytes);
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
  const double put_seconds = MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
    const Status s = tier.Put(writes[next]);
    next = (next + 1) % writes.size();
    if (!s.ok()) failed = s;
  });
  // Every group written (the warm-up and samples may not have reached them all).
  for (const std::vector<PageWrite>& w : writes) {
    if (const Status s = tier.Put(w); !s.ok()) failed = s;
  }
  next = 0;
  const double get_seconds = MedianSecondsPerCall(o.repetitions, o.min_sample_seconds, stage, [&] {
    for (const Status& s : tier.Get(reads[next])) {
      if (!s.ok()) failed = s;
    }
    next = (next + 1) % reads.size();
  });
  KVL_RETURN_IF_ERROR(failed);
  tier.Erase(keys);
  return std::make_pair(put_seconds * 1e3, get_seconds * 1e3);
}

// What a tier must hold for TimeTier: every group, and a Put's new copies beside the old ones
// (slots are the page, a 64-byte record, rounded up to 4 KiB).
int64_t TierCapacity(const CalibrateOptions& o, int64_t max_count, int64_t page_bytes) {
  return 2 * (WorkingSetBytes(o) + 64 * page_bytes + max_count * (page_bytes + 8192)) + (1 << 20);
}

// The curves of one kind of tier: `make` opens a tier for a page size.
template <typename MakeTier>
StatusOr<TierCurves> MeasureTierKind(const std::vector<int64_t>& sizes,
                                     const std::vector<int64_t>& counts, const CalibrateOptions& o,
                                     StageProgress& stage, MakeTier&& make) {
  std::vector<TransferPoint> writes, reads;
  for (int64_t size : sizes) {
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> tier, make(size, TierCapacity(o, counts.back(), size)));
    for (int64_t count : counts) {
      KVL_ASSIGN_OR_RETURN(const auto times, TimeTier(*tier, count, size, o, stage));
      writes.push_back({count, size, times.first});
      reads.push_back({count, size, times.second});
    }
  }
  return TierCurves{FitTransferCurve(std::move(writes)), FitTransferCurve(std::move(reads))};
}

}  // namespace

StatusOr<TierCurves> MeasureOneTier(KvTier& tier, int64_t page_bytes, int64_t layers,
                                    const CalibrateOptions& o, StageProgress& stage) {
  std::vector<TransferPoint> writes, reads;
  for (int64_t size : {std::min<int64_t>(4096, page_bytes), page_bytes}) {
    for (int64_t count : PageCounts(o, layers)) {
      KVL_ASSIGN_OR_RETURN(const auto times, TimeTier(tier, count, size, o, stage));
      writes.push_back({count, size, times.first});
      reads.push_back({count, size, times.second});
    }
  }
  return TierCurves{FitTransferCurve(std::move(writes)), FitTransferCurve(std::move(reads))};
}

int64_t TierStageSteps(const CalibrateOptions& o, const Model& model) {
  const ModelConfig& c = model.config();
  const int64_t points =
      static_cast<int64_t>(PageSizes(o, kCalibrationPageTokens * c.KvBytesPerTokenPerLayer(DType::kF32)).size() *
                           PageCounts(o, c.num_layers).size());
  return 4 * points * 2 * o.repetitions;
}

StatusOr<TierMeasurement> MeasureTiers(const Model& model, const CalibrateOptions& o,
                                       StageProgress& stage) {
  const ModelConfig& c = model.config();
  const std::vector<int64_t> sizes =
      PageSizes(o, kCalibrationPageTokens * c.KvBytesPerTokenPerLayer(DType::kF32));
  const std::vector<int64_t> counts = PageCounts(o, c.num_layers);
  TierMeasurement m;
  for (bool zstd : {false, true}) {
    KVL_ASSIGN_OR_RETURN((zstd ? m.ram_zstd : m.ram),
                         MeasureTierKind(sizes, counts, o, stage,
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
  KVL_ASSIGN_OR_RETURN(m.disk_buffered, MeasureTierKind(sizes, counts, o, stage, disk(false)));
  KVL_ASSIGN_OR_RETURN(m.disk_direct, MeasureTierKind(sizes, counts, o, stage, disk(true)));
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

}  // namespace kvl
