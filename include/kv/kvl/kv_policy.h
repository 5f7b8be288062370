// The KV action lattice's cost model: for one page (block_tokens tokens x all layers) it prices
// every action (keep, compress, demote, recompute, evict) and picks the cheapest allowed one.
//
//   cost(a) = P(reuse) x time to bring the page back under a      (ms)
//           + time spent now to carry a out                        (ms)
//           + memory price x bytes a leaves resident               (ms-equivalent)
//           + quality penalty of a (lossy actions only)            (ms-equivalent)
//
// Every input is measured (kvl calibrate's curves, evaluated for this page's tokens, layers and
// position by FillPagePrices in kvl/cost_profile.h, then each bring-back time corrected by what
// the engine measured since: KvPolicyOptions::feedback, kvl/kv_price_feedback.h) or observed
// (the page's reuse forecast, the pool's pressure); nothing here knows about the model beyond
// byte counts, so the policy is unit-testable with no model bytes. Where a profile has no
// measurement, the named defaults (kDefaultInt8Kld, ...) stand in, and `kvl calibrate --explain`
// says so. What a loss of quality is worth in milliseconds is no measurement but the user's
// choice: KvQualityPrices, named defaults that the engine's --kv-price-* flags set and its
// --explain prints.
//
// P(reuse), the probability that the page is read again, is the reuse forecast's
// (kvl/kv_reuse_forecast.h): its expected reads from now on, capped at 1 (ReuseProbability). A
// page of a running sequence is read at each step its sequence still takes (the scheduler knows
// how many at most), so under full attention P = 1 while a step is left and 0 after the last; a
// preempted sequence's page is read for certain when it resumes; a page nobody holds (an idle
// cached block) is read again only through prefix reuse, with the probability of the engine's
// survival table of idle pages (KvIdleReuseHistory: of the pages that were idle as long, the
// share read again, and the page's own record of revivals). The attention a page gets does not
// lower P (full attention reads every page); it prices what evicting the page loses.
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvl/kv_price_feedback.h"
#include "kvl/kv_reuse_forecast.h"
#include "kvl/status.h"

namespace kvl {

enum class KvAction {
  kKeep = 0,
  kCompressInt8,
  kCompressInt4,
  kDemoteRam,
  kDemoteDisk,
  kRecomputeResidual,
  kRecomputeTokens,
  kEvict,
  // Last, so that the actions before keep the numbers recorded traces and profiles know them by.
  kDemoteRedis,
};
inline constexpr int kNumKvActions = 9;
std::string_view KvActionName(KvAction action);
// The feedback key (kvl/kv_price_feedback.h) of pages rebuilt from checkpoints inside decode
// steps: what their rows add to the step they ride in is measured and corrected apart from a
// rebuild on its own (a restore, kRecomputeResidual's key), which is a different cost.
inline constexpr size_t kInStepRebuildFeedbackKey = kNumKvActions + 1;
// The feedback key of pages read from a remote tier (Redis): demoted there (kDemoteRedis) or found
// there by the KV store, the same read at the same price, corrected as one ("redis" in a profile's
// corrections, as it was before Redis was an action of its own).
inline constexpr size_t kRemoteTierFeedbackKey = kNumKvActions;
bool IsLossless(KvAction action);

enum class KvQuality { kLossless, kBalanced, kAggressive };
StatusOr<KvQuality> ParseKvQuality(std::string_view text);  // lossless | balanced | aggressive
std::string_view KvQualityName(KvQuality quality);           // "lossless" ...

// --kv-policy: auto, or one fixed action for comparisons and tests.
struct KvPolicyChoice {
  bool automatic = true;
  KvAction fixed = KvAction::kKeep;
};
StatusOr<KvPolicyChoice> ParseKvPolicy(std::string_view text);
// auto | keep | compress (int8) | compress-int4 | demote (ram) | demote-disk | demote-redis |
// recompute-residual | recompute-tokens | evict

enum class Phase { kPrefill, kDecode };

// Named defaults for inputs a profile may lack (a calibration without the model's tokenizer): the
// expected KL divergence int8 and int4 page encodings add, of the order KIVI reports.
inline constexpr double kDefaultInt8Kld = 1e-4;
inline constexpr double kDefaultInt4Kld = 5e-3;

// A decode step measured after `context` tokens of context: one decode row takes step_ms, and
// step_with_rebuild_ms with rebuild_rows rows of pages rebuilt from checkpoints riding in it (the
// extra rows of its K and V matmuls, KvLayerRebuild); a batch of many tokens (kvl calibrate: 128)
// takes batch_ms_per_token per token at the same context. The difference of the two step times
// is what a rebuild costs in the step it rides in: its marginal price, measured, not assumed.
// The batch shows what the cores do when arithmetic is the limit; the step leaves
// 1 - batch_ms_per_token / step_ms of that idle (reported, no longer a discount on any price).
struct DecodeIdlePoint {
  int64_t context = 0;
  double step_ms = 0;
  double batch_ms_per_token = 0;
  int64_t rebuild_rows = 0;          // 0: not measured (a profile of version 5)
  double step_with_rebuild_ms = 0;

