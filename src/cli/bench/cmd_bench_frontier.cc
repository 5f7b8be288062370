// kvl bench frontier: where recomputing a KV page beats bringing it back, measured with the
// engine's own code paths at every point of page tokens x depth x tier x phase, beside what the
// cost model predicts there.
//
// A point is one page of T tokens sitting after `position` tokens of context, whose first d
// layers are missing (depth d: layers [0, d)). The three ways to get its K/V back, each timed as
// the engine does it:
//   recompute-residual: the pager's restore of a checkpointed page (KvPager::RestorePages): the
//     d layer pages of residual checkpoints read from a RAM tier in one Get, then
//     Forward::RebuildLayerKv per layer for the T tokens;
//   recompute-tokens: Forward::Run of the T tokens at positions [position, position + T), so
//     attention reads the context before them; the first d layers end where layer d's input
//     checkpoint is written (timed inside the same run, see LayerClockCache);
//   transfer: the d layer pages of K then V rows (the pager's tier page format) read back from
//     the tier in one Get, as KvTierMover::ReadIntoBlock does at a restore.
// Phases: prefill is these times (the step's arithmetic is busy: nothing hides recompute).
// Decode: the page rides in a 1-token decode step after it, as the engine runs it, and costs the
// difference of the step's time with and without it, measured: recompute-residual as the
// checkpoint read plus the page's rows in the first d layers' K and V matmuls (KvLayerRebuild,
// handed over as the pager does), recompute-tokens as the page's tokens added to the step's
// batch (the whole run's difference, times the share of the run the prefill timing puts before
// depth d). A transfer costs the same in both phases. The idle fraction (1 - time per token of a
// 128-token Run / time of a 1-token Run) is still measured and reported, no longer charged;
// --position is clamped to the model's context less that 128-token run.
// This file measures and predicts; the tables, crossovers and JSON are bench_frontier_report.cc.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench_frontier.h"
#include "cli.h"
#include "kvl/cost_profile.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_tier.h"
#include "kvl/machine_load.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"

namespace kvl::cli {
namespace {

using frontier::FrontierReport;
using frontier::kNumWays;
using frontier::kPhases;
using frontier::kResidual;
using frontier::kTokens;
using frontier::kTransfer;
using frontier::Median;
using frontier::Point;
using frontier::Sweep;

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs `fn` (which returns one sample per named quantity, ms) up to `repetitions` times and
// returns the median of each. A first call warms caches and is dropped, unless it alone took
// over a second: then it counts, and a sweep of large pages stops after three samples (the
// spread of a seconds-long call is small next to the differences the bench looks for).
template <typename Fn>
std::vector<double> MedianSamples(int repetitions, Fn&& fn) {
  const double start = NowMs();
  std::vector<double> first = fn();
  std::vector<std::vector<double>> samples(first.size());
  const bool slow = NowMs() - start > 1000.0;
  if (slow) {
    for (size_t i = 0; i < first.size(); ++i) samples[i].push_back(first[i]);
  }
  const int wanted = slow ? std::min(repetitions, 3) : repetitions;
  while (static_cast<int>(samples[0].size()) < wanted) {
    const std::vector<double> s = fn();
    for (size_t i = 0; i < s.size(); ++i) samples[i].push_back(s[i]);
  }
  std::vector<double> medians;
  for (std::vector<double>& s : samples) medians.push_back(Median(std::move(s)));
  return medians;
}

// The median of `repetitions` samples of each of n timings, `fn(i)` taking one sample of timing
// i (ms), in rounds over i (after a first round that warms the caches and is dropped, unless a
// sample of it took over a second: then it counts, and that timing stops at three samples, as in
// MedianSamples). On a shared machine a noisy moment (another tenant streaming through the
// memory and the last-level cache: this VM's read bandwidth moved between 31 and 47 GB/s from one
// second to the next) then touches one sample of each timing, not every sample of one.
template <typename Fn>
std::vector<double> InterleavedMedians(size_t n, int repetitions, Fn&& fn) {
  std::vector<std::vector<double>> samples(n);
  std::vector<int> wanted(n, repetitions);
  for (size_t i = 0; i < n; ++i) {
    const double first = fn(i);
    if (first > 1000.0) {
      samples[i].push_back(first);
      wanted[i] = std::min(repetitions, 3);
    }
  }
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<int>(samples[i].size()) >= wanted[i]) continue;
      samples[i].push_back(fn(i));
      more = true;
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& s : samples) medians.push_back(Median(std::move(s)));
  return medians;
}

