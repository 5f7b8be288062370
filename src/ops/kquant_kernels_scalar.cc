// Reference K-quant MatMul tile (plain C++), the per-token activation sums every ISA shares, and
// the ISA dispatch of the K-quant tiles. The SIMD tiles are tested against this one.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kvl/kquant.h"
#include "kvl/quant.h"
#include "kquant_kernels.h"

namespace kvl::ops {
namespace {

// Super-block sb of a row (copied: rows have no alignment).
template <typename Block>
Block LoadBlock(const uint8_t* row, int64_t sb) {
  Block b;
  std::memcpy(&b, row + sb * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

// Code of element l (< 32) of sub-block s of a Q4_K / Q5_K block.
template <typename Block>
int Code(const Block& b, int s, int l) {
  const uint8_t byte = b.qs[32 * (s / 2) + l];
  int q = s % 2 == 0 ? byte & 15 : byte >> 4;
  if constexpr (std::is_same_v<Block, BlockQ5_K>) q |= (b.qh[l] >> s & 1) << 4;
  return q;
}

// Code of element e (< 256) of a Q6_K block.
int Code6(const BlockQ6_K& b, int e) {
  const int h = e / 128, i = (e % 128) / 32, l = e % 32;
  const uint8_t low = b.ql[64 * h + 32 * (i & 1) + l];
  return (i < 2 ? low & 15 : low >> 4) | (b.qh[32 * h + l] >> (2 * i) & 3) << 4;
}

// Each sub-block's term is one fused multiply-add of its combined weight scale with its integer
// dot times the activation scale; with fp-contract off, std::fma is the only fusion, so the packed
// GEMM (gemm_kquant_avx512.cc) reproduces every rounding with vfmadd.
template <typename Block>
float DotScaledMin(const uint8_t* row, int64_t cols, const int8_t* x, const float* dx,
                   const float* sums) {
  float acc = 0.0f, acc_min = 0.0f;
  for (int64_t sb = 0; sb < cols / kQK_K; ++sb) {
    const Block b = LoadBlock<Block>(row, sb);
    const quant::ScalesMins sm = quant::UnpackScalesMins(b.scales);
    const float d = quant::Fp16ToFp32(b.d);
    const float dmin = quant::Fp16ToFp32(b.dmin);
    for (int s = 0; s < 8; ++s) {
      int32_t sum = 0;
      for (int l = 0; l < 32; ++l) sum += Code(b, s, l) * x[sb * kQK_K + 32 * s + l];
      acc = std::fma(d * static_cast<float>(sm.sc[s]), static_cast<float>(sum) * dx[8 * sb + s],
                     acc);
      acc_min = std::fma(dmin * static_cast<float>(sm.m[s]), sums[8 * sb + s], acc_min);
    }
  }
  return acc - acc_min;
}

// Q6_K's -32 offset is taken off each group's integer dot (sum (q - 32) * x, exact), so a group
// costs one fused multiply-add like a Q4_K sub-block and no second accumulator.
float DotQ6(const uint8_t* row, int64_t cols, const int8_t* x, const float* dx) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < cols / kQK_K; ++sb) {
    const BlockQ6_K b = LoadBlock<BlockQ6_K>(row, sb);
    const float d = quant::Fp16ToFp32(b.d);
    for (int g = 0; g < 16; ++g) {
      int32_t sum = 0;
      for (int l = 0; l < 16; ++l) sum += (Code6(b, 16 * g + l) - 32) * x[sb * kQK_K + 16 * g + l];
      acc = std::fma(d * static_cast<float>(b.scales[g]),
                     static_cast<float>(sum) * dx[8 * sb + g / 2], acc);
    }
  }
  return acc;
}

}  // namespace

void KQuantCodes(DType type, const uint8_t* block, uint8_t codes[kQK_K]) {
  // Whole runs of 32 codes at once (the formats' own loops, as in ggml's dequantizers); the
  // packed GEMM's tests check the result against Code / Code6 above through the scalar kernel.
  if (type == DType::kQ6_K) {
    const uint8_t* ql = block + offsetof(BlockQ6_K, ql);
    const uint8_t* qh = block + offsetof(BlockQ6_K, qh);
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const int low0 = ql[64 * h + l], low1 = ql[64 * h + 32 + l], high = qh[32 * h + l];
        uint8_t* c = codes + 128 * h + l;
        c[0] = static_cast<uint8_t>((low0 & 15) | (high & 3) << 4);
        c[32] = static_cast<uint8_t>((low1 & 15) | (high >> 2 & 3) << 4);
        c[64] = static_cast<uint8_t>((low0 >> 4) | (high >> 4 & 3) << 4);
        c[96] = static_cast<uint8_t>((low1 >> 4) | (high >> 6) << 4);
      }
    }
    return;
  }
  const bool q5 = type == DType::kQ5_K;
  const uint8_t* qs = block + (q5 ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs));
  const uint8_t* qh = block + offsetof(BlockQ5_K, qh);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int byte = qs[32 * (s / 2) + l];
      const int high = q5 ? (qh[l] >> s & 1) << 4 : 0;
      codes[32 * s + l] = static_cast<uint8_t>((s % 2 == 0 ? byte & 15 : byte >> 4) | high);
    }
  }
}

void KQuantActSums(DType type, const uint8_t* acts, int64_t cols, float* sums) {
  const auto* x = reinterpret_cast<const int8_t*>(acts);
  const auto* dx = reinterpret_cast<const float*>(acts + ActScalesOffset(cols));
  const int sub = type == DType::kQ6_K ? 16 : 32;
  for (int64_t i = 0; i < cols / sub; ++i) {
    int32_t s = 0;
    for (int l = 0; l < sub; ++l) s += x[i * sub + l];
    sums[i] = dx[i * sub / 32] * static_cast<float>(s);
  }
}

void ScalarKQuantMatMulTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  const MatrixView& w = a.w;
  float sums[kMaxKQuantCols / 16];
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* acts = a.acts + t * a.act_stride;
    const auto* x = reinterpret_cast<const int8_t*>(acts);
    const auto* dx = reinterpret_cast<const float*>(acts + ActScalesOffset(w.cols));
    if (w.type != DType::kQ6_K) KQuantActSums(w.type, acts, w.cols, sums);  // Q6_K: no mins
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
      float y;
      switch (w.type) {
        case DType::kQ4_K:
          y = DotScaledMin<BlockQ4_K>(row, w.cols, x, dx, sums);
          break;
        case DType::kQ5_K:
          y = DotScaledMin<BlockQ5_K>(row, w.cols, x, dx, sums);
          break;
        default:
          y = DotQ6(row, w.cols, x, dx);
      }
      a.y[t * w.rows + r] = y;
    }
  }
}

MatMulTileFn KQuantMatMulTile(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return Avx512KQuantMatMulTile;
    case Isa::kAvx2:
      return Avx2KQuantMatMulTile;
    default:
      return ScalarKQuantMatMulTile;
  }
}

}  // namespace kvl::ops
