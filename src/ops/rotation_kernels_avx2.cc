// AVX2 kernel of the Walsh-Hadamard rotation (ops.h, HadamardRotate): the butterflies of stages
// 1, 2 and 4 inside each 8-float vector (a lane permute, an add, a subtract, a blend), the wider
// stages between vectors, then the scale. Every output gets the scalar reference's additions of
// the same operands (rotation_kernels_scalar.cc), so the bits are the same.
#include <immintrin.h>

#include "kernel_table.h"

namespace kvl::ops {
namespace {

// One butterfly stage inside a vector: lanes outside kUpper get a + partner, the lanes in it
// partner - a (their partner is the lower index of the pair).
template <int kUpper>
__m256 InVectorStage(__m256 a, __m256 partner) {
  return _mm256_blend_ps(_mm256_add_ps(a, partner), _mm256_sub_ps(partner, a), kUpper);
}

}  // namespace

void Avx2HadamardRows(float* x, int64_t rows, int64_t n, float scale) {
  if (n < 8) {
    ScalarHadamardRows(x, rows, n, scale);
    return;
  }
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    for (int64_t i = 0; i < n; i += 8) {
      __m256 a = _mm256_loadu_ps(v + i);
      a = InVectorStage<0xAA>(a, _mm256_permute_ps(a, 0xB1));
      a = InVectorStage<0xCC>(a, _mm256_permute_ps(a, 0x4E));
      a = InVectorStage<0xF0>(a, _mm256_permute2f128_ps(a, a, 0x01));
      _mm256_storeu_ps(v + i, a);
    }
    for (int64_t h = 8; h < n; h *= 2) {
      for (int64_t i = 0; i < n; i += 2 * h) {
        for (int64_t j = i; j < i + h; j += 8) {
          const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h);
          _mm256_storeu_ps(v + j, _mm256_add_ps(a, b));
          _mm256_storeu_ps(v + j + h, _mm256_sub_ps(a, b));
        }
      }
    }
    for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), s));
  }
}

}  // namespace kvl::ops
