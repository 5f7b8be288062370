#include "kvl/kv_price_feedback.h"

#include <algorithm>
#include <cmath>

namespace kvl {

BringBackFeedback::BringBackFeedback(size_t keys)
    : windows_(keys), next_(keys, 0), scales_(keys, 1.0), events_(keys, 0), seeded_(keys, false) {}

void BringBackFeedback::Seed(size_t key, double scale) {
  if (key >= scales_.size() || !(scale > 0) || !std::isfinite(scale)) return;
  if (!windows_[key].empty()) return;  // this run's own measurements win
  scales_[key] = std::clamp(scale, kMinScale, kMaxScale);
  seeded_[key] = true;
}

void BringBackFeedback::Observe(size_t key, double model_ms, double measured_ms) {
  if (key >= windows_.size()) return;
  if (!(model_ms > 0) || !(measured_ms > 0) || !std::isfinite(model_ms) ||
      !std::isfinite(measured_ms)) {
    return;
  }
  ++events_[key];
  std::vector<double>& window = windows_[key];
  const double ratio = measured_ms / model_ms;
  if (window.size() < kWindow) {
    if (window.empty()) window.reserve(kWindow);
    window.push_back(ratio);
  } else {
    window[next_[key]] = ratio;
    next_[key] = (next_[key] + 1) % kWindow;
  }
  if (window.size() < kMinSamples) return;
  // The median, not the mean: one restore that waited behind a page-cache flush or a busy core
  // must not move the price of every later page.
  std::array<double, kWindow> sorted;
  std::copy(window.begin(), window.end(), sorted.begin());
  const size_t n = window.size();
  std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.begin() + n);
  double median = sorted[n / 2];
  if (n % 2 == 0) median = 0.5 * (median + *std::max_element(sorted.begin(), sorted.begin() + n / 2));
  scales_[key] = std::clamp(median, kMinScale, kMaxScale);
}

void BringBackBatch::FeedTo(BringBackFeedback* feedback) {
  for (size_t key = 0; key < model_ms_.size(); ++key) {
    if (feedback != nullptr && model_ms_[key] > 0) {
      feedback->Observe(key, model_ms_[key], measured_ms_[key]);
    }
    model_ms_[key] = 0;
    measured_ms_[key] = 0;
  }
}

}  // namespace kvl
