// The curves of a profile: fitting them to measured points and evaluating them.
//
// Each curve is linear in its coefficients, so fitting is least squares on a handful of
// features. The error minimized is relative ((fit - y) / y): the points span orders of magnitude
// (a 16-token page and a 4096-token one), and the cost model is judged by its relative error.
// Coefficients are physical times and rates and cannot be negative; a negative one means its
// term is not visible in the points (noise), so it is dropped (set to 0) and the rest refitted.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "kvl/calibration.h"

namespace kvl {
namespace {

constexpr size_t kMaxTerms = 4;
using Row = std::array<double, kMaxTerms>;

// Solves A x = b for a small dense system by Gaussian elimination with partial pivoting; false
// when A is singular (a term with no variation in the points).
bool Solve(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>* x) {
  const size_t n = b.size();
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    }
    // Relative to the diagonal's scale: features differ by orders of magnitude.
    double scale = 0;
    for (size_t r = 0; r < n; ++r) scale = std::max(scale, std::abs(a[r][col]));
    if (!(std::abs(a[pivot][col]) > 1e-12 * scale) || scale == 0) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (size_t r = col + 1; r < n; ++r) {
      const double f = a[r][col] / a[col][col];
      for (size_t c = col; c < n; ++c) a[r][c] -= f * a[col][c];
      b[r] -= f * b[col];
    }
  }
  x->assign(n, 0);
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t c = i + 1; c < n; ++c) s -= a[i][c] * (*x)[c];
    (*x)[i] = s / a[i][i];
  }
  return true;
}

// Non-negative least squares of y ~ sum_k coef[k] * features[k] on the relative error, over the
// terms in `active` (the others stay 0). A small active set: drop the most negative coefficient,
// or a term that makes the system singular, and solve again.
Row FitNonNegative(const std::vector<Row>& features, const std::vector<double>& y,
                   std::array<bool, kMaxTerms> active) {
  Row coef{};
  while (true) {
    std::vector<size_t> terms;
    for (size_t k = 0; k < kMaxTerms; ++k) {
      if (active[k]) terms.push_back(k);
    }
    if (terms.empty()) return Row{};
    const size_t n = terms.size();
    std::vector<std::vector<double>> ata(n, std::vector<double>(n, 0));
    std::vector<double> atb(n, 0);
    for (size_t i = 0; i < y.size(); ++i) {
      if (!(y[i] > 0)) continue;
      const double w = 1.0 / (y[i] * y[i]);  // relative error: each residual divided by y
      for (size_t r = 0; r < n; ++r) {
        atb[r] += w * features[i][terms[r]] * y[i];
        for (size_t c = 0; c < n; ++c) ata[r][c] += w * features[i][terms[r]] * features[i][terms[c]];
      }
    }
    std::vector<double> x;
    if (!Solve(ata, atb, &x)) {
      active[terms.back()] = false;  // no variation along the last term: the others carry it
      continue;
    }
    size_t worst = n;
    for (size_t r = 0; r < n; ++r) {
      if (x[r] < 0 && (worst == n || x[r] < x[worst])) worst = r;
    }
    if (worst != n) {
      active[terms[worst]] = false;
      continue;
    }
    coef = Row{};
    for (size_t r = 0; r < n; ++r) coef[terms[r]] = x[r];
    return coef;
  }
}

// Sum over the points of ((fit - y) / y)^2: what FitNonNegative minimizes.
double RelativeSquaredError(const std::vector<Row>& features, const std::vector<double>& y,
                            const Row& coef) {
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!(y[i] > 0)) continue;
    double fit = 0;
    for (size_t k = 0; k < kMaxTerms; ++k) fit += coef[k] * features[i][k];
    sum += (fit - y[i]) * (fit - y[i]) / (y[i] * y[i]);
  }
  return sum;
}

}  // namespace

double AttendedPositions(int64_t tokens, int64_t position) {
  return static_cast<double>(position) + 0.5 * static_cast<double>(tokens + 1);
}

double RecomputeCurve::Ms(int64_t tokens, int64_t layers, int64_t position) const {
  const double t = static_cast<double>(tokens);
  const double l = static_cast<double>(layers);
  return call_ms + layer_ms * l + token_layer_ms * t * l +
         context_token_layer_ms * t * AttendedPositions(tokens, position) * l;
}

double TransferCurve::Ms(int64_t pages, int64_t page_bytes) const {
  return call_ms + page_ms * static_cast<double>(pages) + BytesMs(pages * page_bytes);
}

double TransferCurve::BytesMs(int64_t bytes) const {
  const double b = static_cast<double>(bytes);
  if (knee_bytes <= 0 || b <= static_cast<double>(knee_bytes)) {
    return gbps > 0 ? b / (gbps * 1e6) : 0.0;
  }
  const double knee = static_cast<double>(knee_bytes);
  return (gbps > 0 ? knee / (gbps * 1e6) : 0.0) +
         (large_gbps > 0 ? (b - knee) / (large_gbps * 1e6) : 0.0);
}

