// Speculative decoding's parts without a model: the drafters (prompt lookup, the suffix index
// over recent requests) and the cost model that decides the draft lengths.
#include <gtest/gtest.h>

#include <vector>

#include "engine/spec_cost.h"
#include "engine/spec_drafter.h"

namespace kvl {
namespace {

TEST(NgramDrafterTest, DraftsWhatFollowedTheLatestLongestMatch) {
  NgramDrafter d;
  std::vector<int32_t> draft;
  // "1 2 3" occurs twice before the tail; the latest occurrence is followed by 7 8.
  const std::vector<int32_t> context = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3};
  d.Draft(context, 4, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 8, 6, 1}));
  d.Draft(context, 2, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 8}));
  // A 4-gram match wins over a later 2-gram one.
  const std::vector<int32_t> longer = {5, 6, 7, 8, 40, 41, 7, 8, 50, 5, 6, 7, 8};
  d.Draft(longer, 2, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{40, 41}));
  // Nothing repeats: no draft.
  d.Draft(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, 4, &draft);
  EXPECT_TRUE(draft.empty());
}

// A match whose continuation reaches the context's end is a loop: the draft goes round it as
// long as asked (a small model repeating its sentence), not only to the context's end.
TEST(NgramDrafterTest, DraftsALoopAsLongAsAsked) {
  NgramDrafter d;
  std::vector<int32_t> draft;
  const std::vector<int32_t> context = {9, 1, 2, 3, 4, 1, 2, 3};
  d.Draft(context, 7, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{4, 1, 2, 3, 4, 1, 2}));
  EXPECT_EQ(d.last_kind(), 3);
  // A period of one token.
  d.Draft(std::vector<int32_t>{5, 7, 7, 7}, 4, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 7, 7, 7}));
}

TEST(SpecModeTest, AutoIsAModeAndABadNameIsRefused) {
  const StatusOr<SpecMode> mode = ParseSpecMode("auto");
  ASSERT_TRUE(mode.ok());
  EXPECT_EQ(*mode, SpecMode::kAuto);
  EXPECT_EQ(SpecModeName(SpecMode::kAuto), "auto");
  const StatusOr<SpecMode> bad = ParseSpecMode("always");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'always'"), std::string::npos);
}

TEST(SuffixDrafterTest, DraftsFromRecentRequestsAndStopsAtTheirEnd) {
  SuffixDrafter d(1000);
  std::vector<int32_t> draft;
  d.Remember(std::vector<int32_t>{10, 11, 12, 13, 14, 15});
  // The sequence's own tokens have no match; the earlier request has "11 12".
  d.Draft(std::vector<int32_t>{99, 98, 11, 12}, 8, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{13, 14, 15}));  // not past the request's end
  // Its own tokens come first.
  d.Draft(std::vector<int32_t>{11, 12, 70, 71, 11, 12}, 2, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{70, 71}));
}

// An agent re-issuing a task: the new request's prompt is an earlier request's. Its own tokens
// offer a short match (the prompt's last two words occurred in it before); the ring holds the
// whole prompt followed by the earlier run's output, a longer match, and that output is drafted.
// As the new output goes on, the ring keeps the earlier output's continuation in step.
TEST(SuffixDrafterTest, AReissuedRequestDraftsTheEarlierRunsOutput) {
  SuffixDrafter d(1000);
  std::vector<int32_t> draft;
  const std::vector<int32_t> prompt = {1, 2, 30, 31, 32, 33, 34, 35, 36, 1, 2};
  const std::vector<int32_t> output = {50, 51, 52, 53, 54, 55};
  std::vector<int32_t> earlier = prompt;
  earlier.insert(earlier.end(), output.begin(), output.end());
  // Before anything is remembered, the sequence's own short match: what followed "1 2".
  d.Draft(prompt, 4, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{30, 31, 32, 33}));
  EXPECT_EQ(d.last_kind(), DraftKind(false, 2));
  d.Remember(earlier);
  d.Remember(std::vector<int32_t>{1, 2, 90, 91});  // a later request that ends with "1 2" too
  d.Draft(prompt, 4, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{50, 51, 52, 53}));
  EXPECT_EQ(d.last_kind(), DraftKind(true, static_cast<int64_t>(prompt.size())));
  std::vector<int32_t> going_on = prompt;
  going_on.insert(going_on.end(), {50, 51});
  d.Draft(going_on, 8, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{52, 53, 54, 55}));  // up to the earlier request's end
}

