// The cost profile the engine prices KV actions with: found on disk, measured now (and saved), or
// assumed from the model's shape; and its conversion into the per-page prices of the KV policy.
// Every step that costs time or writes a file says so on the messages stream.
//
// Thread-safety: ObtainProfile may run a calibration on ctx's pool (see Calibrate); the other
// functions are pure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "kvl/calibration.h"
#include "kvl/kv_policy.h"
#include "kvl/status.h"

namespace kvl {

struct ProfileOptions {
  // Where the profile lives; empty: DefaultProfilePath(ProfileKey(model, ctx)), i.e.
  // $KVL_PROFILE, else $XDG_CACHE_HOME (or ~/.cache)/kvlattice/profile-<key>.json.
  std::string path;
  // For a non-empty path: whether the user named it (--kv-profile). An unusable file there (not
  // JSON, a missing field, another version, another model) is then an error and is never
  // overwritten; an unusable file at a default path is replaced, with a message saying so.
  bool path_from_user = true;
  // false: never measure. A usable profile at the path is still used; without one the rates are
  // AnalyticProfile's defaults, and nothing is written.
  bool calibrate = true;
  CalibrateOptions calibration = QuickCalibrateOptions();  // sizes and disk_dir when measuring
  FILE* messages = stderr;                                 // nullptr: silent
  // Also say, input by input, how each was measured or that it is a named default
  // (ExplainProfile); without it one line names the defaults in use, if any.
  bool explain = false;
  // The share of the CPU other processes take now (MeasureOthersCpuShare over a quarter of a
  // second when empty; nullopt: unknown). Consulted only about a profile MeasuredUnderLoad.
  std::function<std::optional<double>()> current_others_cpu_share;
};

// The file ObtainProfile reads and writes for these options: options.path, or the default path.
std::string ProfilePath(const Model& model, const ops::OpsContext& ctx,
                        const ProfileOptions& options);

// The profile for `model` on this machine, as ProfileOptions describes:
//   usable profile at the path -> it, with one line naming it;
//   missing (or unusable at a default path) and calibrate -> measured now with ctx's pool,
//     announced with an estimate of the time and a line per stage, saved to the path (a failed
//     save at a default path is a warning: the profile is used for this run only);
//   missing and !calibrate -> AnalyticProfile, announced, nothing written;
//   a profile MeasuredUnderLoad (found at a default path, or just measured) while the machine is
//     quiet now and calibrate -> measured again (once), with a line saying why; while it is still
//     busy (or at a user's path) -> used, with a line saying its prices are slow;
//   a profile a run flagged (its remeasure_reason: a measured correction drifted past the bound,
//     kvl/profile_corrections.h) at a default path and calibrate -> measured again, with a line
//     saying why (the new profile's measured_because); at a user's path -> used, with a word.
// Errors: an unusable user-named profile (its load error, naming the file and the field);
// a user-named path that cannot be written (before measuring); a calibration error.
StatusOr<MachineProfile> ObtainProfile(const Model& model, ops::OpsContext& ctx,
                                       const ProfileOptions& options);

// A profile that measures nothing: compute rates from the model's FLOPs at an assumed,
// conservative rate per thread of ctx's pool; memory and disk at assumed bandwidths and latency.
// source = kProfileSourceDefault.
MachineProfile AnalyticProfile(const Model& model, const ops::OpsContext& ctx);

// Seconds a calibration with these options is expected to take for this model, at the same
// assumed rates (an overestimate on most machines); at least 1.
int64_t EstimateCalibrationSeconds(const Model& model, const ops::OpsContext& ctx,
                                   const CalibrateOptions& options);

// The pages FillPagePrices prices, and where they go.
struct PagePriceOptions {
  int64_t block_tokens = kCalibrationPageTokens;  // tokens per page
  int64_t layers = 0;                // layers the page spans; 0: every layer of the model
  bool disk_direct = false;          // the disk tier is opened with O_DIRECT (disk:...:direct)
  bool ram_compressed = false;       // the RAM tier compresses with zstd (ram:SIZE:zstd)
  // Bytes the page takes in a tier (every layer's K and V at the cache's dtype): the size whose
  // average bandwidth the transfer prices use (a curve's bandwidth drops past its knee).
  // 0: the page at f32.
  int64_t page_bytes = 0;
  // Tokens per forward call when a resumed sequence recomputes its pages (the engine's batch);
  // 0: each page alone.
  int64_t recompute_batch_tokens = 0;
  // Bytes the caller touches between leaving a page in a tier and reading it back (the engine:
  // its weights and pool): where they fit in the profile's last-level cache, the tier's pages
  // are read warm (TierCurves::ReadFor); 0: unknown, read cold.
  int64_t working_set_bytes = 0;
};

// Fills the prices of one page that a profile provides, evaluating its curves at the page's
// tokens and layers: recompute_residual_ms, the recompute_tokens_* terms (the position is the
// policy's, PageHistory::first_position), the compress times, every tier's bandwidth and
// per-page latency (the disk's buffered or O_DIRECT curves; reads warm or cold by the working
// set; each bandwidth the one the curve averages over the page's bytes), the KLDs and the decode
// idle curve (the policy evaluates it at the step's context).
// kv_bytes, residual_bytes, the compressed page sizes, the tiers present and the actions allowed
// are left as they are (the caller knows its layout). `kvl bench frontier` prices its points
// with this too.
void FillPagePrices(const MachineProfile& profile, const PagePriceOptions& options,
                    PageCostProfile* prices);
// The redis_* prices of one page (`layers` tier pages of `page_bytes`) from a remote tier measured
// through its link: a page read is priced at the mean of its timed reads (the tail included: a
// link whose reads spread prices above one with the same median), split into the bandwidth the
// read curve averages over the page's bytes and a latency for the rest; writes from the write
// curve; redis_p99_ms is the 99th percentile of the timed reads. The other fields are left as
// they are.
void FillRemoteTierPrices(const RemoteTierMeasurement& measured, int64_t page_bytes,
                          int64_t layers, PageCostProfile* prices);
// The same for a page of block_tokens tokens over every layer, buffered disk, pages alone.
void FillPagePrices(const MachineProfile& profile, int64_t block_tokens, PageCostProfile* prices);

}  // namespace kvl
