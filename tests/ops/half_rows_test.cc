// Attention over f16 / bf16 rows: on every ISA, DotRowsHalf / AxpyRowsHalf must give exactly what
// DotRows / AxpyRows give over the rows widened to f32 (so a half KV cache sums in the f32 cache's
// order), and NarrowRow must give the scalar reference's bits whatever the ISA.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"

namespace kvl::ops {
namespace {

constexpr DType kHalfTypes[] = {DType::kF16, DType::kBF16};
constexpr int64_t kSizes[] = {1, 7, 8, 16, 31, 32, 64, 100, 128};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Bit patterns, so that a different zero sign or NaN payload fails too.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = std::bit_cast<uint32_t>(v[i]);
  return bits;
}

// The scalar reference conversions (what the KV cache stores and what every ISA must match).
std::vector<uint16_t> NarrowRef(DType type, const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  quant::QuantizeRow(type, x.data(), static_cast<int64_t>(x.size()), out.data());
  return out;
}
std::vector<float> WidenRef(DType type, const std::vector<uint16_t>& h) {
  std::vector<float> out(h.size());
  quant::DequantizeRow(type, h.data(), static_cast<int64_t>(h.size()), out.data());
  return out;
}

// count rows of n values at the given stride, as a KV cache would store them: random values with
// a sprinkling of zeros, subnormals and large magnitudes, and garbage in the gaps between rows.
std::vector<uint16_t> RandomHalfRows(DType type, int64_t stride, int64_t count, int64_t n,
                                     uint32_t seed) {
  std::vector<float> x = Random(stride * count, seed);
  std::mt19937 rng(seed + 1);
  for (size_t i = 0; i < x.size(); ++i) {
    switch (rng() % 16) {
      case 0:
        x[i] = 0.0f;
        break;
      case 1:
        x[i] = -0.0f;
        break;
      case 2:
        x[i] *= 1e-6f;
        break;  // f16 subnormal range
      case 3:
        x[i] *= 3e4f;
        break;  // near the f16 maximum
      default:
        break;
    }
    if (static_cast<int64_t>(i) % stride >= n) x[i] = 12345.0f;  // never read
  }
  return NarrowRef(type, x);
}

TEST(HalfRowsTest, DotRowsHalfEqualsDotRowsOnWidenedRows) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kHalfTypes) {
      for (int64_t n : kSizes) {
        for (int64_t count = 1; count <= 37; ++count) {
          const int64_t stride = n + 3;
          const auto seed = static_cast<uint32_t>(n * 100 + count);
          const std::vector<uint16_t> rows = RandomHalfRows(type, stride, count, n, seed);
          const std::vector<float> wide = WidenRef(type, rows);
          const std::vector<float> q = Random(n, seed + 7);

          std::vector<float> expected(count), got(count, -1.0f);
          DotRows(ctx, q.data(), wide.data(), stride, count, n, 0.125f, expected.data());
          DotRowsHalf(ctx, type, q.data(), rows.data(), stride, count, n, 0.125f, got.data());
          ASSERT_EQ(Bits(got), Bits(expected))
              << IsaName(isa) << " " << DTypeName(type) << " n " << n << " count " << count;
        }
      }
    }
  }
}

TEST(HalfRowsTest, AxpyRowsHalfEqualsAxpyRowsOnWidenedRows) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kHalfTypes) {
      for (int64_t n : kSizes) {
        for (int64_t count = 1; count <= 37; ++count) {
          const int64_t stride = n + 5;
          const auto seed = static_cast<uint32_t>(n * 1000 + count);
          const std::vector<uint16_t> rows = RandomHalfRows(type, stride, count, n, seed);
          const std::vector<float> wide = WidenRef(type, rows);
          const std::vector<float> weights = Random(count, seed + 3);

          // A spare element past n checks that nothing beyond y[0, n) is written.
          std::vector<float> expected = Random(n + 1, seed + 5);
          std::vector<float> got = expected;
          AxpyRows(ctx, weights.data(), wide.data(), stride, count, n, expected.data());
          AxpyRowsHalf(ctx, type, weights.data(), rows.data(), stride, count, n, got.data());
          ASSERT_EQ(Bits(got), Bits(expected))
              << IsaName(isa) << " " << DTypeName(type) << " n " << n << " count " << count;
        }
      }
    }
  }
}