// A contiguous cache (with residual checkpoints) that notes when Forward::Run starts each layer:
// the run writes a layer's input checkpoints first thing in the layer, so the first ResidualAt of
// layer l marks the end of layers [0, l). One run of all layers thus times every depth.
class LayerClockCache final : public KvCache {
 public:
  explicit LayerClockCache(std::unique_ptr<ContiguousKvCache> inner)
      : inner_(std::move(inner)), layer_start_ms_(static_cast<size_t>(inner_->num_layers())) {}

  void StartRun() {
    next_layer_ = 0;
    run_start_ms_ = NowMs();
  }
  // Milliseconds from StartRun to the end of layer depth-1; the whole run for the last layer.
  double MsThrough(int64_t depth, double run_end_ms) const {
    const double end = depth < num_layers() ? layer_start_ms_[static_cast<size_t>(depth)]
                                            : run_end_ms;
    return end - run_start_ms_;
  }

  int64_t kv_dim() const override { return inner_->kv_dim(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override {
    return inner_->RowsAt(seq, layer, pos);
  }
  float* ResidualAt(int32_t seq, int64_t layer, int64_t pos) override {
    // Called from the run's own thread, token by token, before the layer computes anything.
    if (layer == next_layer_) {
      layer_start_ms_[static_cast<size_t>(layer)] = NowMs();
      ++next_layer_;
    }
    return inner_->ResidualAt(seq, layer, pos);
  }
  // Runs after this hand the page's rows to the forward pass at layers [0, depth), from their
  // checkpoints ([layer][rows][dim]), as the pager does for a page it rebuilds in the step; depth
  // 0: none.
  void SetRebuild(int64_t depth, int64_t rows, int64_t dim, const int64_t* positions,
                  const float* checkpoints, float* k_out, float* v_out) {
    rebuild_depth_ = depth;
    rebuild_dim_ = dim;
    rebuild_.rows = rows;
    rebuild_.positions = positions;
    rebuild_seqs_.assign(static_cast<size_t>(rows), 0);
    rebuild_.seq_ids = rebuild_seqs_.data();
    rebuild_.k_out = k_out;
    rebuild_.v_out = v_out;
    checkpoints_ = checkpoints;
  }
  KvLayerRebuild BeginLayer(int64_t layer) override {
    if (layer >= rebuild_depth_) return {};
    KvLayerRebuild r = rebuild_;
    r.input = checkpoints_ + layer * r.rows * rebuild_dim_;
    return r;
  }

 private:
  int64_t rebuild_depth_ = 0;
  int64_t rebuild_dim_ = 0;
  KvLayerRebuild rebuild_;
  std::vector<int32_t> rebuild_seqs_;
  const float* checkpoints_ = nullptr;
  std::unique_ptr<ContiguousKvCache> inner_;
  std::vector<double> layer_start_ms_;  // [layer]
  int64_t next_layer_ = 0;
  double run_start_ms_ = 0;
};

// One tier of --tiers, as given.
struct TierChoice {
  std::string label;  // "ram", "disk", "redis"
  std::string dir;    // disk: where its scratch file goes
  std::string redis;  // redis: the URL
};

StatusOr<std::vector<TierChoice>> ParseTierChoices(const std::vector<std::string>& specs) {
  std::vector<TierChoice> out;
  for (const std::string& s : specs) {
    if (s == "ram") {
      out.push_back({"ram", "", ""});
    } else if (s == "disk" || s.rfind("disk:", 0) == 0) {
      std::string dir = s.size() > 5 ? s.substr(5) : std::filesystem::temp_directory_path().string();
      std::error_code ec;
      if (!std::filesystem::is_directory(dir, ec)) {
        return InvalidArgumentError(fmt::format("--tiers {}: '{}' is not a directory", s, dir));
      }
      out.push_back({"disk", dir, ""});
    } else if (s.rfind("redis://", 0) == 0) {
      KVL_RETURN_IF_ERROR(ParseTierSpec(s).status());
      out.push_back({"redis", "", s});
    } else {
      return InvalidArgumentError(
          fmt::format("--tiers '{}': use ram, disk[:DIR] or redis://HOST[:PORT]", s));
    }
  }
  return out;
}

// The tier a choice names, for pages of `page_bytes` bytes (at least `pages` of them).
StatusOr<std::unique_ptr<KvTier>> OpenTier(const TierChoice& choice, int64_t page_bytes,
                                           int64_t pages) {
  if (choice.label == "ram") {
    RamTierOptions o;
    o.capacity_bytes = pages * page_bytes + (int64_t{1} << 20);
    return MakeRamTier(o);
  }
  if (choice.label == "disk") {
    DiskTierOptions o;
    o.path = (std::filesystem::path(choice.dir) /
              fmt::format("kvl-bench-frontier-{}-{}.pages", ::getpid(), page_bytes))
                 .string();
    // A slot is the page and a 64-byte record, rounded up to 4 KiB (kvl/kv_tier.h).
    o.capacity_bytes = pages * (page_bytes + 8192);
    o.page_bytes = page_bytes;
    o.direct_io = true;  // what the disk does, not the page cache
    o.persistent = false;
    o.identity = "kvl bench frontier";
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<DiskKvTier> disk, MakeDiskTier(o));
    return std::unique_ptr<KvTier>(std::move(disk));
  }
  KVL_ASSIGN_OR_RETURN(const TierSpec spec, ParseTierSpec(choice.redis));
  RedisTierOptions o;
  o.host = spec.host;
  o.port = spec.port;
  o.name_space = fmt::format("kvl-bench-frontier-{}", ::getpid());
  o.identity = "kvl bench frontier";
  o.page_bytes = page_bytes;
  // A large model's page set is hundreds of MiB in one pipeline: the engine's 1 s bound on a
  // read or write would fail the bench on a busy machine rather than time it.
  o.io_timeout_ms = 60000;
  return MakeRedisTier(o);
}

int ArgMin(const double* v) {
  int best = 0;
  for (int i = 1; i < kNumWays; ++i) {
    if (v[i] < v[best]) best = i;
  }
  return best;
}

// What the cost model says for this point, as the engine would price it: the profile's curves
// evaluated for a page of T tokens over d layers (FillPagePrices; the disk's O_DIRECT curves, as
// the bench's disk tier is opened), the page at --position (token recompute attends to the context
// before it, and its run is the page alone), and the bring-back time ChooseKvAction gives each
// action in this phase less what it hides in decode's idle arithmetic, as the measurement charges
// it. A Redis page is priced by the server's curves measured at the start, as the engine measures
// its Redis tier (MeasureTierCurves). The bench reads one page set again and again, so its
// working set is that set twice (the tier's copy and the buffer it is read into): warm where that
// fits the last-level cache (TierCurves::ReadFor), as the engine's is where weights and pool fit.
void Predict(const MachineProfile& profile, const ModelConfig& c, const std::string& tier,
             const TierCurves* remote, int64_t position, Point* point) {
  const int64_t layer_bytes = point->page_tokens * c.KvBytesPerTokenPerLayer(DType::kF32);
  PageCostProfile prices;
  prices.kv_bytes = point->depth * layer_bytes;
  prices.residual_bytes =
      point->depth * point->page_tokens * c.ResidualBytesPerTokenPerLayer(DType::kF32);
  PagePriceOptions price_options;
  price_options.block_tokens = point->page_tokens;
  price_options.layers = point->depth;
  price_options.disk_direct = true;
  price_options.page_bytes = prices.kv_bytes;
  price_options.working_set_bytes = 2 * prices.kv_bytes;
  FillPagePrices(profile, price_options, &prices);
  prices.has_ram_tier = true;
  prices.has_disk_tier = true;
  KvPolicyOptions options;
  options.quality = KvQuality::kLossless;
  options.phase = point->phase;
  // Decode's idle share where the bench measures it: a step after `position` tokens.
  options.step_context = position;
  PageHistory page;
  page.first_position = position;
  const KvDecision d = ChooseKvAction(page, prices, options);
  auto back = [&](KvAction a) {
    const KvActionCost& cost = d.costs[static_cast<size_t>(a)];
    return cost.bring_back_ms - cost.hidden_ms;
  };
  point->predicted[kResidual] = back(KvAction::kRecomputeResidual);
  point->predicted[kTokens] = back(KvAction::kRecomputeTokens);
  if (tier == "ram") {
    point->predicted[kTransfer] = back(KvAction::kDemoteRam);
  } else if (tier == "disk") {
    point->predicted[kTransfer] = back(KvAction::kDemoteDisk);
  } else {
    point->predicted[kTransfer] =
        remote != nullptr
            ? remote->ReadFor(price_options.working_set_bytes, profile.cache_bytes)
                  .Ms(point->depth, layer_bytes)
            : 0;
  }
  point->predicted_winner = ArgMin(point->predicted);
}

class FrontierBench {
 public:
  FrontierBench(const BenchFrontierArgs& args, const Model& model, ops::OpsContext& ctx,
                Sweep sweep, std::vector<TierChoice> tiers)
      : args_(args), model_(model), c_(model.config()), ctx_(ctx), tiers_(std::move(tiers)) {
    report_.model_path = args.model_path;
    report_.config = &c_;
    report_.weight_type = model.weight_type_name();
    report_.threads = ctx.pool()->num_threads();
    report_.position = args.position;
    report_.repetitions = args.repetitions;
    report_.sweep = std::move(sweep);
    for (const TierChoice& tier : tiers_) {
      report_.tier_labels.push_back(tier.label);
      if (tier.label == "redis") report_.redis_read = &remote_curves_.read;
    }
  }
  FrontierBench(const FrontierBench&) = delete;  // report_ points into remote_curves_
  FrontierBench& operator=(const FrontierBench&) = delete;

