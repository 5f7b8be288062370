// The cost model's bring-back predictions checked against what was measured: a bounded window of
// (predicted, measured) pairs per action or tier, summarized as the median and p90 of the absolute
// error in percent (KvPredictionError, kvl/engine.h).
//
// Thread-safety: none; MetricsRecorder holds its windows under its mutex.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kvl/engine.h"

namespace kvl {

struct PredictionPair {
  double predicted_ms = 0;
  double measured_ms = 0;
};

// |measured - predicted| / measured in percent, median and p90 by nearest rank (the value at
// rank ceil(p/100 * n) of the sorted errors), and the median of measured / predicted. A pair
// measured as 0 ms (below the clock's resolution) has no relative error and is left out; a
// prediction of 0 ms gives a ratio of +inf for that pair.
KvPredictionError SummarizePredictions(std::span<const PredictionPair> pairs);

// The last kCapacity pairs (a ring, allocated once at the first pair).
class PredictionWindow {
 public:
  static constexpr size_t kCapacity = 4096;

  void Add(double predicted_ms, double measured_ms);
  KvPredictionError Summary() const { return SummarizePredictions(pairs_); }
  std::span<const PredictionPair> pairs() const { return pairs_; }  // in ring order

 private:
  std::vector<PredictionPair> pairs_;
  size_t next_ = 0;
};

}  // namespace kvl
