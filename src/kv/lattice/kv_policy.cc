#include "kvl/kv_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvl {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

std::string_view KvActionName(KvAction action) {
  switch (action) {
    case KvAction::kKeep: return "keep";
    case KvAction::kCompressInt8: return "compress-int8";
    case KvAction::kCompressInt4: return "compress-int4";
    case KvAction::kDemoteRam: return "demote-ram";
    case KvAction::kDemoteDisk: return "demote-disk";
    case KvAction::kRecomputeResidual: return "recompute-residual";
    case KvAction::kRecomputeTokens: return "recompute-tokens";
    case KvAction::kEvict: return "evict";
    case KvAction::kDemoteRedis: return "demote-redis";
  }
  return "?";
}

bool IsLossless(KvAction action) {
  return action != KvAction::kCompressInt8 && action != KvAction::kCompressInt4 &&
         action != KvAction::kEvict;
}

StatusOr<KvQuality> ParseKvQuality(std::string_view text) {
  if (text == "lossless" || text.empty()) return KvQuality::kLossless;  // empty: unset
  if (text == "balanced") return KvQuality::kBalanced;
  if (text == "aggressive") return KvQuality::kAggressive;
  return InvalidArgumentError(
      fmt::format("--kv-quality '{}': use lossless, balanced or aggressive", text));
}

std::string_view KvQualityName(KvQuality quality) {
  switch (quality) {
    case KvQuality::kLossless: return "lossless";
    case KvQuality::kBalanced: return "balanced";
    case KvQuality::kAggressive: return "aggressive";
  }
  return "?";
}

StatusOr<KvPolicyChoice> ParseKvPolicy(std::string_view text) {
  struct Name {
    std::string_view name;
    KvAction action;
  };
  static constexpr Name kNames[] = {
      {"keep", KvAction::kKeep},
      {"compress", KvAction::kCompressInt8},
      {"compress-int8", KvAction::kCompressInt8},
      {"compress-int4", KvAction::kCompressInt4},
      {"demote", KvAction::kDemoteRam},
      {"demote-ram", KvAction::kDemoteRam},
      {"demote-disk", KvAction::kDemoteDisk},
      {"demote-redis", KvAction::kDemoteRedis},
      {"recompute-residual", KvAction::kRecomputeResidual},
      {"recompute-tokens", KvAction::kRecomputeTokens},
      {"evict", KvAction::kEvict},
  };
  if (text == "auto") return KvPolicyChoice{true, KvAction::kKeep};
  for (const Name& n : kNames) {
    if (n.name == text) return KvPolicyChoice{false, n.action};
  }
  return InvalidArgumentError(fmt::format(
      "--kv-policy '{}': use auto, keep, compress, compress-int4, demote, demote-disk, "
      "demote-redis, recompute-residual, recompute-tokens or evict",
      text));
}

double TransferMs(double bytes, double gbps, double latency_ms) {
  // No bandwidth is no way to move the bytes (an unmeasured tier), not a free one.
  return gbps > 0 ? latency_ms + bytes / (gbps * 1e6) : std::numeric_limits<double>::infinity();
}

double RecomputeTokensMs(const PageCostProfile& p, int64_t first_position) {
  const double call_share =
      p.recompute_batch_tokens > 0 && p.block_tokens > 0
          ? std::min(1.0, static_cast<double>(p.block_tokens) /
                              static_cast<double>(p.recompute_batch_tokens))
          : 1.0;
  return p.recompute_tokens_ms +
         p.recompute_tokens_context_ms * static_cast<double>(std::max<int64_t>(0, first_position)) +
         p.recompute_tokens_call_ms * call_share;
}

double RecomputeTokenMs(const PageCostProfile& p, int64_t position) {
  if (p.block_tokens <= 0) return 0;
  return (p.recompute_tokens_ms +
          p.recompute_tokens_context_ms * static_cast<double>(std::max<int64_t>(0, position))) /
         static_cast<double>(p.block_tokens);
}

double InStepRebuildMs(const PageCostProfile& p, int64_t step_context) {
  const double row_ms = p.decode_idle.RebuildRowMsAt(step_context);
  if (row_ms < 0 || p.block_tokens <= 0) return -1;
  const double rows_ms = row_ms * static_cast<double>(p.block_tokens);
  return TransferMs(static_cast<double>(p.residual_bytes), p.ram_gbps, p.ram_latency_ms) +
         std::min(p.recompute_residual_ms, rows_ms);
}

double InStepRebuildCorrection(const BringBackFeedback* feedback) {
  if (feedback == nullptr) return 1.0;
  const size_t key = feedback->informed(kInStepRebuildFeedbackKey)
                         ? kInStepRebuildFeedbackKey
                         : static_cast<size_t>(KvAction::kRecomputeResidual);
  return feedback->Scale(key);
}