  Status Run(const MachineProfile& profile);
  // What was measured, for the tables and the JSON (bench_frontier_report.cc).
  const FrontierReport& report() const { return report_; }

 private:
  int64_t max_tokens() const { return report_.sweep.page_tokens.back(); }
  // Bytes of one layer page of T tokens: K rows then V rows, f32 (the pager's tier page).
  int64_t LayerPageBytes(int64_t t) const { return t * c_.KvBytesPerTokenPerLayer(DType::kF32); }
  void MeasureIdleFraction();
  Status MeasurePageSize(int64_t t, const MachineProfile& profile);

  const BenchFrontierArgs& args_;
  const Model& model_;
  const ModelConfig& c_;
  ops::OpsContext& ctx_;
  std::vector<TierChoice> tiers_;
  std::unique_ptr<Forward> forward_;
  std::unique_ptr<LayerClockCache> cache_;
  TierCurves remote_curves_;  // the Redis server's, measured at the start
  FrontierReport report_;     // what is measured, filled as it is
};

// The token batch of one page: T tokens at [position, position + T), no logits.
TokenBatch PageBatch(int64_t tokens, int64_t position, int64_t vocab) {
  TokenBatch batch;
  for (int64_t t = 0; t < tokens; ++t) {
    batch.Add(static_cast<int32_t>((t * 7 + 1) % vocab), position + t, 0, false);
  }
  return batch;
}

void FrontierBench::MeasureIdleFraction() {
  const TokenBatch one = PageBatch(1, args_.position, c_.vocab_size);
  const TokenBatch many = PageBatch(kIdlePrefillTokens, args_.position, c_.vocab_size);
  // A small model's step takes a fraction of a millisecond: one preemption in a single-call
  // sample moves it by more than the context does. Each sample runs steps for at least
  // kMinStepSampleMs and takes their mean, as calibration times its runs.
  constexpr double kMinStepSampleMs = 10;
  report_.decode_step_ms = MedianSamples(args_.repetitions, [&] {
                      const double t0 = NowMs();
                      int64_t steps = 0;
                      do {
                        forward_->Run(one, *cache_);
                        ++steps;
                      } while (NowMs() - t0 < kMinStepSampleMs);
                      return std::vector<double>{(NowMs() - t0) / static_cast<double>(steps)};
                    })[0];
  report_.prefill_token_ms = MedianSamples(args_.repetitions, [&] {
                        const double t0 = NowMs();
                        forward_->Run(many, *cache_);
                        return std::vector<double>{NowMs() - t0};
                      })[0] /
                      static_cast<double>(kIdlePrefillTokens);
  report_.idle_fraction = std::clamp(1.0 - report_.prefill_token_ms / report_.decode_step_ms, 0.0, 1.0);
}

Status FrontierBench::Run(const MachineProfile& profile) {
  ForwardOptions fo;
  // The largest page, and the decode step after it with the page's tokens in its batch.
  fo.max_batch_tokens = std::max<int64_t>(max_tokens() + 1, 128);
  fo.max_logit_rows = 1;
  // The decode step after the largest page: one more position.
  fo.max_context = args_.position + fo.max_batch_tokens + 1;
  fo.max_rebuild_rows = max_tokens();
  forward_ = std::make_unique<Forward>(model_, ctx_, fo);
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> inner,
                       ContiguousKvCache::Create(c_.num_layers, c_.kv_dim(), 1, fo.max_context,
                                                 c_.dim));
  cache_ = std::make_unique<LayerClockCache>(std::move(inner));
  fmt::print(stderr, "kvl bench frontier: measuring the idle compute of a decode step...\n");
  MeasureIdleFraction();
  for (const TierChoice& tier : tiers_) {
    if (tier.label != "redis") continue;
    // As the engine prices its Redis tier: the server measured through its own scratch scope.
    const int64_t page_bytes = LayerPageBytes(kCalibrationPageTokens);
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> scratch, OpenTier(tier, 0, 0));
    KVL_ASSIGN_OR_RETURN(remote_curves_, MeasureTierCurves(*scratch, page_bytes, c_.num_layers,
                                                           QuickCalibrateOptions()));
  }
  // How busy the rest of the machine was while the points were measured: a time taken while
  // others ran is not what a profile measured on a quiet machine predicts.
  const std::optional<CpuTicks> before = ReadCpuTicks();
  for (int64_t t : report_.sweep.page_tokens) KVL_RETURN_IF_ERROR(MeasurePageSize(t, profile));
  const std::optional<CpuTicks> after = ReadCpuTicks();
  if (before && after) {
    report_.others_cpu_share = OthersCpuShare(*before, *after);
    if (*report_.others_cpu_share > kBusyOthersCpuShare) {
      fmt::print(stderr,
                 "kvl bench frontier: warning: other processes took {:.0f}% of the CPU while "
                 "this measured: the times are a busy machine's\n",
                 100 * *report_.others_cpu_share);
    }
  }
  return Status::Ok();
}

