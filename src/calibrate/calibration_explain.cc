// ExplainProfile: every input of the cost model with its value and where it came from, so that
// no number the policy prices with is a constant passed off as a measurement.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "kvl/calibration.h"

namespace kvl {
namespace {

std::string Describe(const RecomputeCurve& c) {
  return fmt::format("{:.4f} + {:.4f}*layers + {:.3e}*tokens*layers + "
                     "{:.3e}*tokens*(position+(tokens+1)/2)*layers ms",
                     c.call_ms, c.layer_ms, c.token_layer_ms, c.context_token_layer_ms);
}

// Bytes in MiB, KiB or bytes, whichever reads best.
std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  if (b >= 1024) return fmt::format("{:.0f} KiB", static_cast<double>(b) / 1024);
  return fmt::format("{} B", b);
}

std::string Describe(const TransferCurve& c) {
  const std::string gbps =
      c.gbps > 0 ? fmt::format("{:.2f}", c.gbps) : std::string("(unmeasurable)");
  if (c.knee_bytes <= 0) {
    return fmt::format("{:.4f} ms/call + {:.4f} ms/page + bytes at {} GB/s", c.call_ms, c.page_ms,
                       gbps);
  }
  return fmt::format("{:.4f} ms/call + {:.4f} ms/page + bytes at {} GB/s up to {} per call, "
                     "at {:.2f} GB/s beyond",
                     c.call_ms, c.page_ms, gbps, Bytes(c.knee_bytes), c.large_gbps);
}

// "fitted to 12 points: tokens 16..4096, layers 1..22, positions 0..1024".
std::string PointsOf(const RecomputeCurve& c) {
  if (c.points.empty()) return "";
  int64_t t0 = INT64_MAX, t1 = 0, l0 = INT64_MAX, l1 = 0, p0 = INT64_MAX, p1 = 0;
  for (const RecomputePoint& p : c.points) {
    t0 = std::min(t0, p.tokens), t1 = std::max(t1, p.tokens);
    l0 = std::min(l0, p.layers), l1 = std::max(l1, p.layers);
    p0 = std::min(p0, p.position), p1 = std::max(p1, p.position);
  }
  return fmt::format("fitted to {} points: tokens {}..{}, layers {}..{}, positions {}..{}",
                     c.points.size(), t0, t1, l0, l1, p0, p1);
}

std::string PointsOf(const TransferCurve& c) {
  if (c.points.empty()) return "";
  int64_t n0 = INT64_MAX, n1 = 0, b0 = INT64_MAX, b1 = 0, c0 = INT64_MAX, c1 = 0;
  for (const TransferPoint& p : c.points) {
    n0 = std::min(n0, p.pages), n1 = std::max(n1, p.pages);
    b0 = std::min(b0, p.page_bytes), b1 = std::max(b1, p.page_bytes);
    c0 = std::min(c0, p.pages * p.page_bytes), c1 = std::max(c1, p.pages * p.page_bytes);
  }
  return fmt::format("fitted to {} points: {}..{} pages of {}..{} bytes per call ({}..{} per "
                     "call){}",
                     c.points.size(), n0, n1, b0, b1, Bytes(c0), Bytes(c1),
                     c.knee_bytes > 0 ? "; the second bandwidth is the best of a knee at each "
                                        "measured call size"
                                      : "; one bandwidth (no knee fitted better)");
}

}  // namespace

bool MeasuredUnderLoad(const MachineProfile& p) {
  return p.source == kProfileSourceMeasured &&
         (p.others_cpu_share > kBusyOthersCpuShare || p.sample_spread > kBusySampleSpread);
}

std::string LoadDescription(const MachineProfile& p) {
  return fmt::format("other processes took {:.0f}% of the CPU, samples spread {:.0f}%",
                     100 * p.others_cpu_share, 100 * p.sample_spread);
}

