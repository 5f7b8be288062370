// Reference kernels for attention over compressed KV pages (format: kvl/kv_codec.h, view:
// ops::QuantKvLayerView). The SIMD paths compute the same sums in the same factored form, so
// they differ from these by float rounding only.
//
// The factored form is what makes reading codes directly cheap: the per-channel key scale folds
// into the query once per call (qs[c] = q[c] * k_scale[c]), so a row costs one multiply-add per
// code; for int4 the key minimum contributes sum_c q[c] * k_min[c], one constant per call. Values
// fold the per-(token, group) scale into the attention weight, and for int4 the minimum's share,
// sum_i w_i * v_min[i][g], is summed per group and added once at the end.
#include <algorithm>

#include "kernel_table.h"
#include "kvl/quant.h"

namespace kvl::ops {
namespace {

float Code8(const uint8_t* row, int64_t c) {
  return static_cast<float>(static_cast<int8_t>(row[c]));
}
float Code4(const uint8_t* row, int64_t c) {
  return static_cast<float>((row[c >> 1] >> ((c & 1) * 4)) & 0x0F);
}

template <int kBits>
void DotRowsK(const float* q, const QuantKvLayerView& page, int64_t first_row, int64_t count,
              int64_t head_offset, int64_t head_dim, float scale, float* out) {
  float qs[kMaxQuantHeadDim];
  float bias = 0.0f;
  for (int64_t c = 0; c < head_dim; ++c) {
    qs[c] = q[c] * page.k_scale[head_offset + c];
    if (kBits == 4) bias += q[c] * page.k_min[head_offset + c];
  }
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* row = page.k_q + (first_row + i) * page.row_bytes;
    float acc = 0.0f;
    for (int64_t c = 0; c < head_dim; ++c) {
      const float code = kBits == 8 ? Code8(row, head_offset + c) : Code4(row, head_offset + c);
      acc += qs[c] * code;
    }
    out[i] = (acc + bias) * scale;
  }
}

template <int kBits>
void AxpyRowsV(const float* weights, const QuantKvLayerView& page, int64_t first_row, int64_t count,
               int64_t head_offset, int64_t head_dim, float* y) {
  // The head's channels walked in runs that share a value group (no division per element).
  // ops.cc checks v_group % 32 == 0 or v_group == kv_dim: at most head_dim / 32 + 2 groups.
  const int64_t gs = page.v_group, g_first = head_offset / gs;
  float bias[kMaxQuantHeadDim / 32 + 2] = {};  // per overlapped group (int4 only)
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = first_row + i;
    const uint8_t* row = page.v_q + r * page.row_bytes;
    for (int64_t c = 0; c < head_dim;) {
      const int64_t g = (head_offset + c) / gs;
      const int64_t end = std::min(head_dim, (g + 1) * gs - head_offset);
      const float coef = weights[i] * page.v_scale[r * page.v_groups + g];
      for (; c < end; ++c) {
        const int64_t ch = head_offset + c;
        y[c] += coef * (kBits == 8 ? Code8(row, ch) : Code4(row, ch));
      }
      if (kBits == 4) bias[g - g_first] += weights[i] * page.v_min[r * page.v_groups + g];
    }
  }
  if (kBits == 4) {
    for (int64_t c = 0; c < head_dim;) {
      const int64_t g = (head_offset + c) / gs;
      const int64_t end = std::min(head_dim, (g + 1) * gs - head_offset);
      for (; c < end; ++c) y[c] += bias[g - g_first];
    }
  }
}

}  // namespace

void ScalarDotRowsKInt8(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out) {
  DotRowsK<8>(q, page, first_row, count, head_offset, head_dim, scale, out);
}
void ScalarDotRowsKInt4(const float* q, const QuantKvLayerView& page, int64_t first_row,
                        int64_t count, int64_t head_offset, int64_t head_dim, float scale,
                        float* out) {
  DotRowsK<4>(q, page, first_row, count, head_offset, head_dim, scale, out);
}
void ScalarAxpyRowsVInt8(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y) {
  AxpyRowsV<8>(weights, page, first_row, count, head_offset, head_dim, y);
}
void ScalarAxpyRowsVInt4(const float* weights, const QuantKvLayerView& page, int64_t first_row,
                         int64_t count, int64_t head_offset, int64_t head_dim, float* y) {
  AxpyRowsV<4>(weights, page, first_row, count, head_offset, head_dim, y);
}

// One row of a compressed page decoded by the format's formulas (ops.h, QuantKvLayerView): the
// values the tiled attention reads compressed pages as.
void ScalarDequantizeQuantKvRow(const QuantKvLayerView& page, int64_t row, int64_t head_offset,
                                int64_t head_dim, float* k_out, float* v_out) {
  const bool int4 = page.bits == 4;
  if (k_out != nullptr) {
    const uint8_t* codes = page.k_q + row * page.row_bytes;
    for (int64_t c = 0; c < head_dim; ++c) {
      const int64_t ch = head_offset + c;
      k_out[c] = int4 ? page.k_scale[ch] * Code4(codes, ch) + page.k_min[ch]
                      : page.k_scale[ch] * Code8(codes, ch);
    }
  }
  if (v_out != nullptr) {
    const uint8_t* codes = page.v_q + row * page.row_bytes;
    for (int64_t c = 0; c < head_dim; ++c) {
      const int64_t ch = head_offset + c;
      const int64_t g = row * page.v_groups + ch / page.v_group;
      v_out[c] = int4 ? page.v_scale[g] * Code4(codes, ch) + page.v_min[g]
                      : page.v_scale[g] * Code8(codes, ch);
    }
  }
}

// q8_0 / q4_0 cache rows (ops.h, DequantizeCols): value = code * fp16(d), one float multiply of
// the exactly converted code, as ggml's reference dequantizers compute it; the SIMD tables make
// the same multiply on whole blocks and come here for the partial ones at a head's edges.
void ScalarDequantizeCols(DType type, const uint8_t* row, int64_t col, int64_t n, float* out) {
  for (int64_t c = col; c < col + n; ++c) {
    const int64_t b = c / quant::kQK;
    const int64_t j = c % quant::kQK;
    if (type == DType::kQ8_0) {
      const auto* block = reinterpret_cast<const quant::BlockQ8_0*>(row) + b;
      out[c - col] = static_cast<float>(block->qs[j]) * quant::Fp16ToFp32(block->d);
    } else {
      const auto* block = reinterpret_cast<const quant::BlockQ4_0*>(row) + b;
      const int code = j < quant::kQK / 2 ? (block->qs[j] & 0x0F) : (block->qs[j - quant::kQK / 2] >> 4);
      out[c - col] = static_cast<float>(code - 8) * quant::Fp16ToFp32(block->d);
    }
  }
}

void DequantizeColsBy(DequantizeBlockFn block, DType type, const uint8_t* row, int64_t col,
                      int64_t n, float* out) {
  const int64_t block_bytes = Traits(type).block_bytes;
  const int64_t end = col + n;
  for (int64_t c = col; c < end;) {
    const int64_t block_end = (c / quant::kQK + 1) * quant::kQK;
    const int64_t len = std::min(block_end, end) - c;
    if (len == quant::kQK) {
      block(type, row + c / quant::kQK * block_bytes, out + (c - col));
    } else {
      ScalarDequantizeCols(type, row, c, len, out + (c - col));
    }
    c += len;
  }
}

}  // namespace kvl::ops
