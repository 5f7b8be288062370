// The cost profile the engine prices KV actions with: found on disk, measured now (and saved), or
// assumed from the model's shape; and its conversion into the per-page prices of the KV policy.
// Every step that costs time or writes a file says so on the messages stream.
//
// Thread-safety: ObtainProfile may run a calibration on ctx's pool (see Calibrate); the other
// functions are pure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "kvl/calibration.h"
#include "kvl/kv_policy.h"
#include "kvl/status.h"

namespace kvl {

struct ProfileOptions {
  // Where the profile lives; empty: DefaultProfilePath(model name), i.e. $KVL_PROFILE, else
  // $XDG_CACHE_HOME (or ~/.cache)/kvlattice/profile-<model>.json.
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
};

// The profile for `model` on this machine, as ProfileOptions describes:
//   usable profile at the path -> it, with one line naming it;
//   missing (or unusable at a default path) and calibrate -> measured now with ctx's pool,
//     announced with an estimate of the time and a line per stage, saved to the path (a failed
//     save at a default path is a warning: the profile is used for this run only);
//   missing and !calibrate -> AnalyticProfile, announced, nothing written.
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

// Fills the prices of one block_tokens-token page that a profile provides: recompute_residual_ms
// and recompute_tokens_ms (scaled from the profile's recompute_page_tokens), ram_gbps,
// disk_read_gbps, disk_write_gbps, disk_latency_ms. Every other field is left as it is.
void FillPagePrices(const MachineProfile& profile, int64_t block_tokens, PageCostProfile* prices);

}  // namespace kvl