  double Fraction() const;  // clamped to [0, 1]; 0 without a step time
  // Milliseconds one rebuilt row adds to the step (at least 0); -1 where not measured.
  double RebuildRowMs() const;
  bool operator==(const DecodeIdlePoint&) const = default;
};

// The idle fraction as a function of the context a decode step attends over. Attention reads
// every position of the context while the weights are streamed once per step, so the step's time
// grows with the context faster than the batch's per-token time, and so does the fraction (on a
// small model, from ~0.6 at 16 tokens to ~0.9 at 512). Both timings are about linear in the
// context: each is interpolated linearly between the measured contexts and held at the ends, and
// the fraction is taken from the two. A fixed array, so pricing a page never allocates.
inline constexpr int kMaxDecodeIdlePoints = 4;
struct DecodeIdleCurve {
  std::array<DecodeIdlePoint, kMaxDecodeIdlePoints> points{};  // [0, num_points), by context
  int num_points = 0;

  // Appends a point at a context above the last one's; false when full or out of order.
  bool Add(const DecodeIdlePoint& point);
  // The fraction at `context`; 0 without points.
  double FractionAt(int64_t context) const;
  // The marginal milliseconds of one rebuilt row in a decode step at `context`, interpolated as
  // the step times are; -1 where no point measured it.
  double RebuildRowMsAt(int64_t context) const;
  // The step and batch times at `context` (step_ms and batch_ms_per_token interpolated, the
  // rebuilt-rows fields left 0); a zero point without points.
  DecodeIdlePoint PointAt(int64_t context) const;
  // One point: `fraction` at every context (tests, and profiles that measure no curve).
  static DecodeIdleCurve Flat(double fraction);
  bool operator==(const DecodeIdleCurve&) const = default;
};

// What the machine can do, from the calibration profile, per page of this model. A transfer is
// latency + bytes / bandwidth; the latencies are those of one page (one tier page per layer, in
// one call), so they already hold the page's depth.
struct PageCostProfile {
  int64_t kv_bytes = 0;             // the page's K+V at the cache dtype, all layers
  int64_t residual_bytes = 0;       // its residual checkpoints, all layers (kept in the RAM tier)
  double recompute_residual_ms = 0; // rebuild K,V of the page from checkpoints (the read apart)
  // Re-running the page's tokens through the model:
  //   recompute_tokens_ms + recompute_tokens_context_ms * first_position
  //   + recompute_tokens_call_ms * block_tokens / recompute_batch_tokens
  // the first part is the page's own tokens, the second attention over the context before it,
  // the third its share of the fixed cost of the forward call it runs in (a resumed sequence
  // recomputes in batches of recompute_batch_tokens; 0: the page alone pays the whole call).
  double recompute_tokens_ms = 0;
  double recompute_tokens_context_ms = 0;
  double recompute_tokens_call_ms = 0;
  int64_t block_tokens = 0;
  int64_t recompute_batch_tokens = 0;
  double compress_ms = 0;           // encode the page as int8
  double compress_int4_ms = 0;      // encode the page as int4; 0: compress_ms
  // Bytes a compressed page really takes (slab slots, scales and padding included); 0: estimated
  // as 8 or 4 bits per value plus one f32 scale per 32.
  int64_t int8_page_bytes = 0;
  int64_t int4_page_bytes = 0;
  double ram_gbps = 0;              // host RAM tier read bandwidth
  double ram_latency_ms = 0;        // and the fixed time of reading one page
  double ram_write_gbps = 0;        // writing a page there; 0: as reading
  double ram_write_latency_ms = 0;
  double disk_read_gbps = 0;
  double disk_write_gbps = 0;
  double disk_latency_ms = 0;       // the fixed time of reading one page
  double disk_write_latency_ms = 0; // of writing one; 0: as reading
  bool has_disk_tier = false;
  bool has_ram_tier = true;
  // A Redis tier, measured through its link when the engine starts (FillRemoteTierPrices,
  // kvl/cost_profile.h): a page read costs redis_latency_ms + bytes / redis_read_gbps, which for
  // the engine's page is the mean of its timed reads (so a link with a long tail prices above
  // one with the same median); redis_p99_ms is the 99th percentile of those reads (--explain).
  // gbps 0: unmeasured, never chosen.
  bool has_redis_tier = false;
  double redis_read_gbps = 0;
  double redis_write_gbps = 0;
  double redis_latency_ms = 0;
  double redis_write_latency_ms = 0;
  double redis_p99_ms = 0;
  // The decode step's measured times, with and without rebuilt rows riding in it: a page of a
  // running sequence kept as checkpoints is rebuilt inside every step that reads it, at the
  // marginal price RebuildRowMsAt(step context) per row, not at recompute_residual_ms; the
  // difference lowers the action's cost (hidden_ms), not its predicted bring-back time (what
  // the engine measures and checks when a page is restored on its own). Without the measurement
  // (an older profile) nothing is hidden.
  DecodeIdleCurve decode_idle;
  // Actions the caller can carry out (bit i = KvAction i); the others are priced but not allowed.
  uint32_t available_actions = (1u << kNumKvActions) - 1;
  // Expected KL divergence the lossy encodings add (measured on the model by kvl calibrate).
  double int8_kld = kDefaultInt8Kld;
  double int4_kld = kDefaultInt4Kld;
};

// What lossy actions cost, in milliseconds of time the user would rather spend than lose this
// much quality, per quality preset (--kv-quality; lossless allows no loss at any price). Named
// defaults, not measurements: the engine's --kv-price-* flags set them and --explain prints them.
struct KvQualityPrices {
  // A compressed page (int8 or int4): ms per nat of the KL divergence its encoding adds to the
  // next-token distribution (PageCostProfile::int8_kld / int4_kld, measured by kvl calibrate).
  // At the defaults an int8 page (~1e-4 nats) costs 1 ms (balanced) or 0.1 ms (aggressive).
  double balanced_ms_per_kld = 1e4;
  double aggressive_ms_per_kld = 1e3;
  // An evicted page: ms per unit of attention mass it would still have received, counted as
  // P(reuse) x (0.01 + its mean attention mass per step), so that even a page attention ignores
  // costs something to lose. A page holding 10% of the mass costs 550 ms (balanced) or 22 ms
  // (aggressive).
  double balanced_ms_per_evicted_mass = 5000;
  double aggressive_ms_per_evicted_mass = 200;

