#include "prediction_error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvl {
namespace {

// The value at rank ceil(p/100 * n) of sorted values (1-based), as SampleWindow::Percentile.
double NearestRank(const std::vector<double>& sorted, double p) {
  const size_t rank =
      static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace

KvPredictionError SummarizePredictions(std::span<const PredictionPair> pairs) {
  std::vector<double> errors;
  std::vector<double> ratios;
  errors.reserve(pairs.size());
  ratios.reserve(pairs.size());
  for (const PredictionPair& p : pairs) {
    if (!(p.measured_ms > 0) || !std::isfinite(p.measured_ms) || !std::isfinite(p.predicted_ms)) {
      continue;
    }
    errors.push_back(100.0 * std::abs(p.measured_ms - p.predicted_ms) / p.measured_ms);
    ratios.push_back(p.predicted_ms > 0 ? p.measured_ms / p.predicted_ms
                                        : std::numeric_limits<double>::infinity());
  }
  KvPredictionError e;
  e.samples = static_cast<int64_t>(errors.size());
  if (errors.empty()) return e;
  std::sort(errors.begin(), errors.end());
  std::sort(ratios.begin(), ratios.end());
  e.median_pct = NearestRank(errors, 50);
  e.p90_pct = NearestRank(errors, 90);
  e.median_ratio = NearestRank(ratios, 50);
  return e;
}

void PredictionWindow::Add(double predicted_ms, double measured_ms) {
  if (pairs_.size() < kCapacity) {
    if (pairs_.empty()) pairs_.reserve(kCapacity);
    pairs_.push_back({predicted_ms, measured_ms});
  } else {
    pairs_[next_] = {predicted_ms, measured_ms};
    next_ = (next_ + 1) % kCapacity;
  }
}

}  // namespace kvl