double DecodeIdlePoint::Fraction() const {
  return step_ms > 0 ? std::clamp(1.0 - batch_ms_per_token / step_ms, 0.0, 1.0) : 0.0;
}

double DecodeIdlePoint::RebuildRowMs() const {
  if (rebuild_rows <= 0 || step_with_rebuild_ms <= 0) return -1;
  return std::max(0.0, (step_with_rebuild_ms - step_ms) / static_cast<double>(rebuild_rows));
}

double DecodeIdleCurve::RebuildRowMsAt(int64_t context) const {
  if (num_points == 0) return -1;
  for (int i = 0; i < num_points; ++i) {
    if (points[static_cast<size_t>(i)].RebuildRowMs() < 0) return -1;
  }
  const DecodeIdlePoint& first = points[0];
  const DecodeIdlePoint& last = points[static_cast<size_t>(num_points - 1)];
  if (context <= first.context) return first.RebuildRowMs();
  if (context >= last.context) return last.RebuildRowMs();
  size_t hi = 1;
  while (points[hi].context < context) ++hi;
  const DecodeIdlePoint& a = points[hi - 1];
  const DecodeIdlePoint& b = points[hi];
  const double w = static_cast<double>(context - a.context) / static_cast<double>(b.context - a.context);
  return a.RebuildRowMs() + w * (b.RebuildRowMs() - a.RebuildRowMs());
}

bool DecodeIdleCurve::Add(const DecodeIdlePoint& point) {
  if (num_points == kMaxDecodeIdlePoints) return false;
  if (num_points > 0 && point.context <= points[static_cast<size_t>(num_points - 1)].context) {
    return false;
  }
  points[static_cast<size_t>(num_points++)] = point;
  return true;
}

DecodeIdlePoint DecodeIdleCurve::PointAt(int64_t context) const {
  DecodeIdlePoint at;
  at.context = context;
  if (num_points == 0) return at;
  const DecodeIdlePoint& first = points[0];
  const DecodeIdlePoint& last = points[static_cast<size_t>(num_points - 1)];
  const DecodeIdlePoint* a = &first;
  const DecodeIdlePoint* b = &first;
  double w = 0;
  if (context >= last.context) {
    a = b = &last;
  } else if (context > first.context) {
    size_t hi = 1;
    while (points[hi].context < context) ++hi;
    a = &points[hi - 1];
    b = &points[hi];
    w = static_cast<double>(context - a->context) / static_cast<double>(b->context - a->context);
  }
  at.step_ms = a->step_ms + w * (b->step_ms - a->step_ms);
  at.batch_ms_per_token =
      a->batch_ms_per_token + w * (b->batch_ms_per_token - a->batch_ms_per_token);
  return at;
}

double DecodeIdleCurve::FractionAt(int64_t context) const { return PointAt(context).Fraction(); }

DecodeIdleCurve DecodeIdleCurve::Flat(double fraction) {
  DecodeIdleCurve curve;
  curve.Add({0, 1.0, 1.0 - std::clamp(fraction, 0.0, 1.0)});
  return curve;
}

double KvQualityPrices::MsPerKld(KvQuality quality) const {
  switch (quality) {
    case KvQuality::kAggressive: return aggressive_ms_per_kld;
    case KvQuality::kBalanced:
    case KvQuality::kLossless: break;
  }
  return balanced_ms_per_kld;
}

double KvQualityPrices::MsPerEvictedMass(KvQuality quality) const {
  switch (quality) {
    case KvQuality::kAggressive: return aggressive_ms_per_evicted_mass;
    case KvQuality::kBalanced:
    case KvQuality::kLossless: break;
  }
  return balanced_ms_per_evicted_mass;
}

Status KvQualityPrices::Validate() const {
  struct Price {
    std::string_view flag;
    double value;
  };
  const Price prices[] = {
      {"--kv-price-kld-balanced", balanced_ms_per_kld},
      {"--kv-price-kld-aggressive", aggressive_ms_per_kld},
      {"--kv-price-evict-balanced", balanced_ms_per_evicted_mass},
      {"--kv-price-evict-aggressive", aggressive_ms_per_evicted_mass},
  };
  for (const Price& p : prices) {
    if (!std::isfinite(p.value) || p.value < 0) {
      return InvalidArgumentError(
          fmt::format("{} must be a finite price >= 0 (ms-equivalent), got {}", p.flag, p.value));
    }
  }
  // Aggressive accepts more loss than balanced: pricing a loss higher there would turn the
  // presets' meaning around.
  if (aggressive_ms_per_kld > balanced_ms_per_kld) {
    return InvalidArgumentError(fmt::format(
        "--kv-price-kld-aggressive ({}) is above --kv-price-kld-balanced ({}): aggressive must "
        "price a loss no higher than balanced",
        aggressive_ms_per_kld, balanced_ms_per_kld));
  }
  if (aggressive_ms_per_evicted_mass > balanced_ms_per_evicted_mass) {
    return InvalidArgumentError(fmt::format(
        "--kv-price-evict-aggressive ({}) is above --kv-price-evict-balanced ({}): aggressive "
        "must price a loss no higher than balanced",
        aggressive_ms_per_evicted_mass, balanced_ms_per_evicted_mass));
  }
  return Status::Ok();
}