Status FrontierBench::MeasurePageSize(int64_t t, const MachineProfile& profile) {
  const double started = NowMs();
  const int64_t layers = c_.num_layers;
  const size_t nd = report_.sweep.depths.size();

  // Recompute from tokens: one run of every layer, timed at each depth's layer boundary.
  const TokenBatch batch = PageBatch(t, args_.position, c_.vocab_size);
  const std::vector<double> tokens_ms = MedianSamples(args_.repetitions, [&] {
    cache_->StartRun();
    forward_->Run(batch, *cache_);
    const double end = NowMs();
    std::vector<double> s;
    for (int64_t d : report_.sweep.depths) s.push_back(cache_->MsThrough(d, end));
    return s;
  });

  // The page's checkpoints and K/V as that run left them: [layer][token][dim] and, per layer,
  // one tier page of K rows then V rows.
  const size_t dim = static_cast<size_t>(c_.dim), kv_dim = static_cast<size_t>(c_.kv_dim());
  const size_t tn = static_cast<size_t>(t);
  const int64_t checkpoint_page_bytes = t * c_.dim * static_cast<int64_t>(sizeof(float));
  const int64_t kv_page_bytes = LayerPageBytes(t);
  std::vector<uint8_t> checkpoints(static_cast<size_t>(layers * checkpoint_page_bytes));
  std::vector<uint8_t> kv_pages(static_cast<size_t>(layers * kv_page_bytes));
  for (int64_t l = 0; l < layers; ++l) {
    float* ck = reinterpret_cast<float*>(checkpoints.data()) + static_cast<size_t>(l) * tn * dim;
    float* kv = reinterpret_cast<float*>(kv_pages.data()) + static_cast<size_t>(l) * 2 * tn * kv_dim;
    for (int64_t i = 0; i < t; ++i) {
      std::memcpy(ck + static_cast<size_t>(i) * dim, cache_->ResidualAt(0, l, args_.position + i),
                  dim * sizeof(float));
    }
    const KvCache::Rows rows = cache_->RowsAt(0, l, args_.position);
    for (int64_t i = 0; i < t; ++i) {
      std::memcpy(kv + static_cast<size_t>(i) * kv_dim, rows.k + static_cast<size_t>(i * rows.stride),
                  kv_dim * sizeof(float));
      std::memcpy(kv + (tn + static_cast<size_t>(i)) * kv_dim,
                  rows.v + static_cast<size_t>(i * rows.stride), kv_dim * sizeof(float));
    }
  }
  auto layer_span = [](std::vector<uint8_t>& v, int64_t bytes, int64_t l) {
    return std::span<uint8_t>(v.data() + l * bytes, static_cast<size_t>(bytes));
  };
  auto put_all = [&](KvTier& tier, std::vector<uint8_t>& pages, int64_t bytes) {
    std::vector<PageWrite> writes;
    for (int64_t l = 0; l < layers; ++l) {
      writes.push_back({static_cast<PageKey>(l + 1), layer_span(pages, bytes, l), false});
    }
    return tier.Put(writes);
  };
  // One Get of the first d layer pages into `out`: the restore's read (KvTierMover::ReadIntoBlock).
  auto get_first = [&](KvTier& tier, std::vector<uint8_t>& out, int64_t bytes, int64_t d) {
    std::vector<PageRead> reads;
    for (int64_t l = 0; l < d; ++l) reads.push_back({static_cast<PageKey>(l + 1), layer_span(out, bytes, l)});
    for (const Status& s : tier.Get(reads)) KVL_RETURN_IF_ERROR(s);
    return Status::Ok();
  };

  // Recompute from residual checkpoints, kept in a RAM tier as the pager keeps them.
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> checkpoint_tier,
                       OpenTier({"ram", "", ""}, checkpoint_page_bytes, layers));
  KVL_RETURN_IF_ERROR(put_all(*checkpoint_tier, checkpoints, checkpoint_page_bytes));
  std::vector<uint8_t> stage(checkpoints.size());
  std::vector<float> k_out(static_cast<size_t>(layers) * tn * kv_dim), v_out(k_out.size());
  std::vector<int64_t> positions(tn);
  for (size_t i = 0; i < tn; ++i) positions[i] = args_.position + static_cast<int64_t>(i);
  std::vector<double> read_ms(nd), rebuild_ms(nd);
  Status read_status;
  for (size_t di = 0; di < nd; ++di) {
    const int64_t d = report_.sweep.depths[di];
    const std::vector<double> m = MedianSamples(args_.repetitions, [&] {
      const double t0 = NowMs();
      const Status s = get_first(*checkpoint_tier, stage, checkpoint_page_bytes, d);
      if (!s.ok()) read_status = s;
      const double t1 = NowMs();
      for (int64_t l = 0; l < d; ++l) {
        forward_->RebuildLayerKv(l, reinterpret_cast<const float*>(stage.data() + l * checkpoint_page_bytes),
                                 positions.data(), t, DType::kF32,
                                 k_out.data() + static_cast<size_t>(l) * tn * kv_dim, DType::kF32,
                                 v_out.data() + static_cast<size_t>(l) * tn * kv_dim);
      }
      const double t2 = NowMs();
      return std::vector<double>{t1 - t0, t2 - t1};
    });
    KVL_RETURN_IF_ERROR(read_status);
    read_ms[di] = m[0];
    rebuild_ms[di] = m[1];
  }
  // The rebuilt rows must be the ones the run stored (lossless: bit-exact), or the timing is of
  // the wrong work.
  const int64_t rebuilt_layers = report_.sweep.depths.back();
  for (int64_t l = 0; l < rebuilt_layers; ++l) {
    const float* kv = reinterpret_cast<const float*>(kv_pages.data()) + static_cast<size_t>(l) * 2 * tn * kv_dim;
    const size_t n = tn * kv_dim;
    report_.rebuilt_bit_exact = report_.rebuilt_bit_exact &&
                         std::memcmp(kv, k_out.data() + static_cast<size_t>(l) * n, n * sizeof(float)) == 0 &&
                         std::memcmp(kv + n, v_out.data() + static_cast<size_t>(l) * n, n * sizeof(float)) == 0;
  }
  checkpoint_tier.reset();

  // Decode: the page rides in a 1-token step after it. Each sample runs steps for at least
  // kMinStepSampleMs (a small model's step is a fraction of a millisecond) and takes the mean.
  constexpr double kMinStepSampleMs = 10;
  const TokenBatch step = PageBatch(1, args_.position + t, c_.vocab_size);
  TokenBatch step_with_page = PageBatch(t, args_.position, c_.vocab_size);
  step_with_page.Add(step.tokens[0], args_.position + t, 0, false);
  auto mean_step_ms = [&](const TokenBatch& b) {
    const double t0 = NowMs();
    int64_t steps = 0;
    do {
      forward_->Run(b, *cache_);
      ++steps;
    } while (NowMs() - t0 < kMinStepSampleMs);
    return (NowMs() - t0) / static_cast<double>(steps);
  };
  // [depth]: the rebuild's share of the step, then the tokens' (whole run) last.
  const std::vector<double> in_step_ms = MedianSamples(args_.repetitions, [&] {
    cache_->SetRebuild(0, 0, 0, nullptr, nullptr, nullptr, nullptr);
    const double alone = mean_step_ms(step);
    std::vector<double> s;
    for (int64_t d : report_.sweep.depths) {
      cache_->SetRebuild(d, t, c_.dim, positions.data(),
                         reinterpret_cast<const float*>(checkpoints.data()), k_out.data(),
                         v_out.data());
      s.push_back(std::max(0.0, mean_step_ms(step) - alone));
    }
    cache_->SetRebuild(0, 0, 0, nullptr, nullptr, nullptr, nullptr);
    s.push_back(std::max(0.0, mean_step_ms(step_with_page) - alone));
    return s;
  });

  // Transfer back from each tier.
  std::vector<uint8_t> read_back(kv_pages.size());
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> tier, OpenTier(tiers_[ti], kv_page_bytes, layers));
    if (report_.tier_names.size() <= ti) report_.tier_names.push_back(std::string(tier->name()));
    KVL_RETURN_IF_ERROR(put_all(*tier, kv_pages, kv_page_bytes));
    const std::vector<double> transfer_ms =
        InterleavedMedians(nd, args_.repetitions, [&](size_t di) {
          const double t0 = NowMs();
          const Status s = get_first(*tier, read_back, kv_page_bytes, report_.sweep.depths[di]);
          if (!s.ok()) read_status = s;
          return NowMs() - t0;
        });
    KVL_RETURN_IF_ERROR(read_status);
    // Every read put its layers' pages at the same place, and the deepest read them all.
    const int64_t deepest = report_.sweep.depths.back();
    if (std::memcmp(read_back.data(), kv_pages.data(),
                    static_cast<size_t>(deepest * kv_page_bytes)) != 0) {
      return DataLossError(fmt::format("tier {} read back other bytes than were put",
                                       tier->name()));
    }
    for (size_t di = 0; di < nd; ++di) {
      const int64_t d = report_.sweep.depths[di];
      for (Phase phase : kPhases) {
        Point p;
        p.tier = tiers_[ti].label;
        p.phase = phase;
        p.page_tokens = t;
        p.depth = d;
        // Decode: what the page adds to the step it rides in (see the top).
        const bool decode = phase == Phase::kDecode;
        const double run_share = tokens_ms[di] / tokens_ms[nd - 1];
        p.measured[kResidual] = read_ms[di] + (decode ? in_step_ms[di] : rebuild_ms[di]);
        p.measured[kTokens] = decode ? in_step_ms[nd] * run_share : tokens_ms[di];
        p.measured[kTransfer] = transfer_ms[di];
        p.residual_read_ms = read_ms[di];
        p.rebuild_ms = rebuild_ms[di];
        p.winner = ArgMin(p.measured);
        Predict(profile, c_, p.tier, tiers_[ti].label == "redis" ? &remote_curves_ : nullptr,
                args_.position, &p);
        report_.points.push_back(p);
      }
    }
    std::vector<PageKey> keys;
    for (int64_t l = 0; l < layers; ++l) keys.push_back(static_cast<PageKey>(l + 1));
    tier->Erase(keys);  // a Redis server keeps nothing of the bench
  }
  fmt::print(stderr, "kvl bench frontier: {}-token pages measured in {:.1f} s\n", t,
             (NowMs() - started) / 1e3);
  return Status::Ok();
}

}  // namespace

