// Activations that follow ggml's CPU arithmetic to the bit where kvlattice must match llama.cpp:
// the f16-table tanh GELU of Gemma's GeGLU, and soft-capping. Scalar on every ISA: a table lookup
// and tanhf have no faster exact form.
#include <cmath>
#include <cstring>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"

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

void GeGlu(const OpsContext& /*ctx*/, float* gate, const float* up, int64_t n) {
  const uint16_t* table = GeluTable().data();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    float g;
    if (x <= -10.0f) {
      g = 0.0f;
    } else if (x >= 10.0f) {
      g = x;
    } else {
      g = quant::Fp16ToFp32(table[quant::Fp32ToFp16(x)]);
    }
    gate[i] = g * up[i];
  }
}

void SoftCap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] * inv) * cap;
}

}  // namespace kvl::ops
