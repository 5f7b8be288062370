// Speculative decoding (issue 26): the cost model that decides each step's draft lengths.
//
// A step of R rows takes T(R). One sequence's draft of k tokens with per-token acceptance a
// yields E(k) = 1 + a + a^2 + ... + a^k tokens (the accepted prefix and the target's own next
// token) for the cost T(R + k) - T(R). The speculator adds drafts sequence by sequence, each at
// the k that raises the step's tokens per millisecond most, and only where that gain beats
// kMinGain: a step that is not bandwidth-bound (many sequences batched, a prefill chunk) costs
// more per extra row, and prose the drafter cannot predict has a low acceptance, so both turn
// speculation down or off by themselves.
//
// T(R) is measured online (StepCostCurve::Observe after each step: the engine's whole step,
// drafting aside, since on a small model the engine's own work per step outweighs the forward
// pass) per row count, as the median of its recent measurements, relative to the fewest rows
// measured; where a row count has not been measured, from the measured steps' slope, or a prior
// slope until any step with more rows was measured.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvl {

// A cost is the median of its last kCostWindow measurements: on a loaded machine a step's time
// is its cost plus whatever the scheduler took from it, in a heavy tail that a mean charges to
// whatever ran then (preempted steps of any size look alike); the least one would leave out
// what every pass pays under that load (a draft model's passes more than one step).
inline constexpr size_t kCostWindow = 16;
double MedianOfWindow(const double* values, size_t n);

// Expected tokens from a draft of k tokens at per-token acceptance `a`: 1 + a + ... + a^k.
double ExpectedTokens(double acceptance, int64_t k);

// A draft must raise the step's tokens per millisecond by this factor to be sent: the margin
// covers the curve's noise, so open prose stays at plain decoding's speed.
inline constexpr double kMinGain = 1.05;

class StepCostCurve {
 public:
  // `max_rows`: row counts measured one by one (above: the slope's extrapolation).
  // `prior_slope`: T(R) / T(1) - 1 per extra row before anything is measured (about what a
  // bandwidth-bound CPU step costs per extra row; optimistic, so that drafts are tried and the
  // curve gets its first measurements).
  explicit StepCostCurve(int64_t max_rows, double prior_slope = 0.02);

  // A step of `rows` rows took `ms`.
  void Observe(int64_t rows, double ms);
  // Whether `rows` rows were measured often enough for their own mean to be used.
  bool measured(int64_t rows) const;
  // The measurements of `rows` rows in the window (0 beyond the table).
  double measurements(int64_t rows) const {
    return rows >= 1 && rows < static_cast<int64_t>(weight_.size())
               ? weight_[static_cast<size_t>(rows)]
               : 0.0;
  }
  // The row count the curve is relative to: the fewest measured (one row alone; the batch's rows
  // when sequences decode together), or 0 before any.
  int64_t reference() const { return reference_; }
  // T(rows) / T(reference()): measured, or from the slope (the prior before any measurement).
  double Relative(int64_t rows) const;
  // The slope per extra row in use (measured, or the prior).
  double slope() const { return slope_; }
  // T(reference()) in ms (0 until measured).
  double reference_ms() const;

 private:
  // The last kCostWindow measurements of each row count, and their median.
  std::vector<double> ms_;      // per row count: the window's median ms (0: none)
  std::vector<double> weight_;  // per row count: measurements in the window
  std::vector<double> window_;  // [row count][kCostWindow] ms
  std::vector<uint8_t> next_;   // per row count: the window's next slot
  double prior_slope_;
  // What Observe last worked out: reference() and slope().
  int64_t reference_ = 0;
  double slope_;
  int64_t max_observed_ = 0;  // the most rows of any step observed

  // The weighted median slope of the row counts measured above the reference (the prior
  // without). `slopes_`: its scratch (slope, weight), reserved once.
  double MeasuredSlope();
  std::vector<std::pair<double, double>> slopes_;
};

// One sequence as the cost model sees it: what its drafter offers and how well it has done.
struct SpecCandidate {
  int64_t offered = 0;      // draft tokens the drafter proposed (at most the draft limit)
  double acceptance = 0;    // per-token acceptance rate so far
  int64_t chosen = 0;       // out: draft tokens the step carries
};

// Chooses each candidate's draft length for a step whose other rows are `base_rows` (one per
// decoding sequence, plus any prefill tokens) and that yields `base_tokens` tokens without
// drafts, within `max_extra_rows` draft rows in all. `draft_cost`: what drafting one token costs
// on top of its row, relative to a one-row step (a draft model's pass; 0 for a lookup). `scratch`
// is reused (no allocation per step).
void ChooseDraftLengths(const StepCostCurve& curve, int64_t base_rows, int64_t base_tokens,
                        int64_t max_extra_rows, std::vector<SpecCandidate>& candidates,
                        std::vector<SpecCandidate*>* scratch, double draft_cost = 0);

}  // namespace kvl
