#include "kvl/in_step_rebuild_meter.h"

#include <algorithm>
#include <cmath>

namespace kvl {

std::optional<InStepRebuildMeter::Measured> InStepRebuildMeter::Observe(const Step& step) {
  if (!(step.plain_model_ms > 0) || !(step.measured_ms > 0) || !std::isfinite(step.measured_ms)) {
    return std::nullopt;
  }
  if (step.rebuilds.pages == 0) {
    plain_ratios_[plain_next_] = step.measured_ms / step.plain_model_ms;
    plain_next_ = (plain_next_ + 1) % kPlainWindow;
    plain_count_ = std::min(plain_count_ + 1, kPlainWindow);
    // The median, not the mean: one step that waited behind another process must not move the
    // baseline of every later one.
    std::array<double, kPlainWindow> sorted = plain_ratios_;
    const auto end = sorted.begin() + static_cast<std::ptrdiff_t>(plain_count_);
    const auto mid = sorted.begin() + static_cast<std::ptrdiff_t>(plain_count_ / 2);
    std::nth_element(sorted.begin(), mid, end);
    plain_scale_ = *mid;
    if (plain_count_ % 2 == 0) plain_scale_ = 0.5 * (plain_scale_ + *std::max_element(sorted.begin(), mid));
    return std::nullopt;
  }
  Measured m;
  m.pages = step.rebuilds.pages;
  const double pages = static_cast<double>(m.pages);
  const double baseline_ms = step.plain_model_ms * plain_scale_;
  // A step that ran faster than its baseline measures the rebuilds as free, never as negative.
  m.measured_ms = std::max(0.0, step.measured_ms - baseline_ms);
  m.model_ms = step.rebuilds.model_ms;
  m.measured_page_ms = m.measured_ms / pages;
  m.predicted_page_ms = step.rebuilds.predicted_ms / pages;
  return m;
}

}  // namespace kvl
