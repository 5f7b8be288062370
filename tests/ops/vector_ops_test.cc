// RmsNorm, Rope, Softmax, SwiGlu, Add, Dot, Axpy on every runnable ISA against the scalar path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"
#include "ops/kernel_table.h"

namespace kvl::ops {
namespace {

std::vector<float> RandomVec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

constexpr int64_t kSizes[] = {1, 7, 15, 16, 17, 37, 64, 100, 1000, 2048};

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, float rel, const char* what,
                 Isa isa, int64_t n) {
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], rel * (std::fabs(b[i]) + 1e-30f) + 1e-7f)
        << what << " " << IsaName(isa) << " n " << n << " i " << i;
  }
}

class VectorOpsTest : public ::testing::Test {
 protected:
  ThreadPool pool_{1};
};

TEST_F(VectorOpsTest, MatchScalar) {
  OpsContext scalar(Isa::kScalar, &pool_);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool_);
    for (int64_t n : kSizes) {
      const std::vector<float> x = RandomVec(n, 1 + n, 2.0f), y0 = RandomVec(n, 2 + n);
      const std::vector<float> w = RandomVec(n, 3 + n);
      {  // RmsNorm, in place
        std::vector<float> a = x, b = x;
        RmsNorm(ctx, a.data(), w.data(), n, 1e-5f, a.data());
        RmsNorm(scalar, b.data(), w.data(), n, 1e-5f, b.data());
        ExpectClose(a, b, 1e-5f, "rmsnorm", isa, n);
      }
      {  // Softmax, including a -inf (masked) entry
        std::vector<float> a = x, b = x;
        a[n / 2] = b[n / 2] = -INFINITY;
        if (n == 1) a[0] = b[0] = 3.0f;
        Softmax(ctx, a.data(), n);
        Softmax(scalar, b.data(), n);
        ExpectClose(a, b, 1e-5f, "softmax", isa, n);
        if (n > 1) {
          EXPECT_EQ(a[n / 2], 0.0f);
        }
      }
      {  // SwiGlu, with large magnitudes to exercise exp's range
        std::vector<float> g = RandomVec(n, 4 + n, 30.0f), a = g, b = g;
        SwiGlu(ctx, a.data(), y0.data(), n);
        SwiGlu(scalar, b.data(), y0.data(), n);
        ExpectClose(a, b, 1e-5f, "swiglu", isa, n);
      }
      {
        std::vector<float> a = y0, b = y0;
        Add(ctx, a.data(), x.data(), n);
        Add(scalar, b.data(), x.data(), n);
        ExpectClose(a, b, 0.0f, "add", isa, n);
        a = y0, b = y0;
        Axpy(ctx, 0.37f, x.data(), a.data(), n);
        Axpy(scalar, 0.37f, x.data(), b.data(), n);
        ExpectClose(a, b, 1e-6f, "axpy", isa, n);
      }
      {
        double mag = 0;
        for (int64_t i = 0; i < n; ++i) mag += std::fabs(x[i] * y0[i]);
        EXPECT_NEAR(Dot(ctx, x.data(), y0.data(), n), Dot(scalar, x.data(), y0.data(), n), 1e-5 * mag + 1e-7)
            << IsaName(isa) << " n " << n;
        // Deterministic for a given ISA and size.
        EXPECT_EQ(Dot(ctx, x.data(), y0.data(), n), Dot(ctx, x.data(), y0.data(), n));
      }
    }
  }
}

// SwiGlu over the pool in chunks gives every element the bits one call of the ISA's kernel over
// the whole row gives (prefill rows of tokens x FFN values span several chunks; the last is
// partial and ends in the kernel's tail).
TEST(VectorOpsThreadsTest, SwiGluSplitOverThreadsIsOneCall) {
  ThreadPool pool(2);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int64_t n : {int64_t{16384 * 3 + 13}, int64_t{16384 * 2}, int64_t{40000 + 7}}) {
      const std::vector<float> g = RandomVec(n, 11, 30.0f), up = RandomVec(n, 12);
      std::vector<float> split = g, whole = g;
      SwiGlu(ctx, split.data(), up.data(), n);
      ctx.kernels().swiglu(whole.data(), up.data(), n);
      ASSERT_EQ(std::memcmp(split.data(), whole.data(), sizeof(float) * static_cast<size_t>(n)), 0)
          << IsaName(isa) << " n " << n;
    }
  }
}

TEST_F(VectorOpsTest, RopeMatchesScalarAndRotates) {
  OpsContext scalar(Isa::kScalar, &pool_);
  for (int64_t head_dim : {2, 8, 64, 80, 128}) {
    const int64_t n_heads = 3;
    std::vector<float> cos(head_dim / 2), sin(head_dim / 2);
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const float theta = 7.0f * std::pow(10000.0f, -2.0f * i / head_dim);
      cos[i] = std::cos(theta);
      sin[i] = std::sin(theta);
    }
    for (bool neox : {false, true}) {
      const std::vector<float> x = RandomVec(n_heads * head_dim, 9 + head_dim);
      std::vector<float> b = x;
      Rope(scalar, b.data(), n_heads, head_dim, cos.data(), sin.data(), neox);
      // The scalar path is itself checked against the definition on the first pair.
      const int64_t i1 = neox ? head_dim / 2 : 1;
      EXPECT_FLOAT_EQ(b[0], x[0] * cos[0] - x[i1] * sin[0]);
      EXPECT_FLOAT_EQ(b[i1], x[0] * sin[0] + x[i1] * cos[0]);
      for (Isa isa : RunnableIsas()) {
        OpsContext ctx(isa, &pool_);
        std::vector<float> a = x;
        Rope(ctx, a.data(), n_heads, head_dim, cos.data(), sin.data(), neox);
        ExpectClose(a, b, 0.0f, neox ? "rope neox" : "rope", isa, head_dim);
      }
    }
  }
}

TEST_F(VectorOpsTest, DequantizeRowWidens) {
  const std::vector<float> x = RandomVec(64, 5);
  std::vector<uint8_t> buf(64 * 4);
  std::vector<float> a(64), b(64);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    quant::QuantizeRow(t, x.data(), 64, buf.data());
    DequantizeRow(t, buf.data(), 64, a.data());
    quant::DequantizeRow(t, buf.data(), 64, b.data());
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace kvl::ops