const TransferCurve& TierCurves::ReadFor(int64_t working_set_bytes, int64_t cache_bytes) const {
  const bool fits = working_set_bytes > 0 && cache_bytes > 0 && working_set_bytes <= cache_bytes;
  return fits && !warm_read.points.empty() ? warm_read : read;
}

double TransferCurve::EffectiveGbps(int64_t bytes) const {
  const double ms = BytesMs(bytes);
  return ms > 0 ? static_cast<double>(bytes) / (ms * 1e6) : gbps;
}

RecomputeCurve FitRecomputeCurve(std::vector<RecomputePoint> points) {
  std::vector<Row> features;
  std::vector<double> y;
  for (const RecomputePoint& p : points) {
    const double t = static_cast<double>(p.tokens);
    const double l = static_cast<double>(p.layers);
    features.push_back({1.0, l, t * l, t * AttendedPositions(p.tokens, p.position) * l});
    y.push_back(p.ms);
  }
  // A term the points do not vary cannot be told apart from another: points at one depth only
  // (a forward pass runs every layer) show the per-call and per-layer parts as one, kept as per
  // layer; points at position 0 only (a residual rebuild, which attends to nothing) fit no
  // attention term.
  bool layers_vary = false, positions_vary = false;
  for (const RecomputePoint& p : points) {
    layers_vary = layers_vary || p.layers != points.front().layers;
    positions_vary = positions_vary || p.position != points.front().position;
  }
  const Row c = FitNonNegative(features, y, {layers_vary, true, true, positions_vary});
  RecomputeCurve curve;
  curve.call_ms = c[0];
  curve.layer_ms = c[1];
  curve.token_layer_ms = c[2];
  curve.context_token_layer_ms = c[3];
  curve.points = std::move(points);
  return curve;
}

TransferCurve FitTransferCurve(std::vector<TransferPoint> points) {
  // The single line first: latency per call and per page, one bandwidth.
  auto features_for = [&](int64_t knee) {
    std::vector<Row> features;
    for (const TransferPoint& p : points) {
      const double n = static_cast<double>(p.pages);
      // Milliseconds per GB/s of bandwidth: each bytes term is fitted as its inverse.
      const double bytes = n * static_cast<double>(p.page_bytes);
      const double below = knee > 0 ? std::min(bytes, static_cast<double>(knee)) : bytes;
      features.push_back({1.0, n, below / 1e6, (bytes - below) / 1e6});
    }
    return features;
  };
  std::vector<double> y;
  for (const TransferPoint& p : points) y.push_back(p.ms);
  // Points of one page count show the per-call and per-page parts as one, kept as per page.
  bool pages_vary = false;
  for (const TransferPoint& p : points) pages_vary = pages_vary || p.pages != points.front().pages;
  std::vector<Row> features = features_for(0);
  Row c = FitNonNegative(features, y, {pages_vary, true, true, false});
  double error = RelativeSquaredError(features, y, c);
  int64_t knee = 0;

  // Then a second bandwidth above each measured call size with at least kMinPointsAboveKnee
  // points beyond it (fewer would fit one noisy point exactly). Kept where it is slower than the
  // first (data leaving the caches; a faster one is noise) and explains the points clearly better
  // than the line: its relative squared error below kKneeErrorRatio of the line's.
  constexpr size_t kMinPointsAboveKnee = 2;
  constexpr double kKneeErrorRatio = 0.75;
  const double line_error = error;
  for (const TransferPoint& candidate : points) {
    const int64_t bytes = candidate.pages * candidate.page_bytes;
    size_t above = 0;
    for (const TransferPoint& p : points) above += p.pages * p.page_bytes > bytes ? 1 : 0;
    if (above < kMinPointsAboveKnee) continue;
    const std::vector<Row> f = features_for(bytes);
    const Row k = FitNonNegative(f, y, {pages_vary, true, true, true});
    if (!(k[3] > 0) || k[3] < k[2]) continue;
    const double e = RelativeSquaredError(f, y, k);
    if (e < kKneeErrorRatio * line_error && e < error) {
      error = e;
      c = k;
      knee = bytes;
    }
  }
  TransferCurve curve;
  curve.call_ms = c[0];
  curve.page_ms = c[1];
  curve.gbps = c[2] > 0 ? 1.0 / c[2] : 0.0;
  curve.knee_bytes = knee;
  curve.large_gbps = knee > 0 ? 1.0 / c[3] : 0.0;
  curve.points = std::move(points);
  return curve;
}

}  // namespace kvl