// Values where narrowing is easy to get wrong, then random bit patterns (every class of float).
std::vector<float> NarrowingCases() {
  const auto from_bits = [](uint32_t b) { return std::bit_cast<float>(b); };
  std::vector<float> v = {
      0.0f,
      -0.0f,
      1.0f,
      -1.0f,
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::max(),
      -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::min(),
      std::numeric_limits<float>::denorm_min(),
      -std::numeric_limits<float>::denorm_min(),
      from_bits(0x7FC00000),
      from_bits(0xFFC00000),  // quiet NaNs
      from_bits(0x7F800001),
      from_bits(0xFF800001),  // signaling NaNs, payload below f16/bf16 bits
      from_bits(0x7FA00000),
      from_bits(0x7F812345),
      from_bits(0x7FFFFFFF),
      from_bits(0x00000001),
      from_bits(0x007FFFFF),
      from_bits(0x00400000),  // f32 subnormals
      from_bits(0x80012345),
      from_bits(0x0000FFFF),
      from_bits(0x00008000),
      from_bits(0x00018000),
      // f16: largest finite, the rounding edge to inf, past it, and ties around it.
      65504.0f,
      65519.0f,
      65519.99f,
      65520.0f,
      65536.0f,
      1e10f,
      -65520.0f,
      65505.0f,
      // f16 ties to even: 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9.
      1.0f + 0x1p-11f,
      1.0f + 3 * 0x1p-11f,
      -(1.0f + 0x1p-11f),
      2048.0f + 1.0f,
      2048.0f + 3.0f,
      // f16 subnormals and the boundaries around them.
      0x1p-14f,
      0x1p-14f - 0x1p-25f,
      0x1p-24f,
      0x1p-25f,
      0x1p-25f + 0x1p-40f,
      0x1.8p-25f,
      0x1p-26f,
      3 * 0x1p-25f,
      5 * 0x1p-25f,
      0x1.ffcp-15f,
      -0x1p-24f,
      // bf16 ties to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6, and rounding up to inf.
      1.0f + 0x1p-8f,
      1.0f + 3 * 0x1p-8f,
      from_bits(0x7F7F8000),
      from_bits(0x7F7F7FFF),
      from_bits(0x00008001),
      from_bits(0x80018000),
  };
  std::mt19937 rng(42);
  for (int i = 0; i < 20000; ++i) v.push_back(from_bits(static_cast<uint32_t>(rng())));
  // Random values in the f16 range too, where random bit patterns rarely land.
  std::uniform_real_distribution<float> exp(-26.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) {
    v.push_back((rng() & 1 ? 1.0f : -1.0f) * std::exp2(exp(rng)));
  }
  return v;
}

TEST(HalfRowsTest, NarrowRowMatchesScalarReferenceBits) {
  ThreadPool pool(1);
  const std::vector<float> x = NarrowingCases();
  const int64_t total = static_cast<int64_t>(x.size());
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kHalfTypes) {
      const std::vector<uint16_t> expected = NarrowRef(type, x);
      std::vector<uint16_t> got(x.size(), 0xDEAD);
      NarrowRow(ctx, type, x.data(), total, got.data());
      ASSERT_EQ(got, expected) << IsaName(isa) << " " << DTypeName(type);
      // Every short length and offset, so the special values also go through the tail paths.
      for (int64_t begin = 0; begin < 64; ++begin) {
        for (int64_t len = 1; len <= 33; ++len) {
          std::vector<uint16_t> part(static_cast<size_t>(len) + 1, 0xDEAD);
          NarrowRow(ctx, type, &x[begin], len, part.data());
          ASSERT_EQ(part.back(), 0xDEAD) << IsaName(isa) << " wrote past n";
          part.pop_back();
          ASSERT_EQ(part, std::vector<uint16_t>(&expected[begin], &expected[begin + len]))
              << IsaName(isa) << " " << DTypeName(type) << " begin " << begin << " len " << len;
        }
      }
    }
  }
}

// The reference itself, on values whose answer is known.
TEST(HalfRowsTest, NarrowingReferenceKnownValues) {
  using quant::Fp32ToBf16;
  using quant::Fp32ToFp16;
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // the tie rounds to even, which is inf
  EXPECT_EQ(Fp32ToFp16(-1e10f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(0x1p-24f), 0x0001);
  EXPECT_EQ(Fp32ToFp16(0x1p-25f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(Fp32ToFp16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(std::bit_cast<float>(0x7F800001u)), 0x7E00);
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x00008001u)), 0x0001);  // subnormal kept
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);
}

