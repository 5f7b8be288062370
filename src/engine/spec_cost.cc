#include "spec_cost.h"

#include <algorithm>
#include <cmath>

namespace kvl {
namespace {

// Measurements of a row count needed before its own figure is trusted over the slope.
constexpr double kTrustedWeight = 2.0;

}  // namespace

double MedianOfWindow(const double* values, size_t n) {
  double sorted[kCostWindow];
  n = std::min(n, kCostWindow);
  std::copy(values, values + n, sorted);
  std::nth_element(sorted, sorted + n / 2, sorted + n);
  return sorted[n / 2];
}

double ExpectedTokens(double acceptance, int64_t k) {
  double tokens = 1, term = 1;
  for (int64_t i = 0; i < k; ++i) {
    term *= acceptance;
    tokens += term;
  }
  return tokens;
}

StepCostCurve::StepCostCurve(int64_t max_rows, double prior_slope)
    : ms_(static_cast<size_t>(std::max<int64_t>(max_rows, 2) + 1), 0.0),
      weight_(ms_.size(), 0.0),
      window_(ms_.size() * kCostWindow, 0.0),
      next_(ms_.size(), 0),
      prior_slope_(prior_slope),
      slope_(prior_slope) {
  slopes_.reserve(ms_.size());
}

void StepCostCurve::Observe(int64_t rows, double ms) {
  if (rows < 1 || rows >= static_cast<int64_t>(ms_.size()) || !(ms > 0)) return;
  const size_t r = static_cast<size_t>(rows);
  double* window = &window_[r * kCostWindow];
  window[next_[r]] = ms;
  next_[r] = static_cast<uint8_t>((next_[r] + 1) % kCostWindow);
  weight_[r] = std::min<double>(weight_[r] + 1, kCostWindow);
  ms_[r] = MedianOfWindow(window, static_cast<size_t>(weight_[r]));
  max_observed_ = std::max(max_observed_, rows);
  // The reference and the slope change only here: worked out once a step, not at each of the
  // cost model's many Relative calls (and over the row counts seen, not the whole table: a step
  // of a small model is a fraction of a millisecond).
  reference_ = 0;
  for (int64_t row = 1; row <= max_observed_; ++row) {
    if (measured(row)) {
      reference_ = row;
      break;
    }
  }
  slope_ = MeasuredSlope();
}

bool StepCostCurve::measured(int64_t rows) const {
  return rows >= 1 && rows < static_cast<int64_t>(ms_.size()) &&
         weight_[static_cast<size_t>(rows)] >= kTrustedWeight;
}

double StepCostCurve::reference_ms() const {
  const int64_t ref = reference();
  return ref > 0 ? ms_[static_cast<size_t>(ref)] : 0.0;
}

double StepCostCurve::MeasuredSlope() {
  const int64_t ref = reference_;
  if (ref == 0) return prior_slope_;
  // The weighted median of (T(R) / T(ref) - 1) / (R - ref) over the row counts measured above
  // ref: a mean would let one preempted step (a row count measured once, at 7x its cost) make
  // every longer draft look too dear to send, and what is never sent is never measured again.
  const double ref_ms = ms_[static_cast<size_t>(ref)];
  slopes_.clear();
  double weight = 0;
  for (size_t r = static_cast<size_t>(ref) + 1; r <= static_cast<size_t>(max_observed_); ++r) {
    if (weight_[r] <= 0) continue;
    slopes_.push_back({(ms_[r] / ref_ms - 1) / static_cast<double>(r - static_cast<size_t>(ref)),
                       weight_[r]});
    weight += weight_[r];
  }
  if (slopes_.empty()) return prior_slope_;
  std::sort(slopes_.begin(), slopes_.end());
  double below = 0;
  for (const auto& [slope, w] : slopes_) {
    below += w;
    if (below > weight / 2) return std::max(0.0, slope);  // (the upper one of an even split)
  }
  return std::max(0.0, slopes_.back().first);
}

double StepCostCurve::Relative(int64_t rows) const {
  const int64_t ref = std::max<int64_t>(reference(), 1);
  if (rows == ref) return 1.0;
  if (measured(rows) && measured(ref)) {
    const double ratio = ms_[static_cast<size_t>(rows)] / ms_[static_cast<size_t>(ref)];
    // A step with more rows never costs less: a noisy measurement (a cold first step, the
    // machine's load) must not make drafts that nobody accepts look free.
    return rows > ref ? std::max(1.0, ratio) : std::min(1.0, ratio);
  }
  return std::max(0.1, 1.0 + slope() * static_cast<double>(rows - ref));
}

void ChooseDraftLengths(const StepCostCurve& curve, int64_t base_rows, int64_t base_tokens,
                        int64_t max_extra_rows, std::vector<SpecCandidate>& candidates,
                        std::vector<SpecCandidate*>* scratch, double draft_cost) {
  // The best acceptance first: its rows buy the most tokens while the step is cheap.
  std::vector<SpecCandidate*>& order = *scratch;
  order.clear();
  for (SpecCandidate& c : candidates) {
    c.chosen = 0;
    if (c.offered > 0) order.push_back(&c);
  }
  // (std::sort allocates nothing; ties keep the sequences' order.)
  std::sort(order.begin(), order.end(), [](const SpecCandidate* a, const SpecCandidate* b) {
    return a->acceptance != b->acceptance ? a->acceptance > b->acceptance : a < b;
  });
  int64_t rows = std::max<int64_t>(base_rows, 1);
  double tokens = static_cast<double>(std::max<int64_t>(base_tokens, 1));
  double drafting = 0;  // the chosen drafts' own cost, relative to a one-row step
  for (SpecCandidate* c : order) {
    const double base = curve.Relative(rows);
    const double rate = tokens / (base + drafting);
    double best_rate = rate * kMinGain;
    for (int64_t k = 1; k <= c->offered && k <= max_extra_rows; ++k) {
      // (More rows never cost less, whatever the noise in the curve's means.)
      const double cost = std::max(base, curve.Relative(rows + k)) + drafting +
                          draft_cost * static_cast<double>(k);
      const double r = (tokens + ExpectedTokens(c->acceptance, k) - 1) / cost;
      if (r > best_rate) {
        best_rate = r;
        c->chosen = k;
      }
    }
    rows += c->chosen;
    drafting += draft_cost * static_cast<double>(c->chosen);
    max_extra_rows -= c->chosen;
    tokens += ExpectedTokens(c->acceptance, c->chosen) - 1;
  }
}

}  // namespace kvl
