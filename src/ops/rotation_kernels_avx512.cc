// AVX-512 kernel of the Walsh-Hadamard rotation (ops.h, HadamardRotate): the butterflies of
// stages 1 to 8 inside each 16-float vector (a lane permute, an add, a subtract, a masked blend),
// the wider stages between vectors, then the scale. Every output gets the scalar reference's
// additions of the same operands (rotation_kernels_scalar.cc), so the bits are the same.
#include <immintrin.h>

#include "kernel_table.h"

namespace kvl::ops {
namespace {

// One butterfly stage inside a vector: lanes outside `upper` get a + partner, the lanes in it
// partner - a (their partner is the lower index of the pair).
__m512 InVectorStage(__m512 a, __m512 partner, __mmask16 upper) {
  return _mm512_mask_blend_ps(upper, _mm512_add_ps(a, partner), _mm512_sub_ps(partner, a));
}

}  // namespace

void Avx512HadamardRows(float* x, int64_t rows, int64_t n, float scale) {
  if (n < 16) {
    ScalarHadamardRows(x, rows, n, scale);
    return;
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    for (int64_t i = 0; i < n; i += 16) {
      __m512 a = _mm512_loadu_ps(v + i);
      a = InVectorStage(a, _mm512_permute_ps(a, 0xB1), 0xAAAA);
      a = InVectorStage(a, _mm512_permute_ps(a, 0x4E), 0xCCCC);
      a = InVectorStage(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)), 0xF0F0);
      a = InVectorStage(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(1, 0, 3, 2)), 0xFF00);
      _mm512_storeu_ps(v + i, a);
    }
    for (int64_t h = 16; h < n; h *= 2) {
      for (int64_t i = 0; i < n; i += 2 * h) {
        for (int64_t j = i; j < i + h; j += 16) {
          const __m512 a = _mm512_loadu_ps(v + j), b = _mm512_loadu_ps(v + j + h);
          _mm512_storeu_ps(v + j, _mm512_add_ps(a, b));
          _mm512_storeu_ps(v + j + h, _mm512_sub_ps(a, b));
        }
      }
    }
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(v + i, _mm512_mul_ps(_mm512_loadu_ps(v + i), s));
  }
}

}  // namespace kvl::ops
