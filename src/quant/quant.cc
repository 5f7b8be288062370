#include "kvl/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvl/kquant.h"
#include "kvl/status.h"

namespace kvl::quant {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

void QuantizeQ8_0(const float* x, int64_t n, BlockQ8_0* y) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK; ++j) y[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
}

void QuantizeQ4_0(const float* x, int64_t n, BlockQ4_0* y) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    // The signed value of largest magnitude maps to -8, so the full [-8, 7] range is used.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return BitsFloat(sign | 0x7F800000 | (mant << 13));  // inf / nan
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsFloat(sign);
  // Subnormal: mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * 0x1p-24f;
  return BitsFloat(sign | FloatBits(v));
}

uint16_t Fp32ToFp16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) {  // nan: keep the top payload bits, force quiet so it stays a nan
    return sign | 0x7E00 | static_cast<uint16_t>((abs >> 13) & 0x3FF);
  }
  if (abs >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds to inf
  if (abs >= 0x38800000) {                       // normal half: rebias, round to nearest even
    const uint32_t r = abs - (112u << 23);
    return sign | static_cast<uint16_t>((r + 0xFFF + ((r >> 13) & 1)) >> 13);
  }
  // Subnormal half (units of 2^-24) or zero.
  const uint32_t e = abs >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  const uint32_t m = (abs & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  return sign | static_cast<uint16_t>(q);
}

uint16_t Fp32ToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

void QuantizeRow(DType type, const float* x, int64_t n, void* out) {
  switch (StorageFormat(type)) {
    case DType::kF32:
      std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = Fp32ToFp16(x[i]);
      return;
    }
    case DType::kBF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = Fp32ToBf16(x[i]);
      return;
    }
    case DType::kQ8_0:
      KVL_CHECK_MSG(n % kQK == 0, "q8_0 row length must be a multiple of 32");
      QuantizeQ8_0(x, n, static_cast<BlockQ8_0*>(out));
      return;
    case DType::kQ4_0:
      KVL_CHECK_MSG(n % kQK == 0, "q4_0 row length must be a multiple of 32");
      QuantizeQ4_0(x, n, static_cast<BlockQ4_0*>(out));
      return;
    case DType::kQ4_K:
      QuantizeQ4_K(x, n, static_cast<BlockQ4_K*>(out));
      return;
    case DType::kQ5_K:
      QuantizeQ5_K(x, n, static_cast<BlockQ5_K*>(out));
      return;
    case DType::kQ6_K:
      QuantizeQ6_K(x, n, static_cast<BlockQ6_K*>(out));
      return;
    default:
      KVL_CHECK_MSG(false, "QuantizeRow: unsupported type");
  }
}

void DequantizeRow(DType type, const void* row, int64_t n, float* out) {
  switch (StorageFormat(type)) {
    case DType::kF32:
      std::memcpy(out, row, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = Fp16ToFp32(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFp32(h[i]);
      return;
    }
    case DType::kQ8_0: {
      KVL_CHECK_MSG(n % kQK == 0, "q8_0 row length must be a multiple of 32");
      const auto* blocks = static_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = Fp16ToFp32(blocks[b].d);
        for (int j = 0; j < kQK; ++j) out[b * kQK + j] = blocks[b].qs[j] * d;
      }
      return;
    }
    case DType::kQ4_0: {
      KVL_CHECK_MSG(n % kQK == 0, "q4_0 row length must be a multiple of 32");
      const auto* blocks = static_cast<const BlockQ4_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = Fp16ToFp32(blocks[b].d);
        for (int j = 0; j < kQK / 2; ++j) {
          out[b * kQK + j] = static_cast<float>((blocks[b].qs[j] & 0xF) - 8) * d;
          out[b * kQK + j + 16] = static_cast<float>((blocks[b].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case DType::kQ4_K:
      DequantizeQ4_K(static_cast<const BlockQ4_K*>(row), n, out);
      return;
    case DType::kQ5_K:
      DequantizeQ5_K(static_cast<const BlockQ5_K*>(row), n, out);
      return;
    case DType::kQ6_K:
      DequantizeQ6_K(static_cast<const BlockQ6_K*>(row), n, out);
      return;
    default:
      KVL_CHECK_MSG(false, "DequantizeRow: unsupported type");
  }
}

void Q5_0ToQ8_0(const void* q5_0, int64_t blocks, void* q8_0) {
  const auto* in = static_cast<const BlockQ5_0*>(q5_0);
  auto* out = static_cast<BlockQ8_0*>(q8_0);
  for (int64_t b = 0; b < blocks; ++b) {
    const BlockQ5_0& src = in[b];
    BlockQ8_0& dst = out[b];
    const uint32_t high_bits = static_cast<uint32_t>(src.qh[0]) |
                               static_cast<uint32_t>(src.qh[1]) << 8 |
                               static_cast<uint32_t>(src.qh[2]) << 16 |
                               static_cast<uint32_t>(src.qh[3]) << 24;
    dst.d = src.d;
    for (int j = 0; j < kQK / 2; ++j) {
      const int low = (src.qs[j] & 0x0F) | ((high_bits >> j) & 1) << 4;
      const int high = (src.qs[j] >> 4) | ((high_bits >> (j + kQK / 2)) & 1) << 4;
      dst.qs[j] = static_cast<int8_t>(low - 16);
      dst.qs[j + kQK / 2] = static_cast<int8_t>(high - 16);
    }
  }
}

}  // namespace kvl::quant