TEST(SuffixDrafterTest, DraftKindsSayTheSourceAndTheMatchLength) {
  EXPECT_EQ(DraftKind(false, 2), 2);
  EXPECT_EQ(DraftKind(false, 3), 3);
  EXPECT_EQ(DraftKind(false, 7), 4);
  EXPECT_EQ(DraftKind(false, 8), 5);
  EXPECT_EQ(DraftKind(false, kLongMatch), kLengthKinds);
  EXPECT_EQ(DraftKind(true, 2), 2 + kLengthKinds);
  EXPECT_LT(DraftKind(true, kLongMatch), kDraftKinds);
}

TEST(SuffixDrafterTest, ForgetsWhatTheRingOverwrote) {
  SuffixDrafter d(64);  // the smallest ring
  std::vector<int32_t> draft;
  d.Remember(std::vector<int32_t>{500, 501, 502, 503});
  std::vector<int32_t> filler(100);
  for (size_t i = 0; i < filler.size(); ++i) filler[i] = static_cast<int32_t>(1000 + i);
  d.Remember(filler);  // overwrites the first request
  EXPECT_LE(d.tokens_held(), 64);
  d.Draft(std::vector<int32_t>{7, 500, 501}, 4, &draft);
  EXPECT_TRUE(draft.empty());
  d.Draft(std::vector<int32_t>{7, 1090, 1091}, 4, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{1092, 1093, 1094, 1095}));
}

TEST(SpecCostTest, ExpectedTokensIsTheGeometricSum) {
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.5, 3), 1.875);
  EXPECT_DOUBLE_EQ(ExpectedTokens(1.0, 8), 9.0);
}

StepCostCurve CurveWithSlope(double slope, int64_t max_rows = 64) {
  StepCostCurve curve(max_rows);
  for (int i = 0; i < 8; ++i) {
    for (int64_t rows = 1; rows <= max_rows; ++rows) {
      curve.Observe(rows, 10.0 * (1.0 + slope * static_cast<double>(rows - 1)));
    }
  }
  return curve;
}

TEST(SpecCostTest, TheCurveFollowsWhatWasMeasured) {
  StepCostCurve curve(16);
  EXPECT_NEAR(curve.Relative(9), 1.0 + 8 * 0.02, 1e-9);  // the prior before any measurement
  for (int i = 0; i < 4; ++i) {
    curve.Observe(1, 10.0);
    curve.Observe(5, 14.0);
  }
  EXPECT_NEAR(curve.Relative(5), 1.4, 1e-9);          // measured
  EXPECT_NEAR(curve.Relative(9), 1.0 + 8 * 0.1, 1e-9);  // from the measured slope
}

// Sequences decoding together never make a one-row step: the curve is relative to the fewest
// rows it measured, and a step with more rows never costs less than that one.
TEST(SpecCostTest, TheCurveIsRelativeToTheFewestRowsMeasured) {
  StepCostCurve curve(32);
  for (int i = 0; i < 3; ++i) {
    curve.Observe(4, 10.0);
    curve.Observe(8, 12.0);
    curve.Observe(12, 9.0);  // a noisy measurement below the base step's
  }
  EXPECT_EQ(curve.reference(), 4);
  EXPECT_DOUBLE_EQ(curve.reference_ms(), 10.0);
  EXPECT_NEAR(curve.Relative(8), 1.2, 1e-9);
  EXPECT_NEAR(curve.Relative(12), 1.0, 1e-9);
  EXPECT_FALSE(curve.measured(6));
  EXPECT_GT(curve.Relative(6), 1.0);
}

