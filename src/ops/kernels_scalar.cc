// Reference kernels: plain C++, compiled for baseline x86-64 (so no FMA contraction). The SIMD
// paths are tested against these.
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>

#include "kvl/quant.h"
#include "kernel_table.h"

namespace kvl::ops {
namespace {

float WeightAt(DType type, const uint8_t* row, int64_t k) {
  switch (type) {
    case DType::kF32: {
      float v;
      __builtin_memcpy(&v, row + 4 * k, 4);
      return v;
    }
    case DType::kF16: {
      uint16_t h;
      __builtin_memcpy(&h, row + 2 * k, 2);
      return quant::Fp16ToFp32(h);
    }
    default: {  // kBF16
      uint16_t h;
      __builtin_memcpy(&h, row + 2 * k, 2);
      return quant::Bf16ToFp32(h);
    }
  }
}

// Signed weight value j (< 32) of a Q8_0 / Q4_0 block, and the block's scale.
int BlockValue(DType type, const uint8_t* block, int j) {
  if (type == DType::kQ8_0) return static_cast<int8_t>(block[2 + j]);
  const uint8_t byte = block[2 + (j & 15)];
  return (j < 16 ? (byte & 0xF) : (byte >> 4)) - 8;
}
float BlockScale(const uint8_t* block) {
  uint16_t h;
  __builtin_memcpy(&h, block, 2);
  return quant::Fp16ToFp32(h);
}

void MatMulTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  const MatrixView& w = a.w;
  const bool quantized = w.type == DType::kQ8_0 || w.type == DType::kQ4_0;
  const int64_t block_bytes = w.type == DType::kQ8_0 ? 34 : 18;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
      float acc = 0.0f;
      if (quantized) {
        const auto* q = reinterpret_cast<const int8_t*>(a.acts + t * a.act_stride);
        const auto* d = reinterpret_cast<const float*>(a.acts + t * a.act_stride +
                                                       ActScalesOffset(w.cols));
        for (int64_t b = 0; b < w.cols / 32; ++b) {
          const uint8_t* block = row + b * block_bytes;
          int32_t sum = 0;
          for (int j = 0; j < 32; ++j) sum += BlockValue(w.type, block, j) * q[b * 32 + j];
          acc += static_cast<float>(sum) * (BlockScale(block) * d[b]);
        }
      } else {
        const float* x = a.x + t * w.cols;
        for (int64_t k = 0; k < w.cols; ++k) acc += WeightAt(w.type, row, k) * x[k];
      }
      a.y[t * w.rows + r] = acc;
    }
  }
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void Softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void Add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// ---------------------------------------------------------------------------------------------
// Attention over f16 / bf16 rows: Dot and Axpy above with each row element widened first. The
// widening is exact, so the float operations (and their order) are those of Dot / Axpy over the
// widened rows, which is what ops.h promises.

template <DType T>
float Widen(uint16_t h) {
  if constexpr (T == DType::kF16) return quant::Fp16ToFp32(h);
  return quant::Bf16ToFp32(h);
}

template <DType T>
void DotRowsHalfT(const float* q, const uint16_t* rows, int64_t stride, int64_t count, int64_t n,
                  float scale, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t* row = rows + i * stride;
    float s = 0.0f;
    for (int64_t k = 0; k < n; ++k) s += q[k] * Widen<T>(row[k]);
    out[i] = s * scale;
  }
}

template <DType T>
void AxpyRowsHalfT(const float* weights, const uint16_t* rows, int64_t stride, int64_t count,
                   int64_t n, float* y) {
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t* row = rows + i * stride;
    for (int64_t k = 0; k < n; ++k) y[k] += weights[i] * Widen<T>(row[k]);
  }
}

void DotRowsHalf(DType type, const float* q, const uint16_t* rows, int64_t stride, int64_t count,
                 int64_t n, float scale, float* out) {
  if (type == DType::kF16) return DotRowsHalfT<DType::kF16>(q, rows, stride, count, n, scale, out);
  DotRowsHalfT<DType::kBF16>(q, rows, stride, count, n, scale, out);
}

void AxpyRowsHalf(DType type, const float* weights, const uint16_t* rows, int64_t stride,
                  int64_t count, int64_t n, float* y) {
  if (type == DType::kF16) return AxpyRowsHalfT<DType::kF16>(weights, rows, stride, count, n, y);
  AxpyRowsHalfT<DType::kBF16>(weights, rows, stride, count, n, y);
}

// The quant layer's converters are the reference the SIMD paths must match bit for bit.
void NarrowRow(DType type, const float* x, int64_t n, uint16_t* out) {
  quant::QuantizeRow(type, x, n, out);
}

void WidenRow(DType type, const uint16_t* x, int64_t n, float* out) {
  quant::DequantizeRow(type, x, n, out);
}

}  // namespace

void ScalarQuantizeActs(const float* x, int64_t cols, uint8_t* out) {
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* scales = reinterpret_cast<float*>(out + ActScalesOffset(cols));
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    scales[b] = d;
    // Round half to even (the default rounding mode), as the SIMD cvtps2dq paths do.
    for (int j = 0; j < 32; ++j) {
      // cvtss2si rounds in the current (default: nearest-even) mode and is inline, unlike
      // nearbyintf on baseline x86-64.
      q[b * 32 + j] = static_cast<int8_t>(_mm_cvt_ss2si(_mm_set_ss(x[b * 32 + j] * id)));
    }
  }
}

void ScalarRope(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
                bool neox) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + half : 2 * i + 1;
      const float a = v[i0];
      const float b = v[i1];
      v[i0] = a * cos[i] - b * sin[i];
      v[i1] = a * sin[i] + b * cos[i];
    }
  }
}

const KernelTable& ScalarKernels() {
  static const KernelTable table = {
      .matmul_tile = MatMulTile,
      .quantize_acts = ScalarQuantizeActs,
      .rms_norm = RmsNorm,
      .rope = ScalarRope,
      .softmax = Softmax,
      .swiglu = SwiGlu,
      .add = Add,
      .dot = Dot,
      .axpy = Axpy,
      .dot_rows_half = DotRowsHalf,
      .axpy_rows_half = AxpyRowsHalf,
      .narrow_row = NarrowRow,
      .widen_row = WidenRow,
      .dequantize_cols = ScalarDequantizeCols,
      .dot_rows_k_int8 = ScalarDotRowsKInt8,
      .dot_rows_k_int4 = ScalarDotRowsKInt4,
      .axpy_rows_v_int8 = ScalarAxpyRowsVInt8,
      .axpy_rows_v_int4 = ScalarAxpyRowsVInt4,
      .pack_attention_keys = ScalarPackAttentionKeys,
      .attention_tile = ScalarAttentionTile,
      .hadamard_rows = ScalarHadamardRows,
  };
  return table;
}

}  // namespace kvl::ops
