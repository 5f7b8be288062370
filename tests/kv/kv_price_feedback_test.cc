// BringBackFeedback: the cost model's bring-back times corrected by the measured ones, per key,
// as the median of measured / predicted over the last events.
#include "kvl/kv_price_feedback.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvl {
namespace {

TEST(BringBackFeedbackTest, NoCorrectionBeforeTheFirstEventThenTheMedianRatio) {
  BringBackFeedback f(3);
  EXPECT_EQ(f.Scale(1), 1.0);
  f.Observe(1, 2.0, 3.0);  // 1.5x slower than predicted
  EXPECT_DOUBLE_EQ(f.Scale(1), 1.5);  // the first event moves the price (kMinSamples)
  f.Observe(1, 1.0, 2.0);             // 2x
  EXPECT_DOUBLE_EQ(f.Scale(1), 1.75);  // the median of {1.5, 2}
  f.Observe(1, 1.0, 1.6);              // 1.6x
  EXPECT_DOUBLE_EQ(f.Scale(1), 1.6);   // the median of {1.5, 1.6, 2}
  // Keys are apart.
  EXPECT_EQ(f.Scale(0), 1.0);
  EXPECT_EQ(f.Scale(2), 1.0);
  EXPECT_EQ(f.samples(1), 3u);
  EXPECT_EQ(f.Scale(7), 1.0);  // an unknown key is not corrected
  f.Observe(7, 1.0, 2.0);      // and not fed
  EXPECT_EQ(f.samples(7), 0u);
}

TEST(BringBackFeedbackTest, OneDisturbedEventDoesNotMoveThePrice) {
  BringBackFeedback f(1);
  for (int i = 0; i < 6; ++i) f.Observe(0, 1.0, 0.5);  // the model is 2x pessimistic
  f.Observe(0, 1.0, 3.9);                               // one restore behind a busy core
  EXPECT_DOUBLE_EQ(f.Scale(0), 0.5);
}

TEST(BringBackFeedbackTest, TheWindowForgetsOldEvents) {
  BringBackFeedback f(1);
  for (size_t i = 0; i < BringBackFeedback::kWindow; ++i) f.Observe(0, 1.0, 3.0);
  EXPECT_DOUBLE_EQ(f.Scale(0), 3.0);
  // The machine got quieter: after a window of new events only they count.
  for (size_t i = 0; i < BringBackFeedback::kWindow / 2; ++i) f.Observe(0, 1.0, 1.5);
  EXPECT_GT(f.Scale(0), 1.5);
  for (size_t i = 0; i < BringBackFeedback::kWindow / 2 + 1; ++i) f.Observe(0, 1.0, 1.5);
  EXPECT_DOUBLE_EQ(f.Scale(0), 1.5);
  EXPECT_EQ(f.samples(0), BringBackFeedback::kWindow);
}

TEST(BringBackFeedbackTest, CorrectionsAreBounded) {
  BringBackFeedback f(2);
  for (int i = 0; i < 4; ++i) {
    f.Observe(0, 1.0, 100.0);
    f.Observe(1, 100.0, 1.0);
  }
  EXPECT_EQ(f.Scale(0), BringBackFeedback::kMaxScale);
  EXPECT_EQ(f.Scale(1), BringBackFeedback::kMinScale);
}

TEST(BringBackFeedbackTest, UnmeasuredOrUnpricedPairsAreIgnored) {
  BringBackFeedback f(1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  f.Observe(0, 0.0, 1.0);  // no prediction (no profile)
  f.Observe(0, 1.0, 0.0);  // below the clock's resolution
  f.Observe(0, nan, 1.0);
  f.Observe(0, 1.0, inf);
  f.Observe(0, -1.0, 1.0);
  EXPECT_EQ(f.samples(0), 0u);
  EXPECT_EQ(f.Scale(0), 1.0);
}

TEST(BringBackBatchTest, AnEventsPagesAreOneObservationPerKey) {
  BringBackFeedback f(4);
  BringBackBatch batch(4);
  for (int i = 0; i < 10; ++i) batch.Add(3, 0.1, 0.2);  // ten pages predicted at 0.1 ms, 0.2 taken
  batch.Add(1, 0.4, 0.2);                                // one page of another key
  batch.FeedTo(&f);
  EXPECT_EQ(f.samples(3), 1u);  // one event, not ten
  EXPECT_EQ(f.samples(1), 1u);
  batch.FeedTo(&f);  // emptied: nothing more observed
  EXPECT_EQ(f.samples(3), 1u);
  // The ratio observed is the key's measured sum over its model sum: 2.0 ms / 1.0 ms.
  for (int i = 0; i < 10; ++i) batch.Add(3, 0.1, 0.2);
  batch.FeedTo(&f);
  EXPECT_DOUBLE_EQ(f.Scale(3), 2.0);
  // 0.2 ms measured against 0.4 predicted.
  batch.Add(1, 0.4, 0.2);
  batch.FeedTo(&f);
  EXPECT_DOUBLE_EQ(f.Scale(1), 0.5);
  // A null feedback (--no-kv-feedback) is fine and still empties the batch.
  batch.Add(2, 1.0, 1.0);
  batch.FeedTo(nullptr);
  batch.FeedTo(&f);
  EXPECT_EQ(f.samples(2), 0u);
}

TEST(BringBackBatchTest, PagesOfDifferentKeysInOneEventKeepTheirOwnTimes) {
  // A restore that brought back a slow disk page and fast RAM pages: each key sees its own
  // pages' times, not the event's average (which would call the disk page fast and RAM slow).
  BringBackFeedback f(2);
  BringBackBatch batch(2);
  batch.Add(0, 0.1, 0.12);                               // disk: predicted 0.1, took 0.12
  for (int i = 0; i < 9; ++i) batch.Add(1, 0.02, 0.03);  // RAM: predicted 0.02, took 0.03
  batch.FeedTo(&f);
  batch.Add(0, 0.1, 0.12);
  for (int i = 0; i < 9; ++i) batch.Add(1, 0.02, 0.03);
  batch.FeedTo(&f);
  EXPECT_NEAR(f.Scale(0), 1.2, 1e-9);
  EXPECT_NEAR(f.Scale(1), 1.5, 1e-9);
}

}  // namespace
}  // namespace kvl
