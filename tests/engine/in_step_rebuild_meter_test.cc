// Rebuilds inside the decode step, measured (InStepRebuildMeter): with step times injected, the
// measured cost of the rebuilt pages is the step's time less its baseline (the calibrated step
// without them, scaled by this run's plain steps), split over the pages, and the error the
// metrics record is exactly the one injected.
#include "kvl/in_step_rebuild_meter.h"

#include <gtest/gtest.h>

#include "engine/metrics_recorder.h"
#include "kvl/kv_pager.h"  // kNumFeedbackKeys
#include "kvl/kv_policy.h"

namespace kvl {
namespace {

InStepRebuildMeter::Step Plain(double calibrated_ms, double measured_ms) {
  return {measured_ms, calibrated_ms, {}};
}

InStepRebuildMeter::Step Rebuilding(double calibrated_ms, double measured_ms, int64_t pages,
                                    double model_ms, double predicted_ms) {
  return {measured_ms, calibrated_ms, {pages, model_ms, predicted_ms}};
}

TEST(InStepRebuildMeterTest, InjectedStepTimesGiveTheInjectedError) {
  InStepRebuildMeter meter;
  // The machine runs plain decode steps 10% slower than calibrated: the baseline follows.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(meter.Observe(Plain(20.0, 22.0)).has_value());
  EXPECT_DOUBLE_EQ(meter.plain_scale(), 1.1);
  // Four pages priced at 1 ms each; the step took 5 ms more than its baseline (22 ms): 1.25 ms a
  // page, 20% off (|1.25 - 1| / 1.25).
  const auto m = meter.Observe(Rebuilding(20.0, 27.0, 4, 3.2, 4.0));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->pages, 4);
  EXPECT_DOUBLE_EQ(m->predicted_page_ms, 1.0);
  EXPECT_NEAR(m->measured_page_ms, 1.25, 1e-12);
  EXPECT_NEAR(m->measured_ms, 5.0, 1e-12);
  EXPECT_DOUBLE_EQ(m->model_ms, 3.2);

  MetricsRecorder recorder;
  recorder.CountRebuiltInStep(m->pages, m->predicted_page_ms, m->measured_page_ms);
  // A second step: two pages priced 2 ms each, measured 3 ms each over a baseline at 30 ms
  // calibrated (33 ms): 33% off.
  const auto m2 = meter.Observe(Rebuilding(30.0, 39.0, 2, 4.0, 4.0));
  ASSERT_TRUE(m2.has_value());
  recorder.CountRebuiltInStep(m2->pages, m2->predicted_page_ms, m2->measured_page_ms);
  EngineMetrics metrics;
  recorder.Snapshot(&metrics);
  const KvActionCounter& in_step = metrics.kv_rebuilt_in_step;
  EXPECT_EQ(in_step.pages, 6);
  EXPECT_EQ(in_step.pages_restored, 6);
  EXPECT_NEAR(in_step.predicted_ms, 8.0, 1e-9);
  EXPECT_NEAR(in_step.measured_ms, 11.0, 1e-9);
  // One pair per page: four at 20%, two at 33.3%; the median (3rd of 6) 20%, p90 (6th) 33.3%.
  EXPECT_EQ(in_step.error.samples, 6);
  EXPECT_NEAR(in_step.error.median_pct, 20.0, 1e-9);
  EXPECT_NEAR(in_step.error.p90_pct, 100.0 / 3.0, 1e-9);
  // The per-action windows are not touched: a rebuild on its own is another cost.
  EXPECT_EQ(metrics.kv_actions[static_cast<size_t>(KvAction::kRecomputeResidual)].error.samples, 0);
}

TEST(InStepRebuildMeterTest, BaselineIsTheMedianOfRecentPlainSteps) {
  InStepRebuildMeter meter;
  EXPECT_DOUBLE_EQ(meter.plain_scale(), 1.0);  // nothing seen: the calibration as it is
  // Without plain steps the calibrated step is the baseline.
  auto m = meter.Observe(Rebuilding(10.0, 12.0, 1, 1.0, 1.0));
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->measured_page_ms, 2.0, 1e-12);
  // One disturbed plain step among three does not move the baseline.
  meter.Observe(Plain(10.0, 9.0));
  meter.Observe(Plain(10.0, 40.0));
  meter.Observe(Plain(10.0, 9.0));
  EXPECT_DOUBLE_EQ(meter.plain_scale(), 0.9);
  // Only the last kPlainWindow plain steps count.
  for (size_t i = 0; i < InStepRebuildMeter::kPlainWindow; ++i) meter.Observe(Plain(10.0, 15.0));
  EXPECT_DOUBLE_EQ(meter.plain_scale(), 1.5);
  // A step that ran faster than its baseline measures its rebuilds as free, not negative.
  m = meter.Observe(Rebuilding(10.0, 14.0, 2, 1.0, 1.0));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->measured_ms, 0.0);
  // No calibrated step (a profile without decode step times): nothing measured, no baseline moved.
  EXPECT_FALSE(meter.Observe(Rebuilding(0.0, 14.0, 2, 1.0, 1.0)).has_value());
  EXPECT_FALSE(meter.Observe(Plain(0.0, 50.0)).has_value());
  EXPECT_DOUBLE_EQ(meter.plain_scale(), 1.5);
}

// The measured ratio feeds the in-step key of the corrections, which prices the next page's
// rebuild in decode; until it has any, rebuilds in the step follow the correction of rebuilds on
// their own.
TEST(InStepRebuildMeterTest, MeasuredRebuildsCorrectTheInStepPrice) {
  BringBackFeedback feedback(kNumFeedbackKeys);
  EXPECT_DOUBLE_EQ(InStepRebuildCorrection(&feedback), 1.0);
  feedback.Observe(static_cast<size_t>(KvAction::kRecomputeResidual), 1.0, 3.0);
  EXPECT_DOUBLE_EQ(InStepRebuildCorrection(&feedback), 3.0);
  InStepRebuildMeter meter;
  const auto m = meter.Observe(Rebuilding(20.0, 25.0, 4, 4.0, 4.0));  // 5 ms for 4 ms priced
  ASSERT_TRUE(m.has_value());
  BringBackBatch batch(kNumFeedbackKeys);
  batch.Add(kInStepRebuildFeedbackKey, m->model_ms, m->measured_ms);
  batch.FeedTo(&feedback);
  EXPECT_DOUBLE_EQ(InStepRebuildCorrection(&feedback), 1.25);
  EXPECT_DOUBLE_EQ(feedback.Scale(static_cast<size_t>(KvAction::kRecomputeResidual)), 3.0);
  // A seed from the profile counts as measured too.
  BringBackFeedback seeded(kNumFeedbackKeys);
  seeded.Observe(static_cast<size_t>(KvAction::kRecomputeResidual), 1.0, 3.0);
  seeded.Seed(kInStepRebuildFeedbackKey, 0.5);
  EXPECT_DOUBLE_EQ(InStepRebuildCorrection(&seeded), 0.5);
  EXPECT_DOUBLE_EQ(InStepRebuildCorrection(nullptr), 1.0);
}

}  // namespace
}  // namespace kvl