// A step the machine's scheduler stalled does not move the curve: a row count's figure is the
// median of its recent steps.
TEST(SpecCostTest, AStalledStepDoesNotMoveTheCurve) {
  StepCostCurve curve(16);
  for (int i = 0; i < 8; ++i) {
    curve.Observe(1, 10.0);
    curve.Observe(5, 14.0);
  }
  curve.Observe(1, 100.0);  // preempted
  curve.Observe(5, 90.0);
  EXPECT_NEAR(curve.Relative(5), 1.4, 1e-9);
  EXPECT_DOUBLE_EQ(curve.reference_ms(), 10.0);
}

// A row count measured once, in a step the machine stalled, does not set the slope that the
// unmeasured row counts are priced by: a 7x 3-row step beside 2-, 4- and 5-row steps at their
// cost leaves a 9-row draft at about its real price (a mean of the slopes would put it at 4x,
// and such drafts would never be sent, nor measured, again).
TEST(SpecCostTest, OneStalledRowCountDoesNotSetTheSlope) {
  StepCostCurve curve(16);
  for (int i = 0; i < 4; ++i) {
    curve.Observe(1, 10.0);
    curve.Observe(2, 13.0);
    curve.Observe(4, 19.0);
    curve.Observe(5, 22.0);
  }
  curve.Observe(3, 70.0);  // preempted, and its row count's only measurement
  EXPECT_NEAR(curve.slope(), 0.3, 1e-9);
  EXPECT_NEAR(curve.Relative(9), 1.0 + 8 * 0.3, 1e-9);
}

// A draft model's own passes are part of a draft's price: a draft as dear as the target is not
// worth its tokens even when every token is accepted, a cheap one is.
TEST(SpecCostTest, TheDraftsOwnCostIsWeighed) {
  std::vector<SpecCandidate*> scratch;
  const StepCostCurve cheap = CurveWithSlope(0.03);
  std::vector<SpecCandidate> c = {{8, 0.95, 0}};
  ChooseDraftLengths(cheap, 1, 1, 64, c, &scratch, /*draft_cost=*/1.0);
  EXPECT_EQ(c[0].chosen, 0);
  ChooseDraftLengths(cheap, 1, 1, 64, c, &scratch, /*draft_cost=*/0.05);
  EXPECT_GE(c[0].chosen, 4);
}

TEST(SpecCostTest, DraftsWhereTheyPayAndNotWhereTheyDoNot) {
  std::vector<SpecCandidate*> scratch;
  // Bandwidth-bound (3% per extra row): a likely draft is sent, and long.
  const StepCostCurve cheap = CurveWithSlope(0.03);
  std::vector<SpecCandidate> c = {{8, 0.8, 0}};
  ChooseDraftLengths(cheap, 1, 1, 64, c, &scratch);
  EXPECT_GE(c[0].chosen, 4);
  // Prose the drafter cannot predict: nothing is sent.
  c = {{8, 0.05, 0}};
  ChooseDraftLengths(cheap, 1, 1, 64, c, &scratch);
  EXPECT_EQ(c[0].chosen, 0);
  // Compute-bound rows (each extra row costs a whole step): nothing pays either.
  const StepCostCurve dear = CurveWithSlope(1.0);
  c = {{8, 0.8, 0}};
  ChooseDraftLengths(dear, 1, 1, 64, c, &scratch);
  EXPECT_EQ(c[0].chosen, 0);
  // Many sequences in the step: the same draft is sent shorter than alone, or not at all.
  const StepCostCurve moderate = CurveWithSlope(0.1);
  c = {{8, 0.7, 0}};
  ChooseDraftLengths(moderate, 1, 1, 64, c, &scratch);
  const int64_t alone = c[0].chosen;
  std::vector<SpecCandidate> many(16, SpecCandidate{8, 0.7, 0});
  ChooseDraftLengths(moderate, 16, 16, 64, many, &scratch);
  EXPECT_GT(alone, 0);
  EXPECT_LT(many[15].chosen, alone);
  // Within the rows the step has left.
  std::vector<SpecCandidate> capped(4, SpecCandidate{8, 0.9, 0});
  ChooseDraftLengths(cheap, 4, 4, 10, capped, &scratch);
  int64_t rows = 0;
  for (const SpecCandidate& x : capped) rows += x.chosen;
  EXPECT_LE(rows, 10);
  EXPECT_GT(rows, 0);
}

}  // namespace
}  // namespace kvl