int BenchFrontierCommand(const BenchFrontierArgs& args) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kvl bench frontier: {}\n", s.ToString());
    return 1;
  };
  StatusOr<std::vector<TierChoice>> tiers = ParseTierChoices(args.tiers);
  if (!tiers.ok()) return fail(tiers.status());
  // Every tier is opened once before anything is measured, so an unreachable server or an
  // unusable directory fails at once rather than after minutes of recompute timings.
  for (const TierChoice& choice : *tiers) {
    if (StatusOr<std::unique_ptr<KvTier>> probe = OpenTier(choice, 4096, 1); !probe.ok()) {
      return fail(probe.status());
    }
  }
  StatusOr<std::unique_ptr<Model>> model = Model::Load(args.model_path);
  if (!model.ok()) return fail(model.status());
  const ModelConfig& c = (*model)->config();
  // The decode step and its 128-token run sit at --position: both must fit the model's context
  // (positions past it are not what the model runs, nor what its profile measured).
  BenchFrontierArgs clamped = args;
  const int64_t max_position = std::max<int64_t>(0, c.context_length - kIdlePrefillTokens);
  if (c.context_length > 0 && clamped.position > max_position) {
    fmt::print(stderr,
               "kvl bench frontier: --position {} is past the model's context of {} tokens less "
               "the {}-token run of the idle fraction: clamped to {}\n",
               clamped.position, c.context_length, kIdlePrefillTokens, max_position);
    clamped.position = max_position;
  }

  Sweep sweep;
  sweep.page_tokens = args.page_tokens;
  std::sort(sweep.page_tokens.begin(), sweep.page_tokens.end());
  sweep.page_tokens.erase(std::unique(sweep.page_tokens.begin(), sweep.page_tokens.end()),
                          sweep.page_tokens.end());
  sweep.depths = args.depths;
  if (sweep.depths.empty()) {
    // One layer, a quarter, half and all of them.
    sweep.depths = {1, std::max<int64_t>(1, c.num_layers / 4), std::max<int64_t>(1, c.num_layers / 2),
                    c.num_layers};
  }
  std::sort(sweep.depths.begin(), sweep.depths.end());
  sweep.depths.erase(std::unique(sweep.depths.begin(), sweep.depths.end()), sweep.depths.end());
  if (sweep.depths.back() > c.num_layers) {
    return fail(InvalidArgumentError(fmt::format("--depths {}: the model has {} layers",
                                                 sweep.depths.back(), c.num_layers)));
  }
  // A page's tokens sit at [position, position + T). Past the model's context they are positions
  // the engine never runs for this model; they are still timed (how a cost scales with the page's
  // size is the sweep's point), and the output says which.
  if (c.context_length > 0 && clamped.position + sweep.page_tokens.back() > c.context_length) {
    fmt::print(stderr,
               "kvl bench frontier: note: pages of more than {} tokens after --position {} run "
               "past the model's context of {} tokens (timed all the same: positions this model "
               "never serves)\n",
               std::max<int64_t>(0, c.context_length - clamped.position), clamped.position,
               c.context_length);
  }

  const int threads = ThreadsOrEveryCore(args.num_threads);
  StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(threads);
  if (!pool.ok()) return fail(pool.status());
  ops::OpsContext ctx(ops::BestIsa(), pool->get());

  // The profile the engine would price this model with, found, measured or assumed as it would.
  ProfileOptions profile_options;
  profile_options.path = args.profile_path;
  profile_options.calibrate = args.calibrate;
  StatusOr<MachineProfile> profile = ObtainProfile(**model, ctx, profile_options);
  if (!profile.ok()) return fail(profile.status());

  FrontierBench bench(clamped, **model, ctx, sweep, std::move(*tiers));
  if (const Status s = bench.Run(*profile); !s.ok()) return fail(s);
  const FrontierReport& report = bench.report();
  const nlohmann::json j = frontier::FrontierJson(report, *profile);
  if (args.output == "json") {
    fmt::print("{}\n", j.dump(1));
  } else {
    frontier::PrintFrontierTables(report, *profile);
  }
  if (!args.json_path.empty()) {
    std::ofstream f(args.json_path);
    f << j.dump(1) << "\n";
    if (!f) return fail(IoError(fmt::format("cannot write {}", args.json_path)));
  }
  return 0;
}

}  // namespace kvl::cli
