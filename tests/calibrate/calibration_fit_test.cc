// The curve fits of calibration: exact on points a curve of their form produced, terms the
// points cannot show dropped rather than made negative, and held-out measured points predicted
// (that last one is in calibration_test.cc, beside the measured profile it uses).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kvl/calibration.h"

namespace kvl {
namespace {

TEST(CurveFitTest, RecoversTheCoefficientsOfARecomputeCurve) {
  const RecomputeCurve truth{0.3, 0.05, 2e-3, 4e-7, {}};
  std::vector<RecomputePoint> points;
  for (int64_t t : {16, 64, 256, 1024}) {
    for (int64_t l : {1, 11, 22}) {
      for (int64_t p : {0, 512, 2048}) points.push_back({t, l, p, truth.Ms(t, l, p)});
    }
  }
  const RecomputeCurve fit = FitRecomputeCurve(points);
  EXPECT_NEAR(fit.call_ms, truth.call_ms, 1e-9);
  EXPECT_NEAR(fit.layer_ms, truth.layer_ms, 1e-9);
  EXPECT_NEAR(fit.token_layer_ms, truth.token_layer_ms, 1e-12);
  EXPECT_NEAR(fit.context_token_layer_ms, truth.context_token_layer_ms, 1e-15);
  EXPECT_EQ(fit.points, points);  // kept for --explain and the profile
}

TEST(CurveFitTest, RecoversLatencyAndBandwidthOfATransferCurve) {
  const TransferCurve truth{0.02, 0.004, 6.5, 0, 0, {}};
  std::vector<TransferPoint> points;
  for (int64_t n : {1, 8, 22}) {
    for (int64_t b : {4096, 65536, 1 << 20}) points.push_back({n, b, truth.Ms(n, b)});
  }
  const TransferCurve fit = FitTransferCurve(points);
  EXPECT_NEAR(fit.call_ms, 0.02, 1e-9);
  EXPECT_NEAR(fit.page_ms, 0.004, 1e-9);
  EXPECT_NEAR(fit.gbps, 6.5, 1e-6);
}

// Transfers as calibration times them: 1 and 8 pages of small sizes (inside the caches), then
// page sets of 8 pages up to 64 MiB a call, beyond them.
std::vector<TransferPoint> TransferPoints(const TransferCurve& truth, double noise_amplitude) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> noise(1 - noise_amplitude, 1 + noise_amplitude);
  std::vector<TransferPoint> points;
  for (int64_t b : {4096, 65536, 262144}) {
    for (int64_t n : {1, 8}) points.push_back({n, b, truth.Ms(n, b) * noise(rng)});
  }
  for (int64_t b : {1 << 20, 2 << 20, 8 << 20}) points.push_back({8, b, truth.Ms(8, b) * noise(rng)});
  return points;
}

TEST(CurveFitTest, ATransferCurveSwitchesBandwidthWhereTheCallsLeaveTheCaches) {
  // 12 GB/s up to 8 MiB a call, 5 GB/s beyond: a RAM copy whose large page sets come from DRAM.
  TransferCurve truth{0.02, 0.004, 12.0, 8 << 20, 5.0, {}};
  EXPECT_NEAR(truth.Ms(8, 1 << 20), 0.02 + 0.032 + (8 << 20) / 12e6, 1e-12);
  EXPECT_NEAR(truth.Ms(8, 2 << 20), 0.02 + 0.032 + (8 << 20) / 12e6 + (8 << 20) / 5e6, 1e-12);
  const std::vector<TransferPoint> points = TransferPoints(truth, 0);
  const TransferCurve fit = FitTransferCurve(points);
  EXPECT_EQ(fit.knee_bytes, 8 << 20);
  EXPECT_NEAR(fit.gbps, 12.0, 1e-6);
  EXPECT_NEAR(fit.large_gbps, 5.0, 1e-6);
  EXPECT_NEAR(fit.call_ms, 0.02, 1e-9);
  EXPECT_NEAR(fit.page_ms, 0.004, 1e-9);
  // Every point within 1%, the largest page sets included: one line through them all misses the
  // large ones by far more (it averages the two rates).
  for (const TransferPoint& p : points) {
    EXPECT_NEAR(fit.Ms(p.pages, p.page_bytes) / p.ms, 1.0, 0.01) << p.pages << " x " << p.page_bytes;
  }
  // Beyond the last point, at the DRAM rate: a 1 GiB page set.
  EXPECT_NEAR(fit.Ms(32, 32 << 20), truth.Ms(32, 32 << 20), 1e-6 * truth.Ms(32, 32 << 20));
  // The bandwidth a page set averages: the cache rate below the knee, tending to the DRAM rate.
  EXPECT_NEAR(fit.EffectiveGbps(1 << 20), 12.0, 1e-6);
  EXPECT_LT(fit.EffectiveGbps(64 << 20), 6.0);
  EXPECT_GT(fit.EffectiveGbps(64 << 20), 5.0);
}

TEST(CurveFitTest, OneBandwidthWithNoiseFitsNoKnee) {
  // 3% noise on one line: a knee would fit the noise, not a change of rate.
  const TransferCurve truth{0.02, 0.004, 8.0, 0, 0, {}};
  const TransferCurve fit = FitTransferCurve(TransferPoints(truth, 0.03));
  EXPECT_EQ(fit.knee_bytes, 0);
  EXPECT_EQ(fit.large_gbps, 0);
  EXPECT_NEAR(fit.gbps, 8.0, 0.5);
  // A faster rate beyond the caches is not a knee either (noise, or a cache the points missed).
  TransferCurve faster{0.02, 0.004, 5.0, 8 << 20, 12.0, {}};
  EXPECT_EQ(FitTransferCurve(TransferPoints(faster, 0)).knee_bytes, 0);
}

TEST(CurveFitTest, ATermThePointsCannotShowIsZeroNotNegative) {
  // Every point at position 0 (a residual rebuild): the context term is invisible, and noise on
  // a tiny call term must not turn it negative.
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  std::vector<RecomputePoint> points;
  for (int64_t t : {16, 64, 256, 1024, 4096}) {
    for (int64_t l : {1, 2, 4}) points.push_back({t, l, 0, 1e-3 * t * l * noise(rng)});
  }
  const RecomputeCurve fit = FitRecomputeCurve(points);
  EXPECT_EQ(fit.context_token_layer_ms, 0);
  EXPECT_GE(fit.call_ms, 0);
  EXPECT_GE(fit.layer_ms, 0);
  EXPECT_NEAR(fit.token_layer_ms, 1e-3, 1e-4);
  // Relative error: the 16-token points are fitted as well as the 4096-token ones.
  for (const RecomputePoint& p : points) {
    EXPECT_NEAR(fit.Ms(p.tokens, p.layers, 0) / p.ms, 1.0, 0.1) << p.tokens << " x " << p.layers;
  }
}

TEST(CurveFitTest, NoPointsGiveAZeroCurve) {
  const RecomputeCurve r = FitRecomputeCurve({});
  EXPECT_EQ(r.Ms(16, 4, 100), 0);
  const TransferCurve t = FitTransferCurve({});
  EXPECT_EQ(t.Ms(4, 4096), 0);
}

}  // namespace
}  // namespace kvl
