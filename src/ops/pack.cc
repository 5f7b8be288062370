// Repacking of GGUF rows into the panels of the packed int8 GEMM (layouts: kernel_table.h); ops.cc
// (PackMatrix) zeroes each panel and hands its rows here, one at a time.
#include <cstddef>
#include <cstring>

#include "kvl/kquant.h"
#include "kernel_table.h"
#include "kquant_kernels.h"

namespace kvl::ops {
namespace {

// Q8_0 / Q4_0: row i of a panel, block by block.
void PackBlockRow(DType type, const uint8_t* row, int64_t cols, int64_t i, uint8_t* panel) {
  const int64_t block_bytes = type == DType::kQ8_0 ? 34 : 18;
  const int64_t quant_bytes = PackedBlockQuantBytes(type);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const uint8_t* block = row + b * block_bytes;
    uint8_t* pair = panel + (b / 2) * PackedPairBytes(type);
    uint8_t* quants = pair + (b % 2) * quant_bytes + i * 4;
    std::memcpy(pair + 2 * quant_bytes + (b % 2) * 32 + 2 * i, block, 2);  // f16 scale
    if (type == DType::kQ8_0) {
      // Elements 4g..4g+3 go to vector g, each w + 128 (flipping the sign bit of 4 bytes at once).
      for (int g = 0; g < 8; ++g) {
        uint32_t four;
        std::memcpy(&four, block + 2 + 4 * g, 4);
        four ^= 0x80808080u;
        std::memcpy(quants + g * 64, &four, 4);
      }
    } else {
      // The stored nibbles already are w + 8: element e < 16 is the low nibble of byte e, element
      // e >= 16 the high nibble of byte e - 16.
      const auto nibble = [&](int e) {
        return e < 16 ? block[2 + e] & 0xF : block[2 + e - 16] >> 4;
      };
      for (int u = 0; u < 4; ++u) {
        for (int j = 0; j < 4; ++j) {
          quants[u * 64 + j] = static_cast<uint8_t>(nibble(8 * u + j) | nibble(8 * u + 4 + j) << 4);
        }
      }
    }
  }
}

// Q4_K / Q5_K / Q6_K: row i of a panel, super-block by super-block. Element e of a super-block
// is in code vector e / 4, at byte 4i + e % 4 of it.
void PackKQuantRow(DType type, const uint8_t* row, int64_t cols, int64_t i, uint8_t* panel) {
  const KQuantPanelLayout layout = KQuantPanel(type);
  const int64_t block_bytes = RowBytes(type, kQK_K);
  for (int64_t sb = 0; sb < cols / kQK_K; ++sb) {
    const uint8_t* block = row + sb * block_bytes;
    uint8_t* out = panel + sb * layout.super_bytes;
    uint8_t codes[kQK_K];
    KQuantCodes(type, block, codes);
    // Codes' load u: the low 4 bits of code vectors 2u (low nibbles) and 2u + 1 (high nibbles).
    for (int u = 0; u < 32; ++u) {
      for (int b = 0; b < 4; ++b) {
        out[64 * u + 4 * i + b] =
            static_cast<uint8_t>((codes[8 * u + b] & 15) | (codes[8 * u + 4 + b] & 15) << 4);
      }
    }
    // High bits: Q5_K bit 4 of code vector 8s + k in bit k of vector s, Q6_K bits 4-5 of code
    // vector 4g + k in bits 2k, 2k + 1 of vector g.
    const int per_vector = type == DType::kQ5_K ? 8 : 4;  // code vectors per high-bits vector
    const int width = 8 / per_vector;                     // high bits per code
    for (int v = 0; type != DType::kQ4_K && v < 64 / per_vector; ++v) {
      for (int b = 0; b < 4; ++b) {
        int bits = 0;
        for (int k = 0; k < per_vector; ++k) bits |= (codes[4 * (per_vector * v + k) + b] >> 4) << (width * k);
        out[layout.bits + 64 * v + 4 * i + b] = static_cast<uint8_t>(bits);
      }
    }
    if (type == DType::kQ6_K) {
      std::memcpy(out + layout.d + 2 * i, block + offsetof(BlockQ6_K, d), 2);
      for (int g = 0; g < 16; ++g) out[layout.scales + 16 * g + i] = block[offsetof(BlockQ6_K, scales) + g];
    } else {
      // d, dmin and the 12 scale bytes lead both Q4_K and Q5_K blocks.
      std::memcpy(out + layout.d + 2 * i, block, 2);
      std::memcpy(out + layout.dmin + 2 * i, block + 2, 2);
      for (int k = 0; k < 3; ++k) std::memcpy(out + layout.scales + 64 * k + 4 * i, block + 4 + 4 * k, 4);
    }
  }
}

}  // namespace

void PackPanelRow(DType type, const uint8_t* row, int64_t cols, int64_t i, uint8_t* panel) {
  if (IsKQuant(type)) return PackKQuantRow(type, row, cols, i, panel);
  PackBlockRow(type, row, cols, i, panel);
}

}  // namespace kvl::ops
