// Random weight matrices in a stored format and random activations, for the MatMul tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"

namespace kvl::ops {

struct Weights {
  DType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> dequant;  // [rows][cols]
  MatrixView view() const { return {type, bytes.data(), rows, cols, RowBytes(type, cols)}; }
};

// N(0, 1) weights quantized to `type`. With varied_scales, row r is scaled by 2^(r % 7 - 3) and
// every fifth row has one outlier (40x), so block scales differ widely between rows and blocks.
inline Weights MakeWeights(DType type, int64_t rows, int64_t cols, uint32_t seed,
                           bool varied_scales = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Weights w{type, rows, cols, {}, {}};
  const int64_t rb = RowBytes(type, cols);
  w.bytes.resize(static_cast<size_t>(rb * rows));
  w.dequant.resize(static_cast<size_t>(rows * cols));
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = varied_scales ? std::ldexp(1.0f, static_cast<int>(r % 7) - 3) : 1.0f;
    for (float& v : row) v = dist(rng) * mag;
    if (varied_scales && r % 5 == 0) row[r % cols] = 40.0f * mag;
    quant::QuantizeRow(type, row.data(), cols, w.bytes.data() + r * rb);
    quant::DequantizeRow(type, w.bytes.data() + r * rb, cols, w.dequant.data() + r * cols);
  }
  return w;
}

inline std::vector<float> RandomVec(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// MatMul of n tokens of x by w on a fresh pool of `threads` and a context of `isa`; outputs start
// as NaN, so a row the kernel skipped shows.
inline std::vector<float> RunPackedMatMul(Isa isa, int threads, const MatrixView& w, const float* x,
                                          int64_t n) {
  ThreadPool pool(threads);
  OpsContext ctx(isa, &pool);
  ctx.Reserve(n, w.cols);
  std::vector<float> y(static_cast<size_t>(n * w.rows), NAN);
  MatMul(ctx, w, x, n, y.data());
  return y;
}

// Bitwise, so -0 vs +0 or a NaN would show.
inline void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b,
                               const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    ASSERT_EQ(ua, ub) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

}  // namespace kvl::ops