TEST(HalfRowsTest, WidenRowIsExactOnEveryHalfValue) {
  ThreadPool pool(1);
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kHalfTypes) {
      const std::vector<float> expected = WidenRef(type, all);
      std::vector<float> got(all.size());
      WidenRow(ctx, type, all.data(), static_cast<int64_t>(all.size()), got.data());
      std::vector<uint16_t> back(all.size());
      NarrowRow(ctx, type, got.data(), static_cast<int64_t>(got.size()), back.data());
      for (size_t i = 0; i < all.size(); ++i) {
        if (std::isnan(expected[i])) {
          // A signaling f16 NaN may come back quiet from vcvtph2ps; it stays a NaN.
          ASSERT_TRUE(std::isnan(got[i])) << IsaName(isa) << " " << DTypeName(type) << " " << i;
          continue;
        }
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(expected[i]))
            << IsaName(isa) << " " << DTypeName(type) << " half 0x" << std::hex << i;
        ASSERT_EQ(back[i], all[i])
            << IsaName(isa) << " " << DTypeName(type) << " round trip 0x" << std::hex << i;
      }
      // Tails: every short length widens exactly and writes nothing past n.
      for (int64_t len = 1; len <= 33; ++len) {
        std::vector<float> part(static_cast<size_t>(len) + 1, -7.0f);
        WidenRow(ctx, type, &all[0x3C00 - 5], len, part.data());
        ASSERT_EQ(part.back(), -7.0f) << IsaName(isa) << " wrote past n";
        for (int64_t k = 0; k < len; ++k) ASSERT_EQ(part[k], expected[0x3C00 - 5 + k]);
      }
    }
  }
}

TEST(HalfRowsTest, WidenOfNarrowIsWithinHalfPrecision) {
  ThreadPool pool(1);
  std::vector<float> x = Random(4096, 5);
  for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e3f;
  for (size_t i = 1; i < x.size(); i += 7) x[i] *= 1e-3f;
  const int64_t n = static_cast<int64_t>(x.size());
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kHalfTypes) {
      // Relative half-ulp of the format (11 / 8 significant bits); f16 results below 2^-14 are
      // subnormal and have an absolute error of at most 2^-25 instead.
      const float rel = type == DType::kF16 ? 0x1p-11f : 0x1p-8f;
      std::vector<uint16_t> h(x.size());
      std::vector<float> back(x.size());
      NarrowRow(ctx, type, x.data(), n, h.data());
      WidenRow(ctx, type, h.data(), n, back.data());
      for (int64_t i = 0; i < n; ++i) {
        const float bound = std::max(std::fabs(x[i]) * rel, type == DType::kF16 ? 0x1p-25f : 0.0f);
        ASSERT_LE(std::fabs(back[i] - x[i]), bound)
            << IsaName(isa) << " " << DTypeName(type) << " x " << x[i] << " -> " << back[i];
      }
    }
  }
}

TEST(HalfRowsTest, EmptyRunsDoNothing) {
  ThreadPool pool(1);
  OpsContext ctx(BestIsa(), &pool);
  float y = 3.0f;
  AxpyRowsHalf(ctx, DType::kF16, nullptr, nullptr, 0, 0, 4, &y);
  DotRowsHalf(ctx, DType::kBF16, nullptr, nullptr, 0, 0, 4, 1.0f, nullptr);
  EXPECT_EQ(y, 3.0f);
}

TEST(HalfRowsDeathTest, RejectsTypesOtherThanF16AndBf16) {
  // The thread pool has started threads: re-exec the binary for the death test rather than fork.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  OpsContext ctx(Isa::kScalar, &pool);
  const float x[4] = {};
  uint16_t h[4] = {};
  float out[4] = {};
  EXPECT_DEATH(NarrowRow(ctx, DType::kF32, x, 4, h), "f16 or bf16");
  EXPECT_DEATH(WidenRow(ctx, DType::kQ8_0, h, 4, out), "f16 or bf16");
  EXPECT_DEATH(DotRowsHalf(ctx, DType::kF32, x, h, 4, 1, 4, 1.0f, out), "f16 or bf16");
  EXPECT_DEATH(AxpyRowsHalf(ctx, DType::kF32, x, h, 4, 1, 4, out), "f16 or bf16");
}

}  // namespace
}  // namespace kvl::ops
