// The engine's measured corrections kept with the cost profile they correct. A calibration is a
// snapshot of a machine whose load, caches and page cache move afterwards; the engine times every
// page it brings back against the profile's prediction and corrects each action's prices by the
// median ratio (kvl/kv_price_feedback.h). Those corrections are written back into the profile
// file, so the next run starts from them instead of from 1; and a correction that drifts far from
// 1 says the profile no longer describes the machine, so the profile is measured again (by
// ProfileKeeper in the engine: while idle in `kvl serve`, at the next start after `kvl run`).
//
// Thread-safety: the functions are free of shared state; two processes writing back to one file
// each replace it whole (the last one wins), never leaving half of one.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "kvl/calibration.h"
#include "kvl/status.h"

namespace kvl {

// --kv-profile-drift: a profile whose measured correction of some action has moved past this
// factor either way (scale > bound or < 1 / bound) is measured again. 1.5: the goal
// allows predictions 25% off, and the corrections already take out what they measure; a profile
// off by half for an action prices the policy's choices on a machine that is gone (a profile
// measured under load priced recomputes 69-117% too slow). 0: never measured again for a drift.
inline constexpr double kDefaultProfileDriftBound = 1.5;
// Events (bring-back calls or steps, kvl/kv_price_feedback.h) of an action before its correction
// may say the profile drifted: the median over fewer is one disturbed restore away from noise.
inline constexpr int64_t kMinDriftEvents = 8;

// An action whose correction moved past the bound.
struct CorrectionDrift {
  std::string key;
  double scale = 1;
  int64_t events = 0;
  double bound = 0;
  // "the measured correction of recompute-tokens is 1.82x over 12 events, past the bound of
  // 1.50x (--kv-profile-drift)"
  std::string Describe() const;
};

// The correction furthest past `bound` (by |log scale|) among those with at least
// kMinDriftEvents events; nullopt where none is, or where bound is 0 (never).
std::optional<CorrectionDrift> FindCorrectionDrift(std::span<const PriceCorrection> corrections,
                                                   double bound);

// Whether `profile` was itself measured because a correction drifted (its measured_because says
// so): then another drift is a cost calibration cannot see, kept as a correction instead of
// measuring again and again.
bool MeasuredForDrift(const MachineProfile& profile);
// The measured_because (and remeasure_reason) of a profile measured for `drift`:
// "drift: " + drift.Describe().
std::string DriftReason(const CorrectionDrift& drift);

// Writes `corrections` and `remeasure_reason` into the profile at `path`, every measurement left
// as it is, through SaveProfile (a temp file renamed over the old one: a reader never sees half a
// file). Only into the profile they were measured against: false, nothing written, where the file
// is gone or its timestamp is not `measured_at` (another run measured the machine since, and the
// corrections of the old prices mean nothing against the new ones). An unreadable profile is its
// load error.
StatusOr<bool> WriteBackCorrections(const std::string& path, const std::string& measured_at,
                                    std::span<const PriceCorrection> corrections,
                                    const std::string& remeasure_reason);

}  // namespace kvl
