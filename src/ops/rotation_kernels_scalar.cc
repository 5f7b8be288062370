// The orthonormal Walsh-Hadamard rotation of rows (ops.h, HadamardRotate), the scalar reference
// every ISA's kernel matches bit for bit: a fast Walsh-Hadamard transform (log2(n) stages of
// butterflies a + b, a - b), then one multiply by the scale. Each output is the same additions of
// the same operands whatever order the butterflies of a stage are done in, so the SIMD kernels,
// which do them several at a time, give the same bits.
#include "kernel_table.h"

namespace kvl::ops {

void ScalarHadamardRows(float* x, int64_t rows, int64_t n, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    for (int64_t h = 1; h < n; h *= 2) {
      for (int64_t i = 0; i < n; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) v[i] *= scale;
  }
}

}  // namespace kvl::ops
