// Reference kernels of the tiled online-softmax attention (ops.h, PackAttentionKeys /
// AttentionTile): the formulas as written, one row at a time. The SIMD paths make the same
// operations per row in the same order, fusing each multiply-add and using their own exp, so they
// differ from these by float rounding only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_table.h"
#include "kvl/ops.h"
#include "kvl/quant.h"

namespace kvl::ops {

void ScalarPackAttentionKeys(DType type, const void* rows, int64_t stride, int64_t count,
                             int64_t head_dim, float* kt, int64_t width, int64_t col) {
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < head_dim; ++c) {
      const int64_t e = i * stride + c;
      float value;
      if (type == DType::kF32) {
        value = static_cast<const float*>(rows)[e];
      } else if (type == DType::kF16) {
        value = quant::Fp16ToFp32(static_cast<const uint16_t*>(rows)[e]);
      } else {
        value = quant::Bf16ToFp32(static_cast<const uint16_t*>(rows)[e]);
      }
      kt[c * width + col + i] = value;
    }
  }
}

void ScalarAttentionTile(const float* kt, int64_t width, const float* const* v, int64_t count,
                         int64_t head_dim, float scale, const AttentionRows& rows) {
  float p[kMaxAttentionTileTokens];
  for (int64_t r = 0; r < rows.num_rows; ++r) {
    const float* q = rows.q[r];
    // Scores, one chain over the channels per key.
    std::fill(p, p + count, 0.0f);
    for (int64_t c = 0; c < head_dim; ++c) {
      const float* k = kt + c * width;
      for (int64_t j = 0; j < count; ++j) p[j] += q[c] * k[j];
    }
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < count; ++j) p[j] *= scale;
    if (rows.softcap > 0.0f) SoftCap(p, count, rows.softcap);
    for (int64_t j = 0; j < count; ++j) tile_max = std::max(tile_max, p[j]);
    if (rows.scores != nullptr && rows.scores[r] != nullptr) {
      std::memcpy(rows.scores[r], p, sizeof(float) * static_cast<size_t>(count));
    }
    // The running max, and the factor that moves what came before onto it.
    const float m_old = rows.m[r];
    const float m_new = std::max(m_old, tile_max);
    const float a = m_old == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m_old - m_new);
    float sum = 0.0f;
    for (int64_t j = 0; j < count; ++j) {
      p[j] = std::exp(p[j] - m_new);
      sum += p[j];
    }
    rows.m[r] = m_new;
    rows.l[r] = rows.l[r] * a + sum;
    float* acc = rows.acc[r];
    for (int64_t c = 0; c < head_dim; ++c) {
      float o = acc[c] * a;
      for (int64_t j = 0; j < count; ++j) o += p[j] * v[j][c];
      acc[c] = o;
    }
  }
}

}  // namespace kvl::ops
