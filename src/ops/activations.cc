// Activations that follow ggml's CPU arithmetic to the bit where kvlattice must match llama.cpp:
// the f16-table tanh GELU of Gemma's GeGLU, and soft-capping. The table lookup itself is scalar
// (it has no faster exact form); GeGlu converts to and from f16 with the ISA's row kernels, which
// give quant::Fp32ToFp16's bits, and spreads the rows over the pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_table.h"
#include "kvl/ops.h"
#include "kvl/quant.h"
#include "kvl/thread_pool.h"

namespace kvl::ops {
namespace {

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefA = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoefA * x * x)));
}

// gelu of every f16 value, rounded to f16: ggml's table, built the same way on first use.
const std::vector<uint16_t>& GeluTable() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = quant::Fp16ToFp32(static_cast<uint16_t>(i));
      t[i] = quant::Fp32ToFp16(GeluTanh(x));
    }
    return t;
  }();
  return table;
}

}  // namespace

float GeluTanhF16(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return quant::Fp16ToFp32(GeluTable()[quant::Fp32ToFp16(x)]);
}

// GeluTanhF16(gate[i]) * up[i], chunk by chunk: the software f16 conversions of the scalar form
// cost a Gemma decode step ~1.7 ms of one thread (26 layers x 6912 values) and a pp512 prefill
// ~0.9 s; narrow_row / widen_row are a few instructions per 16 values.
void GeGlu(const OpsContext& ctx, float* gate, const float* up, int64_t n) {
  const uint16_t* table = GeluTable().data();
  const KernelTable& k = ctx.kernels();
  constexpr int64_t kChunk = 1024;
  auto chunk = [&](int64_t c, int /*thread*/) {
    const int64_t i0 = c * kChunk, len = std::min(kChunk, n - c * kChunk);
    float* g = gate + i0;
    uint16_t h[kChunk];
    float gelu[kChunk];
    k.narrow_row(DType::kF16, g, len, h);
    for (int64_t i = 0; i < len; ++i) h[i] = table[h[i]];
    k.widen_row(DType::kF16, h, len, gelu);
    for (int64_t i = 0; i < len; ++i) {
      const float x = g[i];
      const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : gelu[i];
      g[i] = y * up[i0 + i];
    }
  };
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (ctx.pool() != nullptr && chunks > 1) {
    ctx.pool()->ParallelFor(chunks, chunk);
  } else {
    for (int64_t c = 0; c < chunks; ++c) chunk(c, 0);
  }
}

void SoftCap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] * inv) * cap;
}

}  // namespace kvl::ops
