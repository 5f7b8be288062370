// K-quant super-blocks (kvl/kquant.h): unpacking, reference dequantization and a simple quantizer.
#include "kvl/kquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kvl/quant.h"
#include "kvl/status.h"

namespace kvl::quant {
namespace {

// Nearest integer, ties away from zero, clamped to [lo, hi].
int RoundClamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

// Scales and mins of one Q4_K / Q5_K super-block whose codes run 0..qmax: each sub-block of 32
// maps [min(0, lowest), highest] onto the codes, then the 6-bit scale and min codes are taken
// relative to the largest of each. Codes are chosen against the fp16-rounded scales the reader
// will use, so the rounding of d and dmin costs no extra error. A value lands within half a step
// plus dmin of where it was (the step being at most d above the sub-block's own).
template <typename Block>
void QuantizeScaledMin(const float* x, int qmax, Block* b, uint8_t* codes) {
  float scale[8], min[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    float lo = 0.0f, hi = 0.0f;
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[32 * s + l]);
      hi = std::max(hi, x[32 * s + l]);
    }
    scale[s] = (hi - lo) / static_cast<float>(qmax);
    min[s] = -lo;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, min[s]);
  }
  b->d = Fp32ToFp16(max_scale / 63.0f);
  b->dmin = Fp32ToFp16(max_min / 63.0f);
  const float d = Fp16ToFp32(b->d);
  const float dmin = Fp16ToFp32(b->dmin);
  ScalesMins sm;
  for (int s = 0; s < 8; ++s) {
    // Rounding the scale code up keeps [lo, hi] inside the codes' reach, so no value clamps.
    sm.sc[s] = static_cast<uint8_t>(d > 0.0f ? std::min(63.0f, std::ceil(scale[s] / d)) : 0);
    sm.m[s] = static_cast<uint8_t>(dmin > 0.0f ? RoundClamp(min[s] / dmin, 0, 63) : 0);
    const float step = d * sm.sc[s];
    const float offset = dmin * sm.m[s];
    for (int l = 0; l < 32; ++l) {
      codes[32 * s + l] = static_cast<uint8_t>(
          step > 0.0f ? RoundClamp((x[32 * s + l] + offset) / step, 0, qmax) : 0);
    }
  }
  PackScalesMins(sm, b->scales);
}

// Q4_K / Q5_K: the low 4 bits of the codes of sub-blocks 2c and 2c + 1 share qs[32c .. 32c + 32).
void PackLowNibbles(const uint8_t* codes, uint8_t* qs) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((codes[64 * c + l] & 15) | (codes[64 * c + 32 + l] & 15) << 4);
    }
  }
}

// The inverse for one 64-value chunk c: low nibbles are sub-block 2c, high nibbles 2c + 1.
template <typename Block>
void DequantizeScaledMin(const Block& b, const uint8_t* high_bits, float* out) {
  const ScalesMins sm = UnpackScalesMins(b.scales);
  const float d = Fp16ToFp32(b.d);
  const float dmin = Fp16ToFp32(b.dmin);
  for (int c = 0; c < 4; ++c) {
    const int s0 = 2 * c, s1 = 2 * c + 1;
    const float d0 = d * sm.sc[s0], m0 = dmin * sm.m[s0];
    const float d1 = d * sm.sc[s1], m1 = dmin * sm.m[s1];
    for (int l = 0; l < 32; ++l) {
      const uint8_t q = b.qs[32 * c + l];
      const int h0 = high_bits != nullptr ? (high_bits[l] >> s0 & 1) << 4 : 0;
      const int h1 = high_bits != nullptr ? (high_bits[l] >> s1 & 1) << 4 : 0;
      out[64 * c + l] = d0 * static_cast<float>((q & 15) | h0) - m0;
      out[64 * c + 32 + l] = d1 * static_cast<float>((q >> 4) | h1) - m1;
    }
  }
}

void CheckLength(int64_t n) {
  KVL_CHECK_MSG(n % kQK_K == 0, "K-quant row length must be a multiple of 256");
}

// A row of Q4_K (codes 0..15) or Q5_K (0..31, bit 4 of code e in bit e / 32 of qh[e % 32]).
template <typename Block>
void QuantizeRowScaledMin(const float* x, int64_t n, Block* out) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
  CheckLength(n);
  uint8_t codes[kQK_K];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    QuantizeScaledMin(x + b * kQK_K, kQ5 ? 31 : 15, &out[b], codes);
    PackLowNibbles(codes, out[b].qs);
    if constexpr (kQ5) {
      std::memset(out[b].qh, 0, sizeof(out[b].qh));
      for (int e = 0; e < kQK_K; ++e) {
        out[b].qh[e % 32] = static_cast<uint8_t>(out[b].qh[e % 32] | (codes[e] >> 4) << (e / 32));
      }
    }
  }
}

}  // namespace

