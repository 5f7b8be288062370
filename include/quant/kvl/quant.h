// Block formats and scalar conversions shared by the weights, the synthetic-model writer and the
// KV codec. Layouts are byte-for-byte those of ggml, so GGUF tensor data is used in place.
//
// These are reference (scalar) routines: the SIMD kernels in ops/ read the same structs but never
// call into here on a hot path.
#pragma once

#include <cstdint>

#include "kvl/dtype.h"

namespace kvl::quant {

inline constexpr int64_t kQK = 32;  // elements per Q8_0 / Q4_0 block

// value[i] = qs[i] * fp16(d).
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// value[i] = ((qs[i] & 0xF) - 8) * fp16(d) for i < 16, ((qs[i-16] >> 4) - 8) * fp16(d) above.
struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// value[i] = (q[i] - 16) * fp16(d), q[i] a 5-bit integer: its low 4 bits in qs (i < 16: the low
// nibble of qs[i]; above: the high nibble of qs[i - 16]) and its fifth bit bit i of qh (little
// endian).
struct BlockQ5_0 {
  uint16_t d;  // fp16 scale
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Rewrites `blocks` Q5_0 blocks as Q8_0 blocks of exactly the same values (same scale, q - 16 in
// [-16, 15] fits int8), so Q5_0 weights run on the Q8_0 kernels. llama-quantize writes Q5_0 for
// the Q4_K tensors of a Q4_K_M file whose rows are not a multiple of 256 (Qwen2.5-0.5B's 896,
// Gemma-3-1B's 1152).
void Q5_0ToQ8_0(const void* q5_0, int64_t blocks, void* q8_0);

// IEEE binary16 <-> binary32 with round-to-nearest-even; inf, nan and subnormals preserved.
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
// bfloat16 <-> binary32 (round-to-nearest-even; nan stays nan).
inline float Bf16ToFp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}
uint16_t Fp32ToBf16(float f);

// Encodes n floats as a row of `type` (F32, F16, BF16, Q8_0, Q4_0, and the K-quants Q4_K, Q5_K,
// Q6_K of kvl/kquant.h; n a multiple of 32, or 256 for the K-quants, checked). out must hold RowBytes(type, n). Q8_0 and Q4_0 use ggml's reference
// quantizers, so files we write round-trip through llama.cpp unchanged. The rotated KV types
// (q8_0r, q4_0r) are their storage format's bytes: x is taken as already rotated (the forward
// pass rotates a row before it stores it), and DequantizeRow gives the rotated values back.
void QuantizeRow(DType type, const float* x, int64_t n, void* out);
// Widens a row of `type` back to n floats.
void DequantizeRow(DType type, const void* row, int64_t n, float* out);

}  // namespace kvl::quant
