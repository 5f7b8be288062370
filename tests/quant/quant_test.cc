#include "kvl/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace kvl::quant {
namespace {

float HalfBitsToFloat(uint16_t h) { return Fp16ToFp32(h); }

TEST(Fp16Test, SpecialValues) {
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);                    // largest finite
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);                    // below the halfway point
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);                    // tie rounds to even: inf
  EXPECT_EQ(Fp32ToFp16(1e10f), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(0x1p-24f), 0x0001);                    // smallest subnormal
  EXPECT_EQ(Fp32ToFp16(0x1p-25f), 0x0000);                    // tie to even: zero
  EXPECT_EQ(Fp32ToFp16(0x1.8p-25f), 0x0001);                  // above the tie
  EXPECT_EQ(Fp32ToFp16(0x1.8p-24f), 0x0002);                  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(Fp32ToFp16(0x1p-14f), 0x0400);                    // smallest normal
  EXPECT_EQ(Fp32ToFp16(0x1.ff8p-15f), 0x03FF);                // largest subnormal
  EXPECT_EQ(Fp32ToFp16(1e-10f), 0x0000);
  const uint16_t nan = Fp32ToFp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7E00)));
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
  EXPECT_EQ(Fp16ToFp32(0x0001), 0x1p-24f);
  EXPECT_EQ(Fp16ToFp32(0x8001), -0x1p-24f);
  EXPECT_EQ(Fp16ToFp32(0x3555), 0x1.554p-2f);
}

// Every half value survives a round trip, and every midpoint between neighbours rounds to the
// neighbour with an even mantissa.
TEST(Fp16Test, ExhaustiveRoundTripAndTies) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = HalfBitsToFloat(half);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfBitsToFloat(Fp32ToFp16(f)))) << h;
      continue;
    }
    ASSERT_EQ(Fp32ToFp16(f), half) << h;
    if ((h & 0x7FFF) >= 0x7BFF) continue;  // no finite upper neighbour
    const float next = HalfBitsToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (f + next) / 2;  // exact in float
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : half;
    ASSERT_EQ(Fp32ToFp16(mid), even) << h;
    ASSERT_EQ(Fp32ToFp16(std::nextafter(mid, next)), static_cast<uint16_t>(h + 1)) << h;
    ASSERT_EQ(Fp32ToFp16(std::nextafter(mid, f)), half) << h;
  }
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(Fp32ToBf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3F82);  // tie from odd goes up
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(Fp32ToBf16(f), h);
    }
  }
}

std::vector<float> RandomRow(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

TEST(QuantTest, Q8_0RoundTripWithinHalfStep) {
  for (int64_t n : {32, 96, 1024}) {
    const std::vector<float> x = RandomRow(n, 7 + n, 3.0f);
    std::vector<BlockQ8_0> q(n / 32);
    QuantizeRow(DType::kQ8_0, x.data(), n, q.data());
    std::vector<float> back(n);
    DequantizeRow(DType::kQ8_0, q.data(), n, back.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float d = amax / 127;
      // Half a step, plus what rounding d to fp16 moves the largest code (127 * 2^-11 * d).
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), 0.57f * d);
    }
  }
}

TEST(QuantTest, Q4_0RoundTripWithinOneStep) {
  for (int64_t n : {32, 224, 1024}) {
    const std::vector<float> x = RandomRow(n, 11 + n, 0.5f);
    std::vector<BlockQ4_0> q(n / 32);
    QuantizeRow(DType::kQ4_0, x.data(), n, q.data());
    std::vector<float> back(n);
    DequantizeRow(DType::kQ4_0, q.data(), n, back.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float d = amax / 8;
      // Half a step inside the range; the value opposite the signed max clamps to 7, one step.
      for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), 1.01f * d);
    }
  }
}

