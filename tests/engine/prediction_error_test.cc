// The prediction-error statistics of MetricsRecorder: known (predicted, measured) pairs give
// known medians and p90s (nearest rank), pairs measured as 0 are left out, and the window keeps
// only the newest pairs.
#include "engine/prediction_error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/metrics_recorder.h"

namespace kvl {
namespace {

// Ten pairs measured at 10 ms whose absolute errors are 0%, 10%, ..., 90% (shuffled, and half
// of them over-predicted): the nearest-rank median is the 5th smallest error (40%), p90 the 9th
// (80%).
TEST(PredictionErrorTest, KnownPairsGiveKnownPercentiles) {
  std::vector<PredictionPair> pairs;
  for (int k : {7, 2, 9, 0, 5, 3, 8, 1, 6, 4}) {
    const double predicted = k % 2 == 0 ? 10.0 + k : 10.0 - k;  // error k ms of 10 ms
    pairs.push_back({predicted, 10.0});
  }
  const KvPredictionError e = SummarizePredictions(pairs);
  EXPECT_EQ(e.samples, 10);
  EXPECT_NEAR(e.median_pct, 40.0, 1e-9);
  EXPECT_NEAR(e.p90_pct, 80.0, 1e-9);
}

// Relative to the measured time, not the predicted one: predicting 1 ms for 4 ms is 75% off, and
// 4 ms for 1 ms is 300% off; the ratio measured / predicted says which way the model errs.
TEST(PredictionErrorTest, ErrorIsRelativeToMeasured) {
  const std::vector<PredictionPair> under = {{1.0, 4.0}};
  EXPECT_NEAR(SummarizePredictions(under).median_pct, 75.0, 1e-9);
  EXPECT_NEAR(SummarizePredictions(under).median_ratio, 4.0, 1e-9);
  const std::vector<PredictionPair> over = {{4.0, 1.0}};
  EXPECT_NEAR(SummarizePredictions(over).median_pct, 300.0, 1e-9);
  EXPECT_NEAR(SummarizePredictions(over).median_ratio, 0.25, 1e-9);
  // Three pairs: the median is the 2nd error, p90 the 3rd (ceil(2.7) = 3).
  const std::vector<PredictionPair> three = {{2.0, 2.0}, {1.0, 2.0}, {5.0, 2.0}};
  const KvPredictionError e = SummarizePredictions(three);
  EXPECT_NEAR(e.median_pct, 50.0, 1e-9);
  EXPECT_NEAR(e.p90_pct, 150.0, 1e-9);
}

TEST(PredictionErrorTest, UnmeasuredPairsAreLeftOutAndEmptyIsZero) {
  const std::vector<PredictionPair> pairs = {{1.0, 0.0}, {1.0, 2.0}};
  const KvPredictionError e = SummarizePredictions(pairs);
  EXPECT_EQ(e.samples, 1);
  EXPECT_NEAR(e.median_pct, 50.0, 1e-9);
  const KvPredictionError none = SummarizePredictions({});
  EXPECT_EQ(none.samples, 0);
  EXPECT_EQ(none.median_pct, 0);
  EXPECT_EQ(none.p90_pct, 0);
}

// The window holds the newest kCapacity pairs: after kCapacity exact pairs and then kCapacity
// pairs 50% off, every exact one is gone.
TEST(PredictionErrorTest, WindowKeepsTheNewestPairs) {
  PredictionWindow w;
  for (size_t i = 0; i < PredictionWindow::kCapacity; ++i) w.Add(3.0, 3.0);
  EXPECT_EQ(w.Summary().p90_pct, 0);
  for (size_t i = 0; i < PredictionWindow::kCapacity / 2; ++i) w.Add(1.0, 2.0);
  KvPredictionError e = w.Summary();
  EXPECT_EQ(e.samples, static_cast<int64_t>(PredictionWindow::kCapacity));
  EXPECT_NEAR(e.median_pct, 0.0, 1e-9);  // half the window still exact
  EXPECT_NEAR(e.p90_pct, 50.0, 1e-9);
  for (size_t i = 0; i < PredictionWindow::kCapacity / 2; ++i) w.Add(1.0, 2.0);
  e = w.Summary();
  EXPECT_NEAR(e.median_pct, 50.0, 1e-9);
  EXPECT_EQ(w.pairs().size(), PredictionWindow::kCapacity);
}

// MetricsRecorder keeps one window per action and one per store tier, reported by Snapshot and
// PromotionError.
TEST(PredictionErrorTest, RecorderReportsPerActionAndPerTier) {
  MetricsRecorder r;
  r.CountRestored(KvAction::kDemoteRam, 1.0, 2.0);
  r.CountRestored(KvAction::kDemoteRam, 2.0, 2.0);
  r.CountRestored(KvAction::kRecomputeTokens, 3.0, 1.0);
  r.CountPromoted(1, 1.0, 4.0);
  EngineMetrics m;
  r.Snapshot(&m);
  const KvPredictionError& ram = m.kv_actions[static_cast<size_t>(KvAction::kDemoteRam)].error;
  EXPECT_EQ(ram.samples, 2);
  EXPECT_NEAR(ram.median_pct, 0.0, 1e-9);
  EXPECT_NEAR(ram.p90_pct, 50.0, 1e-9);
  const KvPredictionError& tokens =
      m.kv_actions[static_cast<size_t>(KvAction::kRecomputeTokens)].error;
  EXPECT_NEAR(tokens.median_pct, 200.0, 1e-9);
  EXPECT_EQ(m.kv_actions[static_cast<size_t>(KvAction::kDemoteDisk)].error.samples, 0);
  EXPECT_EQ(r.PromotionError(0).samples, 0);
  EXPECT_NEAR(r.PromotionError(1).median_pct, 75.0, 1e-9);
  EXPECT_EQ(r.PromotionError(7).samples, 0);
}

}  // namespace
}  // namespace kvl
