// K-quant super-blocks against the formats' definitions, written out here element by element from
// the spec (not from kquant.cc's chunked loops): the 6-bit packed scales and mins of Q4_K / Q5_K,
// Q5_K's fifth bit, and Q6_K's ql / qh / scales layout.
#include "kvl/kquant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/quant.h"

namespace kvl::quant {
namespace {

// Scale (or min) j of a packed Q4_K / Q5_K scales array, straight from the definition.
int SpecScale(const uint8_t* p, int j) {
  if (j < 4) return p[j] & 63;
  return (p[j + 4] & 0xF) | ((p[j - 4] >> 6) << 4);
}
int SpecMin(const uint8_t* p, int j) {
  if (j < 4) return p[j + 4] & 63;
  return (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
}

float SpecQ4_K(const BlockQ4_K& b, int e) {
  const int s = e / 32;
  const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
  const int q = e % 64 < 32 ? byte & 0xF : byte >> 4;
  return Fp16ToFp32(b.d) * SpecScale(b.scales, s) * q - Fp16ToFp32(b.dmin) * SpecMin(b.scales, s);
}

float SpecQ5_K(const BlockQ5_K& b, int e) {
  const int s = e / 32;
  const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
  const int q = (e % 64 < 32 ? byte & 0xF : byte >> 4) + 16 * ((b.qh[e % 32] >> s) & 1);
  return Fp16ToFp32(b.d) * SpecScale(b.scales, s) * q - Fp16ToFp32(b.dmin) * SpecMin(b.scales, s);
}

float SpecQ6_K(const BlockQ6_K& b, int e) {
  const int h = e / 128, i = (e % 128) / 32, l = e % 32;
  const uint8_t low = b.ql[64 * h + 32 * (i % 2) + l];
  const int q = (i < 2 ? low & 0xF : low >> 4) | (((b.qh[32 * h + l] >> (2 * i)) & 3) << 4);
  return Fp16ToFp32(b.d) * b.scales[e / 16] * (q - 32);
}

// Random bytes everywhere, with finite, modest fp16 scales.
template <typename Block>
std::vector<Block> RandomBlocks(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Block> blocks(count);
  for (Block& b : blocks) {
    auto* bytes = reinterpret_cast<uint8_t*>(&b);
    for (size_t i = 0; i < sizeof(Block); ++i) bytes[i] = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    if constexpr (requires { b.dmin; }) b.dmin = Fp32ToFp16(std::fabs(dist(rng)));
    b.d = Fp32ToFp16(dist(rng));
  }
  return blocks;
}

TEST(KQuantTest, LayoutsAreGgmls) {
  EXPECT_EQ(offsetof(BlockQ4_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ4_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qh), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
  EXPECT_EQ(offsetof(BlockQ6_K, qh), 128u);
  EXPECT_EQ(offsetof(BlockQ6_K, scales), 192u);
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
  for (auto [type, bytes] : {std::pair{DType::kQ4_K, 144}, {DType::kQ5_K, 176}, {DType::kQ6_K, 210}}) {
    EXPECT_EQ(Traits(type).block_elements, 256);
    EXPECT_EQ(Traits(type).block_bytes, bytes);
    EXPECT_TRUE(Traits(type).supported);
    EXPECT_EQ(RowBytes(type, 512), 2 * bytes);
  }
  EXPECT_EQ(ParseDType("Q4_K"), DType::kQ4_K);
  EXPECT_EQ(static_cast<int>(DType::kQ6_K), 14);
}

TEST(KQuantTest, UnpackScalesMinsMatchesSpecAndPackInverts) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t p[12];
    for (uint8_t& b : p) b = static_cast<uint8_t>(rng());
    const ScalesMins sm = UnpackScalesMins(p);
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(sm.sc[j], SpecScale(p, j)) << "trial " << trial << " j " << j;
      ASSERT_EQ(sm.m[j], SpecMin(p, j)) << "trial " << trial << " j " << j;
    }
    uint8_t repacked[12];
    PackScalesMins(sm, repacked);  // every bit of the 12 bytes is used, so packing is exact
    ASSERT_EQ(std::memcmp(p, repacked, 12), 0) << "trial " << trial;
  }
}

template <typename Block, typename Spec, typename Dequant>
void ExpectDequantMatchesSpec(DType type, Spec spec, Dequant dequant) {
  const std::vector<Block> blocks = RandomBlocks<Block>(3, 11);
  std::vector<float> out(3 * 256), via_row(3 * 256);
  dequant(blocks.data(), 3 * 256, out.data());
  DequantizeRow(type, blocks.data(), 3 * 256, via_row.data());
  for (int b = 0; b < 3; ++b) {
    for (int e = 0; e < 256; ++e) {
      ASSERT_FLOAT_EQ(out[b * 256 + e], spec(blocks[b], e)) << DTypeName(type) << " e " << e;
      ASSERT_EQ(out[b * 256 + e], via_row[b * 256 + e]);
    }
  }
}

TEST(KQuantTest, DequantizeMatchesSpec) {
  ExpectDequantMatchesSpec<BlockQ4_K>(DType::kQ4_K, SpecQ4_K, DequantizeQ4_K);
  ExpectDequantMatchesSpec<BlockQ5_K>(DType::kQ5_K, SpecQ5_K, DequantizeQ5_K);
  ExpectDequantMatchesSpec<BlockQ6_K>(DType::kQ6_K, SpecQ6_K, DequantizeQ6_K);
}

// Quantize then dequantize: each value within half a step of its sub-block plus what the 6-bit
// (Q4_K / Q5_K) or 8-bit (Q6_K) scale codes cost, both relative to the super-block's largest
// sub-block scale (and min).
TEST(KQuantTest, QuantizeRoundTripsWithinASubBlockStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 1024;
  std::vector<float> x(n), y(n);
  for (float& v : x) v = dist(rng);
  x[5] = 40.0f;    // an outlier widens its super-block's scale step
  x[700] = -9.0f;  // and one its min step
  struct Case {
    DType type;
    int sub;      // values per sub-block
    float steps;  // code steps across a sub-block's range
  };
  for (const Case& c : {Case{DType::kQ4_K, 32, 15}, Case{DType::kQ5_K, 32, 31},
                        Case{DType::kQ6_K, 16, 63}}) {
    std::vector<uint8_t> bytes(RowBytes(c.type, n));
    QuantizeRow(c.type, x.data(), n, bytes.data());
    DequantizeRow(c.type, bytes.data(), n, y.data());
    const bool q6 = c.type == DType::kQ6_K;
    double err2 = 0, sig2 = 0;
    for (int64_t sb = 0; sb < n / 256; ++sb) {
      std::vector<float> step(256 / c.sub), lowest(256 / c.sub);
      float max_step = 0, max_min = 0;
      for (int s = 0; s < 256 / c.sub; ++s) {
        float lo = 0, hi = 0, amax = 0;
        for (int l = 0; l < c.sub; ++l) {
          const float v = x[sb * 256 + s * c.sub + l];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::fabs(v));
        }
        step[s] = q6 ? amax / 32 : (hi - lo) / c.steps;
        max_step = std::max(max_step, step[s]);
        max_min = std::max(max_min, -lo);
      }
      // Q4_K / Q5_K: d = max_step / 63 and dmin = max_min / 63; Q6_K: d = max_step / 127, and a
      // scale code off by half moves the end codes (+-32) by 16 d. Q6_K maps the value of largest
      // magnitude to -32, so one of opposite sign and equal magnitude clamps at +31: a whole step.
      const float scale_cost = q6 ? 16.5f * max_step / 127 : (max_step + max_min) / 63;
      for (int64_t i = sb * 256; i < (sb + 1) * 256; ++i) {
        const float bound = (q6 ? 1.0f : 0.5f) * step[(i % 256) / c.sub] + 1.01f * scale_cost + 1e-6f;
        ASSERT_LE(std::fabs(y[i] - x[i]), bound) << DTypeName(c.type) << " i " << i;
        err2 += (y[i] - x[i]) * (y[i] - x[i]);
        sig2 += x[i] * x[i];
      }
    }
    EXPECT_LT(std::sqrt(err2 / sig2), c.type == DType::kQ4_K ? 0.15 : 0.08) << DTypeName(c.type);
  }
}

TEST(KQuantTest, ZeroRowsStayZero) {
  std::vector<float> x(512, 0.0f), y(512, 1.0f);
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    std::vector<uint8_t> bytes(RowBytes(type, 512));
    QuantizeRow(type, x.data(), 512, bytes.data());
    DequantizeRow(type, bytes.data(), 512, y.data());
    for (float v : y) ASSERT_EQ(v, 0.0f) << DTypeName(type);
  }
}

}  // namespace
}  // namespace kvl::quant
