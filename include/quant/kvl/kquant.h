// GGML's "K-quant" weight formats: super-blocks of 256 values carrying a second level of scales.
// Layouts are byte-for-byte those of ggml (type ids Q4_K = 12, Q5_K = 13, Q6_K = 14), so the
// tensors of a downloaded Q4_K_M / Q5_K_M / Q6_K GGUF are used in place.
//
// Element e (0..255) of a super-block, as each format defines it:
//   Q4_K  value = d * sc[s] * q - dmin * m[s], s = e / 32 (eight sub-blocks of 32), q in 0..15:
//         q is a nibble of qs[32 * (e / 64) + e % 32], the low one when e % 64 < 32.
//   Q5_K  as Q4_K with q in 0..31: bit 4 of q is bit s of qh[e % 32].
//   Q6_K  value = d * scales[e / 16] * (q - 32), q in 0..63 (sixteen sub-blocks of 16):
//         with h = e / 128, i = (e % 128) / 32, l = e % 32, the low 4 bits of q are a nibble of
//         ql[64 * h + 32 * (i & 1) + l] (the low one when i < 2) and its bits 4-5 are bits
//         2i..2i+1 of qh[32 * h + l].
// Q4_K / Q5_K keep their eight 6-bit scales sc[] and eight 6-bit mins m[] packed in 12 bytes
// (UnpackScalesMins). The dequantizers here are the reference the tests check the ops kernels with.
#pragma once

#include <cstdint>

namespace kvl::quant {

inline constexpr int64_t kQK_K = 256;  // elements per K-quant super-block

struct BlockQ4_K {
  uint16_t d;           // fp16 scale of the sub-block scales
  uint16_t dmin;        // fp16 scale of the sub-block mins
  uint8_t scales[12];   // 8 scales + 8 mins, 6 bits each (UnpackScalesMins)
  uint8_t qs[kQK_K / 2];  // 4-bit codes
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];  // bit 4 of each code
  uint8_t qs[kQK_K / 2];  // low 4 bits of each code
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits of each code
  uint8_t qh[kQK_K / 4];      // bits 4-5 of each code
  int8_t scales[kQK_K / 16];  // signed 8-bit sub-block scales
  uint16_t d;                 // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// The eight scales and eight mins of a Q4_K / Q5_K super-block. In the 12 packed bytes p:
//   j < 4:  sc[j] = p[j] & 63,                       m[j] = p[j + 4] & 63
//   j >= 4: sc[j] = (p[j + 4] & 15) | (p[j - 4] >> 6) << 4,
//           m[j]  = (p[j + 4] >> 4) | (p[j] >> 6) << 4
struct ScalesMins {
  uint8_t sc[8];
  uint8_t m[8];
};
ScalesMins UnpackScalesMins(const uint8_t packed[12]);
// The same unpacking as four words of four bytes (sc[0..3], sc[4..7], m[0..3], m[4..7]), for the
// SIMD kernels. static rather than inline: each ISA file gets its own copy compiled with its own
// flags, where an inline function's copies would be merged by the linker into one of them.
static inline void UnpackScalesMinsWords(const uint8_t packed[12], uint32_t out[4]) {
  // Bytes 0-3 hold sc[0..3] and the top bits of sc[4..7], bytes 4-7 m[0..3] and the top bits of
  // m[4..7], bytes 8-11 the low nibbles of sc[4..7] (low) and m[4..7] (high).
  uint32_t w[3];
  __builtin_memcpy(w, packed, 12);
  out[0] = w[0] & 0x3F3F3F3Fu;
  out[1] = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 6) & 0x03030303u) << 4;
  out[2] = w[1] & 0x3F3F3F3Fu;
  out[3] = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 6) & 0x03030303u) << 4;
}
// The inverse (values must be < 64, checked).
void PackScalesMins(const ScalesMins& sm, uint8_t packed[12]);

// n values (a multiple of 256) from / to rows of super-blocks. The quantizers pick per-sub-block
// scales and mins from the range of each sub-block (a simple, deterministic choice; ggml's own
// quantizer searches harder), so any row round-trips within about one step of its sub-block.
void DequantizeQ4_K(const BlockQ4_K* blocks, int64_t n, float* out);
void DequantizeQ5_K(const BlockQ5_K* blocks, int64_t n, float* out);
void DequantizeQ6_K(const BlockQ6_K* blocks, int64_t n, float* out);
void QuantizeQ4_K(const float* x, int64_t n, BlockQ4_K* out);
void QuantizeQ5_K(const float* x, int64_t n, BlockQ5_K* out);
void QuantizeQ6_K(const float* x, int64_t n, BlockQ6_K* out);

}  // namespace kvl::quant
