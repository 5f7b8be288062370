// The activations kvlattice computes as ggml's CPU does: Gemma's GeGLU with the f16-table tanh
// GELU, soft-capping, and soft-capped attention tiles, checked against the formulas written out
// here (in double where the formula is the reference) on every ISA this machine runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"

namespace kvl::ops {
namespace {

double GeluTanhReference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * x * (1.0 + 0.044715 * x * x)));
}

TEST(ActivationsTest, GeluFollowsGgmlsF16Table) {
  // Outside (-10, 10) ggml passes x through (or 0); inside, the f16 table: gelu(f16(x)), rounded
  // to f16. So the result is an f16 value within f16 rounding of the exact GELU of f16(x).
  EXPECT_EQ(GeluTanhF16(-10.0f), 0.0f);
  EXPECT_EQ(GeluTanhF16(-12.5f), 0.0f);
  EXPECT_EQ(GeluTanhF16(10.0f), 10.0f);
  EXPECT_EQ(GeluTanhF16(17.25f), 17.25f);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-9.99f, 9.99f);
  for (int i = 0; i < 20000; ++i) {
    const float x = dist(rng);
    const float y = GeluTanhF16(x);
    EXPECT_EQ(quant::Fp16ToFp32(quant::Fp32ToFp16(y)), y) << x;  // an f16 value
    const double want = GeluTanhReference(quant::Fp16ToFp32(quant::Fp32ToFp16(x)));
    // f16 rounding of the result (2^-11 relative), and for x << 0 the float cancellation in
    // 1 + tanhf(...) that ggml's formula has too (up to |x| * 2^-24 absolute).
    EXPECT_NEAR(y, want, std::abs(want) * 1e-3 + std::abs(x) * 1.2e-7) << x;
  }
  // Two inputs that round to the same f16 give the same output (a table, not a formula).
  EXPECT_EQ(GeluTanhF16(1.0001f), GeluTanhF16(1.0f));
}

TEST(ActivationsTest, GeGluIsGeluOfGateTimesUpOnEveryIsa) {
  ThreadPool pool(1);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> gate(1000), up(1000);
  for (size_t i = 0; i < gate.size(); ++i) {
    gate[i] = dist(rng);
    up[i] = dist(rng);
  }
  gate[0] = -11.0f;
  gate[1] = 12.0f;
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    std::vector<float> out = gate;
    GeGlu(ctx, out.data(), up.data(), static_cast<int64_t>(out.size()));
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], GeluTanhF16(gate[i]) * up[i]) << IsaName(isa) << " " << i;
    }
  }
}

// Long rows over two threads (several chunks, a partial last one) with the values where a
// conversion could differ: f16 rounding ties, f16 subnormals, values beyond f16's range (only
// outside (-10, 10)), the edges +-10, infinities and NaN; bit for bit the scalar definition.
TEST(ActivationsTest, GeGluMatchesScalarBitsOnLongRowsAndEdgeValues) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t n = 6912 + 37;  // Gemma-3-1B's FFN, and a partial chunk
  std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
  for (size_t i = 0; i < gate.size(); ++i) {
    gate[i] = dist(rng);
    up[i] = dist(rng);
  }
  const float edges[] = {-10.0f,
                         10.0f,
                         std::nextafter(-10.0f, 0.0f),
                         std::nextafter(10.0f, 0.0f),
                         1.0f + 1.0f / 2048.0f,  // halfway between two f16 values: ties to even
                         1.0f + 3.0f / 2048.0f,
                         3.0e-6f,  // f16 subnormal
                         -3.0e-8f,  // below f16's smallest subnormal
                         1e6f,
                         -1e6f,
                         INFINITY,
                         -INFINITY,
                         NAN,
                         0.0f,
                         -0.0f};
  for (size_t i = 0; i < std::size(edges); ++i) gate[1000 * i + 3] = edges[i];
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    std::vector<float> out = gate;
    GeGlu(ctx, out.data(), up.data(), n);
    for (size_t i = 0; i < out.size(); ++i) {
      const float want = GeluTanhF16(gate[i]) * up[i];
      uint32_t got_bits, want_bits;
      std::memcpy(&got_bits, &out[i], 4);
      std::memcpy(&want_bits, &want, 4);
      ASSERT_EQ(got_bits, want_bits) << IsaName(isa) << " " << i << " gate " << gate[i];
    }
  }
}

TEST(ActivationsTest, SoftCapBoundsAndKeepsSmallValues) {
  std::vector<float> x = {0.0f, 0.01f, -0.01f, 3.0f, -3.0f, 100.0f, -1000.0f};
  std::vector<float> y = x;
  SoftCap(y.data(), static_cast<int64_t>(y.size()), 5.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], 5.0 * std::tanh(x[i] / 5.0), 1e-5) << x[i];
    EXPECT_LE(std::abs(y[i]), 5.0f);
  }
  EXPECT_NEAR(y[1], 0.01f, 1e-6f);  // near zero the cap is the identity
  EXPECT_GT(y[3], 2.5f);
  EXPECT_LT(y[3], 3.0f);            // 3 under a cap of 5 is bent down: tanh bites
}

// A soft-capped tile: softmax(cap * tanh(scale q.k / cap)) v against a double reference, on
// every ISA (they all run the scalar kernel for capped tiles, so they agree bit for bit).
TEST(ActivationsTest, SoftCappedAttentionTileMatchesTheFormulaOnEveryIsa) {
  const int64_t d = 64, width = AttentionTileTokens(d), count = 37;
  const float scale = 0.125f, cap = 2.0f;
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> q(d), k(count * d), v(count * d);
  for (float& x : q) x = dist(rng);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  // Reference in double.
  std::vector<double> s(count), want(d, 0.0);
  double max_s = -1e300, sum = 0.0;
  for (int64_t j = 0; j < count; ++j) {
    double dot = 0.0;
    for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[j * d + c];
    s[j] = cap * std::tanh(scale * dot / cap);
    max_s = std::max(max_s, s[j]);
  }
  for (int64_t j = 0; j < count; ++j) sum += std::exp(s[j] - max_s);
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t c = 0; c < d; ++c) want[c] += std::exp(s[j] - max_s) / sum * v[j * d + c];
  }
  ThreadPool pool(1);
  std::vector<float> first;
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    std::vector<float> kt_storage(static_cast<size_t>(kAttentionTileFloats + 16));
    auto* kt = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(kt_storage.data()) + 63) &
                                        ~uintptr_t{63});
    PackAttentionKeys(ctx, DType::kF32, k.data(), d, count, d, kt, width, 0);
    std::vector<const float*> v_rows(static_cast<size_t>(count));
    for (int64_t j = 0; j < count; ++j) v_rows[static_cast<size_t>(j)] = &v[j * d];
    std::vector<float> acc(d, 0.0f);
    float m = -INFINITY, l = 0.0f;
    const float* q_row = q.data();
    float* acc_row = acc.data();
    AttentionRows rows;
    rows.num_rows = 1;
    rows.q = &q_row;
    rows.m = &m;
    rows.l = &l;
    rows.acc = &acc_row;
    rows.softcap = cap;
    AttentionTile(ctx, kt, width, v_rows.data(), count, d, scale, rows);
    for (int64_t c = 0; c < d; ++c) {
      EXPECT_NEAR(acc[c] / l, want[c], 1e-4) << IsaName(isa) << " channel " << c;
      acc[c] /= l;
    }
    if (first.empty()) {
      first = acc;
    } else {
      EXPECT_EQ(acc, first) << IsaName(isa);
    }
  }
}

}  // namespace
}  // namespace kvl::ops