TEST(QuantTest, Q4_0MatchesGgmlLayout) {
  // x[j] = j - 16 over one block: max magnitude is -16 at j = 0, so d = 2 and codes are j/2.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  BlockQ4_0 q;
  QuantizeRow(DType::kQ4_0, x, 32, &q);
  EXPECT_EQ(Fp16ToFp32(q.d), 2.0f);
  EXPECT_EQ(q.qs[0] & 0xF, 0);        // -16 / 2 + 8
  EXPECT_EQ(q.qs[0] >> 4, 8);         // x[16] = 0
  EXPECT_EQ(q.qs[15] >> 4, 15);       // x[31] = 15 -> 7.5 + 8.5 = 16 -> clamped to 15
  float back[32];
  DequantizeRow(DType::kQ4_0, &q, 32, back);
  EXPECT_EQ(back[0], -16.0f);
  EXPECT_EQ(back[16], 0.0f);
}

TEST(QuantTest, Q8_0ExactForRepresentableValues) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j * 4 - 64);  // max |x| = 64 -> d = 64/127
  BlockQ8_0 q;
  QuantizeRow(DType::kQ8_0, x, 32, &q);
  EXPECT_EQ(q.qs[0], -127);
  EXPECT_EQ(q.qs[16], 0);
}

TEST(QuantTest, FloatTypesRoundTrip) {
  const std::vector<float> x = RandomRow(37, 3);
  std::vector<uint8_t> buf(37 * 4);
  std::vector<float> back(37);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    QuantizeRow(t, x.data(), 37, buf.data());
    DequantizeRow(t, buf.data(), 37, back.data());
    const float tol = t == DType::kF32 ? 0.0f : t == DType::kF16 ? 0x1p-11f : 0x1p-8f;
    for (int i = 0; i < 37; ++i) EXPECT_LE(std::fabs(back[i] - x[i]), tol * std::fabs(x[i])) << i;
  }
}

TEST(QuantTest, ZeroBlocksStayZero) {
  std::vector<float> x(64, 0.0f);
  std::vector<uint8_t> buf(64 * 4);
  std::vector<float> back(64, 1.0f);
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    QuantizeRow(t, x.data(), 64, buf.data());
    DequantizeRow(t, buf.data(), 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace kvl::quant

namespace kvl::quant {
namespace {

// Q5_0 rewritten as Q8_0 keeps every value: random blocks (every qh bit pattern and nibble
// occurs) decoded from the format's definition, written out here, against the Q8_0 dequantizer.
TEST(Q5_0ToQ8_0Test, KeepsEveryValueOfTheDefinition) {
  constexpr int kBlocks = 64;
  std::mt19937 rng(25);
  std::vector<BlockQ5_0> q5(kBlocks);
  for (BlockQ5_0& b : q5) {
    b.d = Fp32ToFp16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
    for (uint8_t& x : b.qh) x = static_cast<uint8_t>(rng());
    for (uint8_t& x : b.qs) x = static_cast<uint8_t>(rng());
  }
  std::vector<BlockQ8_0> q8(kBlocks);
  Q5_0ToQ8_0(q5.data(), kBlocks, q8.data());
  std::vector<float> got(kBlocks * kQK);
  DequantizeRow(DType::kQ8_0, q8.data(), kBlocks * kQK, got.data());
  for (int b = 0; b < kBlocks; ++b) {
    const uint32_t qh = q5[b].qh[0] | q5[b].qh[1] << 8 | q5[b].qh[2] << 16 |
                        static_cast<uint32_t>(q5[b].qh[3]) << 24;
    for (int i = 0; i < kQK; ++i) {
      const int nibble = i < 16 ? q5[b].qs[i] & 0xF : q5[b].qs[i - 16] >> 4;
      const int q = nibble + 16 * static_cast<int>((qh >> i) & 1);
      const float want = static_cast<float>(q - 16) * Fp16ToFp32(q5[b].d);
      ASSERT_EQ(got[static_cast<size_t>(b * kQK + i)], want) << "block " << b << " value " << i;
    }
  }
}

}  // namespace
}  // namespace kvl::quant