  // The preset's prices; lossless shows balanced's (its lossy actions are priced, never allowed).
  double MsPerKld(KvQuality quality) const;
  double MsPerEvictedMass(KvQuality quality) const;
  // Each price is finite and >= 0, and aggressive never prices a loss above balanced; the error
  // names the flag.
  Status Validate() const;
  // One line listing the four prices with their flags (--explain).
  std::string Describe() const;
  bool operator==(const KvQualityPrices&) const = default;
};

// What we know of one page's use.
struct PageHistory {
  int64_t first_position = 0;       // of its first token: the context a recompute attends over
  // When and how often it is read next (kvl/kv_reuse_forecast.h: from the schedule for a running
  // or preempted sequence's page, from the idle pages' survival table for a cached one). The
  // default: read at the next step, once at least.
  KvReuseForecast reuse{0, 1, 0};
  double attention_mass = 0;        // accumulated mean attention weight on its tokens
  bool is_sink = false;             // holds one of the first sink tokens
  bool in_recent_window = false;    // among the newest pages
  bool compressed = false;          // already int8/int4
};

struct KvPolicyOptions {
  KvQuality quality = KvQuality::kBalanced;
  Phase phase = Phase::kDecode;
  // What keeping a MiB resident costs, from the pool's pressure (KvPressurePlanner's
  // MemoryPriceMsPerMib); 0: no pressure, keeping is free.
  double memory_price_ms_per_mib = 0;
  KvQualityPrices quality_prices;  // what a loss costs under `quality`
  // Tokens the decode step a rebuild rides in attends over (the sequence's length): the context
  // its marginal price is evaluated at. -1: unknown, taken as the page's end (first_position +
  // block_tokens), the least context of a step that reads the whole page.
  int64_t step_context = -1;
  // Corrections of the model's bring-back times by what the engine measured (keyed by
  // KvAction); null: the model's times as they are.
  const BringBackFeedback* feedback = nullptr;
};

struct KvActionCost {
  KvAction action = KvAction::kKeep;
  bool allowed = false;
  std::string why_not;          // when not allowed
  double reuse_probability = 0;
  double bring_back_ms = 0;     // predicted wall time to bring the page back (checked by the engine)
  double model_bring_back_ms = 0;  // the same from the profile alone, before the feedback's correction
  double hidden_ms = 0;         // of which a decode step's own run absorbs (its rows ride there)
  double now_ms = 0;
  double resident_bytes = 0;
  double memory_cost_ms = 0;
  double quality_cost_ms = 0;
  double total_ms = 0;
};

struct KvDecision {
  KvAction action = KvAction::kKeep;
  std::array<KvActionCost, kNumKvActions> costs;  // every action, indexed by KvAction
  std::string Explain() const;  // one line per action with its cost terms (--explain)
};

// P(the page is read again): 1 for an attention sink or a page of the recent window (never
// acted on), else ReuseProbability(page.reuse).
double ReuseProbability(const PageHistory& page);
// P(at least one more read) from a forecast: its expected reads from now on, capped at 1 (a
// running or preempted reader with steps left: 1; an idle page: its revival probability).
double ReuseProbability(const KvReuseForecast& forecast);

// Milliseconds to recompute a page from its tokens at `first_position` (PageCostProfile's
// formula), and to transfer `bytes` at `gbps` after `latency_ms`.
double RecomputeTokensMs(const PageCostProfile& profile, int64_t first_position);
// The per-token terms of RecomputeTokensMs for one token at `position`: its own work and its
// attention over the positions before it, without the call's fixed part. What a token weighs in a
// forward run, so that a recomputed page's measured time is its weighted share of the run's.
double RecomputeTokenMs(const PageCostProfile& profile, int64_t position);
double TransferMs(double bytes, double gbps, double latency_ms);
// What one page kept as checkpoints adds to a decode step at `step_context` that rebuilds it
// inside (its rows ride in the step's K and V matmuls), as ChooseKvAction prices it before any
// measured correction: its checkpoints read from the RAM tier, and its rows' marginal time in
// the step (DecodeIdleCurve::RebuildRowMsAt), never more than a rebuild on its own. -1 where the
// profile did not measure the step with rebuilt rows (nothing rides in the step at a price then).
double InStepRebuildMs(const PageCostProfile& profile, int64_t step_context);
// The measured correction of rebuilds in the step (kInStepRebuildFeedbackKey); until any was
// measured (or seeded from the profile), that of rebuilds on their own: a busy machine slows
// both. 1 without feedback.
double InStepRebuildCorrection(const BringBackFeedback* feedback);

KvDecision ChooseKvAction(const PageHistory& page, const PageCostProfile& profile,
                          const KvPolicyOptions& options);

}  // namespace kvl