std::string ExplainProfile(const MachineProfile& p) {
  const bool measured = p.source == kProfileSourceMeasured;
  // Where a measured profile's number came from, or the assumption of an analytic one.
  auto how = [&](const std::string& measured_how) {
    return measured ? "measured: " + measured_how
                    : std::string("default: assumed from the model's FLOPs and a modest machine "
                                  "(no calibration ran; `kvl calibrate` measures it)");
  };
  std::string out;
  auto line = [&](std::string_view input, const std::string& value, const std::string& source) {
    out += fmt::format("  {:<28} {}\n  {:<28}   {}\n", input, value, "", source);
  };
  out += fmt::format("cost model inputs ({} profile, {}):\n", p.source, p.timestamp);
  if (measured) {
    line("machine load while measured", LoadDescription(p),
         MeasuredUnderLoad(p)
             ? fmt::format("busy (above {:.0f}% or {:.0f}%): the rates below are slow for a quiet "
                           "machine; measured again when a run finds it quiet",
                           100 * kBusyOthersCpuShare, 100 * kBusySampleSpread)
             : std::string("quiet enough: /proc/stat less this process, and the timed samples"));
  }
  std::string idle_values, idle_timings;
  const DecodeIdleCurve& idle = p.decode_idle;
  for (int i = 0; i < idle.num_points; ++i) {
    const DecodeIdlePoint& d = idle.points[static_cast<size_t>(i)];
    idle_values += fmt::format("{}{:.3f} at {}", i > 0 ? ", " : "", d.Fraction(), d.context);
    idle_timings += fmt::format("{}{:.3f}/{:.3f} ms at {}", i > 0 ? ", " : "",
                                d.batch_ms_per_token, d.step_ms, d.context);
  }
  line("decode idle fraction",
       idle.num_points > 0 ? idle_values + " tokens of context" : std::string("0"),
       !measured || idle.num_points == 0
           ? std::string("default: 0 (no calibration ran); reported only, no price uses it")
           : fmt::format("reported only, no price uses it (a rebuild in decode is priced by the "
                         "line below); measured: 1 - Forward::Run ms per token of a {}-token "
                         "batch / ms of a "
                         "1-token step, both after that context ({}); between the contexts both "
                         "timings are interpolated linearly, beyond them held",
                         kIdlePrefillTokens, idle_timings));
  std::string rebuild_values, rebuild_timings;
  for (int i = 0; i < idle.num_points; ++i) {
    const DecodeIdlePoint& d = idle.points[static_cast<size_t>(i)];
    rebuild_values += fmt::format("{}{:.4f} ms at {}", i > 0 ? ", " : "", d.RebuildRowMs(), d.context);
    rebuild_timings += fmt::format("{}{:.3f} -> {:.3f} ms with {} rows at {}", i > 0 ? ", " : "",
                                   d.step_ms, d.step_with_rebuild_ms, d.rebuild_rows, d.context);
  }
  const bool rebuild_measured = idle.RebuildRowMsAt(0) >= 0;
  line("rebuilt row in a decode step",
       rebuild_measured ? rebuild_values + " tokens of context" : std::string("not measured"),
       !rebuild_measured
           ? std::string("not measured (no calibration ran, or an older profile): a page rebuilt "
                         "from checkpoints in decode is priced as a rebuild of its own")
           : fmt::format("measured: a 1-token Forward::Run with and without {} rows of pages "
                         "rebuilt from checkpoints riding in it (KvLayerRebuild), the difference "
                         "per row ({}); a page's price in decode is its rows' share",
                         kStepRebuildRows, rebuild_timings));
  line("recompute from residual", Describe(p.recompute_from_residual),
       how("Forward::RebuildLayerKv (a restore's rebuild, on its own) per layer, " +
           PointsOf(p.recompute_from_residual)));
  line("recompute from tokens", Describe(p.recompute_from_tokens),
       how("Forward::Run of the page's tokens after `position` tokens of context, " +
           PointsOf(p.recompute_from_tokens)));
  struct Tier {
    std::string_view name;
    const TierCurves& curves;
    std::string how;
  };
  const Tier tiers[] = {
      {"RAM tier", p.ram, "through a RAM tier (MakeRamTier)"},
      {"RAM tier (zstd)", p.ram_zstd, "through a RAM tier that compresses with zstd"},
      {"disk tier (buffered)", p.disk_buffered,
       fmt::format("through a scratch disk tier file in {} (page cache)", p.disk_dir)},
      {"disk tier (O_DIRECT)", p.disk_direct,
       p.disk_direct_measured
           ? fmt::format("through a scratch disk tier file in {} opened O_DIRECT", p.disk_dir)
           : std::string("the filesystem refused O_DIRECT: a copy of the buffered curves")},
  };
  for (const Tier& t : tiers) {
    line(fmt::format("{} write", t.name), Describe(t.curves.write),
         how(t.how + ", " + PointsOf(t.curves.write)));
    line(fmt::format("{} read", t.name), Describe(t.curves.read),
         how(t.how + " (checksums verified), each call on other pages than the calls before "
                     "it, cycling through 1.5 times the " + Bytes(p.cache_bytes) +
             " last-level cache (or 4096 calls' pages) so that the caches no longer hold them, " +
             PointsOf(t.curves.read)));
    if (!t.curves.warm_read.points.empty()) {
      line(fmt::format("{} warm read", t.name), Describe(t.curves.warm_read),
           how(t.how + ", the same pages read again and again; priced where the reader's "
                       "working set fits the " + Bytes(p.cache_bytes) +
               " last-level cache, " + PointsOf(t.curves.warm_read)));
    }
  }
  line("compress int8", Describe(p.compress_int8),
       how("kv_codec EncodePage (pages = layers), " + PointsOf(p.compress_int8)));
  line("compress int4", Describe(p.compress_int4),
       how("kv_codec EncodePage (pages = layers), " + PointsOf(p.compress_int4)));
  const std::string kld_how =
      p.kld_tokens > 0
          ? fmt::format("measured: mean KL(f32 || pages through the codec) teacher-forced on {} "
                        "tokens of the built-in text, every earlier page encoded",
                        p.kld_tokens)
          : std::string("named default (kDefaultInt8Kld / kDefaultInt4Kld, of the order KIVI "
                        "reports): not measured, the calibration had no tokens of the text (no "
                        "tokenizer, or a quick calibration with no time for it)");
  line("int8 page KLD", fmt::format("{:.3e}", p.int8_kld), kld_how);
  line("int4 page KLD", fmt::format("{:.3e}", p.int4_kld), kld_how);
  line("memory price", "per run",
       "observed: from the pool's pressure at each decision (pages short, pages consumed per "
       "step), KvPressurePlanner");
  line("recency / frequency", "per page",
       "observed: the pager's access history (steps since attention last gave the page weight, "
       "steps that read it)");
  if (!p.measured_because.empty()) line("measured because", p.measured_because, "a run's reason");
  std::string corrections;
  for (const PriceCorrection& c : p.corrections) {
    corrections += fmt::format("{}{} {:.2f}x ({} events)", corrections.empty() ? "" : ", ", c.key,
                               c.scale, c.events);
  }
  line("bring-back corrections", corrections.empty() ? std::string("none yet") : corrections,
       "observed: measured / predicted of the pages earlier runs brought back, written back by "
       "the engine (kvl/profile_corrections.h); a run starts from them");
  if (!p.remeasure_reason.empty()) {
    line("measured again next start", p.remeasure_reason, "a run found this profile off");
  }
  return out;
}

}  // namespace kvl
