// The measured corrections written back into the profile, and the drift that has it measured
// again (kvl/profile_corrections.h).
#include "kvl/profile_corrections.h"

#include <fmt/format.h>

#include <cmath>
#include <string_view>

namespace kvl {
namespace {

// The start of every DriftReason: how MeasuredForDrift recognises one.
constexpr std::string_view kDriftReasonPrefix = "drift: ";

}  // namespace

std::string CorrectionDrift::Describe() const {
  return fmt::format(
      "the measured correction of {} is {:.2f}x over {} events, past the bound of {:.2f}x "
      "(--kv-profile-drift)",
      key, scale, events, bound);
}

std::optional<CorrectionDrift> FindCorrectionDrift(std::span<const PriceCorrection> corrections,
                                                   double bound) {
  if (!(bound > 1)) return std::nullopt;
  std::optional<CorrectionDrift> worst;
  double worst_distance = std::log(bound);
  for (const PriceCorrection& c : corrections) {
    if (c.events < kMinDriftEvents || !(c.scale > 0)) continue;
    const double distance = std::abs(std::log(c.scale));
    if (distance <= worst_distance) continue;
    worst_distance = distance;
    worst = CorrectionDrift{c.key, c.scale, c.events, bound};
  }
  return worst;
}

std::string DriftReason(const CorrectionDrift& drift) {
  return fmt::format("{}{}", kDriftReasonPrefix, drift.Describe());
}

bool MeasuredForDrift(const MachineProfile& profile) {
  return profile.measured_because.starts_with(kDriftReasonPrefix);
}

StatusOr<bool> WriteBackCorrections(const std::string& path, const std::string& measured_at,
                                    std::span<const PriceCorrection> corrections,
                                    const std::string& remeasure_reason) {
  StatusOr<MachineProfile> on_disk = LoadProfile(path);
  if (!on_disk.ok()) {
    if (on_disk.status().code() == StatusCode::kNotFound) return false;
    return on_disk.status();
  }
  if (on_disk->timestamp != measured_at) return false;
  on_disk->corrections.assign(corrections.begin(), corrections.end());
  on_disk->remeasure_reason = remeasure_reason;
  KVL_RETURN_IF_ERROR(SaveProfile(*on_disk, path));
  return true;
}

}  // namespace kvl