ScalesMins UnpackScalesMins(const uint8_t packed[12]) {
  uint32_t words[4];
  UnpackScalesMinsWords(packed, words);
  ScalesMins sm;
  std::memcpy(&sm, words, sizeof(sm));
  return sm;
}

void PackScalesMins(const ScalesMins& sm, uint8_t packed[12]) {
  for (int j = 0; j < 8; ++j) KVL_CHECK(sm.sc[j] < 64 && sm.m[j] < 64);
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(sm.sc[j] | (sm.sc[j + 4] >> 4) << 6);
    packed[j + 4] = static_cast<uint8_t>(sm.m[j] | (sm.m[j + 4] >> 4) << 6);
    packed[j + 8] = static_cast<uint8_t>((sm.sc[j + 4] & 15) | (sm.m[j + 4] & 15) << 4);
  }
}

void DequantizeQ4_K(const BlockQ4_K* blocks, int64_t n, float* out) {
  CheckLength(n);
  for (int64_t b = 0; b < n / kQK_K; ++b) DequantizeScaledMin(blocks[b], nullptr, out + b * kQK_K);
}

void DequantizeQ5_K(const BlockQ5_K* blocks, int64_t n, float* out) {
  CheckLength(n);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    DequantizeScaledMin(blocks[b], blocks[b].qh, out + b * kQK_K);
  }
}

void DequantizeQ6_K(const BlockQ6_K* blocks, int64_t n, float* out) {
  CheckLength(n);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ6_K& blk = blocks[b];
    const float d = Fp16ToFp32(blk.d);
    float* y = out + b * kQK_K;
    // Each half of 128 values: ql[64h + l] and ql[64h + 32 + l] give four values each (low and
    // high nibble), completed by the four 2-bit fields of qh[32h + l].
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {(ql[l] & 15) | (qh[l] & 3) << 4, (ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4,
                          (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4, (ql[l + 32] >> 4) | (qh[l] >> 6) << 4};
        for (int i = 0; i < 4; ++i) {
          const int e = 128 * h + 32 * i + l;
          y[e] = d * static_cast<float>(blk.scales[e / 16]) * static_cast<float>(q[i] - 32);
        }
      }
    }
  }
}

void QuantizeQ4_K(const float* x, int64_t n, BlockQ4_K* out) { QuantizeRowScaledMin(x, n, out); }

void QuantizeQ5_K(const float* x, int64_t n, BlockQ5_K* out) { QuantizeRowScaledMin(x, n, out); }

void QuantizeQ6_K(const float* x, int64_t n, BlockQ6_K* out) {
  CheckLength(n);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ6_K& blk = out[b];
    // Per sub-block of 16, the signed value of largest magnitude maps to code -32 (as Q4_0 does
    // with -8), so the full [-32, 31] range is used; the 8-bit scales are relative to the largest.
    float scale[16];
    float max_abs_scale = 0.0f;
    for (int g = 0; g < 16; ++g) {
      float max = 0.0f;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(x[16 * g + l]) > std::fabs(max)) max = x[16 * g + l];
      }
      scale[g] = max / -32.0f;
      max_abs_scale = std::max(max_abs_scale, std::fabs(scale[g]));
    }
    blk.d = Fp32ToFp16(max_abs_scale / 127.0f);
    const float d = Fp16ToFp32(blk.d);
    uint8_t codes[kQK_K];
    for (int g = 0; g < 16; ++g) {
      blk.scales[g] = static_cast<int8_t>(d > 0.0f ? RoundClamp(scale[g] / d, -127, 127) : 0);
      const float step = d * blk.scales[g];
      for (int l = 0; l < 16; ++l) {
        const int q = step != 0.0f ? RoundClamp(x[16 * g + l] / step, -32, 31) : 0;
        codes[16 * g + l] = static_cast<uint8_t>(q + 32);
      }
    }
    std::memset(blk.ql, 0, sizeof(blk.ql));
    std::memset(blk.qh, 0, sizeof(blk.qh));
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, i = (e % 128) / 32, l = e % 32;
      uint8_t& low = blk.ql[64 * h + 32 * (i & 1) + l];
      low = static_cast<uint8_t>(low | (codes[e] & 15) << (i < 2 ? 0 : 4));
      blk.qh[32 * h + l] = static_cast<uint8_t>(blk.qh[32 * h + l] | (codes[e] >> 4) << (2 * i));
    }
  }
}

}  // namespace kvl::quant