std::string KvQualityPrices::Describe() const {
  return fmt::format(
      "quality prices (ms-equivalent): compressed page per nat of KL divergence: balanced {:g} "
      "(--kv-price-kld-balanced), aggressive {:g} (--kv-price-kld-aggressive); evicted page per "
      "unit of attention mass: balanced {:g} (--kv-price-evict-balanced), aggressive {:g} "
      "(--kv-price-evict-aggressive); lossless allows no loss",
      balanced_ms_per_kld, aggressive_ms_per_kld, balanced_ms_per_evicted_mass,
      aggressive_ms_per_evicted_mass);
}

double ReuseProbability(const KvReuseForecast& forecast) {
  // Expected reads from now on: a reader's steps left (at least one more read: certain), or an
  // idle page's revival probability. NaN is no read.
  return forecast.reads_left > 0 ? std::min(1.0, forecast.reads_left) : 0.0;
}

double ReuseProbability(const PageHistory& page) {
  if (page.is_sink || page.in_recent_window) return 1.0;
  return ReuseProbability(page.reuse);
}

KvDecision ChooseKvAction(const PageHistory& page, const PageCostProfile& p,
                          const KvPolicyOptions& o) {
  KvDecision d;
  const double reuse = ReuseProbability(page);
  const double ms_per_kld = o.quality_prices.MsPerKld(o.quality);
  const double ms_per_evicted_mass = o.quality_prices.MsPerEvictedMass(o.quality);
  const bool lossless_only = o.quality == KvQuality::kLossless;
  // A page of a running sequence kept as checkpoints is rebuilt inside each decode step that
  // reads it, as extra rows of the step's K and V matmuls: it costs the step what the calibration
  // measured those rows to add at the step's context, not a rebuild of its own. (With checkpoints
  // every s > 1 layers the rows also run the layers between, which this prices as K/V rows: an
  // underestimate.) A page recomputed from its tokens runs as a prefill chunk at resume: nothing
  // of it is hidden.
  const int64_t step_context =
      o.step_context >= 0 ? o.step_context : page.first_position + p.block_tokens;
  const double in_step_rebuild_ms =
      o.phase == Phase::kDecode ? InStepRebuildMs(p, step_context) : -1.0;
  const double kv = static_cast<double>(p.kv_bytes);
  const double residual = static_cast<double>(p.residual_bytes);
  const double ram_write_gbps = p.ram_write_gbps > 0 ? p.ram_write_gbps : p.ram_gbps;
  const double ram_write_latency_ms =
      p.ram_write_gbps > 0 ? p.ram_write_latency_ms : p.ram_latency_ms;
  const double disk_write_latency_ms =
      p.disk_write_latency_ms > 0 ? p.disk_write_latency_ms : p.disk_latency_ms;

  for (int i = 0; i < kNumKvActions; ++i) {
    KvActionCost& c = d.costs[static_cast<size_t>(i)];
    c.action = static_cast<KvAction>(i);
    c.allowed = true;
    c.reuse_probability = reuse;
    switch (c.action) {
      case KvAction::kKeep:
        c.resident_bytes = kv;
        break;
      case KvAction::kCompressInt8:
      case KvAction::kCompressInt4: {
        const bool int8 = c.action == KvAction::kCompressInt8;
        // f32 -> 8 or 4 bits, plus one f32 scale per group of 32 values, unless the real size
        // is known.
        const int64_t real = int8 ? p.int8_page_bytes : p.int4_page_bytes;
        c.resident_bytes = real > 0 ? static_cast<double>(real)
                                    : kv * ((int8 ? 8.0 : 4.0) / 32.0 + 1.0 / 32.0);
        const double encode_ms = int8 || p.compress_int4_ms <= 0 ? p.compress_ms : p.compress_int4_ms;
        c.now_ms = page.compressed ? 0.0 : encode_ms;
        c.quality_cost_ms = (int8 ? p.int8_kld : p.int4_kld) * ms_per_kld;
        break;
      }
      case KvAction::kDemoteRam:
        if (!p.has_ram_tier) c.why_not = "no RAM tier";
        c.now_ms = TransferMs(kv, ram_write_gbps, ram_write_latency_ms);
        c.bring_back_ms = TransferMs(kv, p.ram_gbps, p.ram_latency_ms);
        break;
      case KvAction::kDemoteDisk:
        if (!p.has_disk_tier) c.why_not = "no disk tier (--kv-tier disk:PATH:SIZE)";
        c.now_ms = TransferMs(kv, p.disk_write_gbps, disk_write_latency_ms);
        c.bring_back_ms = TransferMs(kv, p.disk_read_gbps, p.disk_latency_ms);
        break;
      case KvAction::kDemoteRedis:
        if (!p.has_redis_tier) c.why_not = "no redis tier (--kv-tier redis://HOST:PORT)";
        c.now_ms = TransferMs(kv, p.redis_write_gbps,
                              p.redis_write_latency_ms > 0 ? p.redis_write_latency_ms
                                                           : p.redis_latency_ms);
        c.bring_back_ms = TransferMs(kv, p.redis_read_gbps, p.redis_latency_ms);
        break;
      case KvAction::kRecomputeResidual:
        // The checkpoints live in the RAM tier, so bringing the page back moves them in and
        // rebuilds K,V. For GQA models they are larger than the K+V they stand for, which makes
        // this lose to plain demotion there; for MHA models it wins (HCache's finding).
        if (!p.has_ram_tier) c.why_not = "no RAM tier for the checkpoints";
        c.now_ms = TransferMs(residual, ram_write_gbps, ram_write_latency_ms);
        c.bring_back_ms = TransferMs(residual, p.ram_gbps, p.ram_latency_ms) + p.recompute_residual_ms;
        break;
      case KvAction::kRecomputeTokens:
        c.bring_back_ms = RecomputeTokensMs(p, page.first_position);
        break;
      case KvAction::kEvict:
        if (page.is_sink) c.why_not = "attention sink";
        if (page.in_recent_window) c.why_not = "recent window";
        // Gone for good: the loss is the attention the page would have received.
        c.quality_cost_ms = reuse * (0.01 + page.attention_mass) * ms_per_evicted_mass;
        break;
    }
    c.model_bring_back_ms = c.bring_back_ms;
    const double scale = CorrectionFor(
        o.feedback, c.action == KvAction::kDemoteRedis ? kRemoteTierFeedbackKey : static_cast<size_t>(i));
    c.bring_back_ms *= scale;
    if (c.action == KvAction::kRecomputeResidual && in_step_rebuild_ms >= 0) {
      // In decode the page rides in the step that reads it: it costs what it adds there,
      // corrected by what the engine measured of rebuilds in the step (StepRunner), the rest of a
      // rebuild of its own hidden.
      const double in_step_ms = in_step_rebuild_ms * InStepRebuildCorrection(o.feedback);
      c.hidden_ms =
          std::isfinite(c.bring_back_ms) ? std::max(0.0, c.bring_back_ms - in_step_ms) : 0.0;
    }
    if (lossless_only && !IsLossless(c.action)) c.why_not = "lossy (--kv-quality lossless)";
    if (!(p.available_actions & (1u << i))) c.why_not = "not available here";
    if (!c.why_not.empty()) c.allowed = false;
    c.memory_cost_ms = o.memory_price_ms_per_mib * c.resident_bytes / kMiB;
    c.total_ms =
        reuse * (c.bring_back_ms - c.hidden_ms) + c.now_ms + c.memory_cost_ms + c.quality_cost_ms;
  }

  // The cheapest allowed action; on a tie the lossless one, then the lower enum value (keep before
  // anything).
  double best = std::numeric_limits<double>::infinity();
  for (const KvActionCost& c : d.costs) {
    const bool lossless_tie =
        c.total_ms == best && IsLossless(c.action) && !IsLossless(d.action);
    if (c.allowed && (c.total_ms < best || lossless_tie)) {
      best = c.total_ms;
      d.action = c.action;
    }
  }
  return d;
}

std::string KvDecision::Explain() const {
  std::string out;
  for (const KvActionCost& c : costs) {
    // Where the engine's measurements corrected the profile's bring-back time, both are shown.
    const std::string model =
        c.model_bring_back_ms != c.bring_back_ms
            ? fmt::format(" (profile {:.3f}ms x {:.2f} measured)", c.model_bring_back_ms,
                          c.bring_back_ms / c.model_bring_back_ms)
            : std::string();
    out += fmt::format("{} {:<18} p_reuse={:.2f} back={:.3f}ms{} hidden={:.3f}ms now={:.3f}ms "
                       "resident={:.0f}B mem={:.3f}ms quality={:.3f}ms total={:.3f}ms{}\n",
                       c.action == action ? "*" : " ", KvActionName(c.action), c.reuse_probability,
                       c.bring_back_ms, model, c.hidden_ms, c.now_ms, c.resident_bytes, c.memory_cost_ms,
                       c.quality_cost_ms, c.total_ms, c.allowed ? "" : "  [not allowed: " + c.why_not + "]");
  }
  return out;
}

}  // namespace kvl
