// The f32 multiply-add ceiling the attention benchmark reports against: 16 independent vfmadd
// chains of 16 lanes on the calling thread, timed in its own CPU time (the machine is shared).
// Compiled with AVX-512 flags; attention_bench calls it only when the CPU runs the avx512 table.
#include <immintrin.h>

#include <cstdint>
#include <ctime>

namespace kvl::bench {

// GFLOPS (2 flops per multiply-add) of `iters` x 2 x 16 vfmadd231ps zmm on this thread.
double MeasureFmaPeakGflops(int64_t iters) {
  timespec t0, t1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  __m512 s[16];
  for (__m512& v : s) v = _mm512_setzero_ps();
  // Without reassociation (no -ffast-math) the chains cannot be folded; their sum is consumed
  // below, so they are not dead either, and they stay in registers.
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512& v : s) v = _mm512_fmadd_ps(v, x, y);
    for (__m512& v : s) v = _mm512_fmadd_ps(v, x, y);
  }
  __m512 sum = _mm512_setzero_ps();
  for (const __m512& v : s) sum = _mm512_add_ps(sum, v);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  const double seconds = static_cast<double>(t1.tv_sec - t0.tv_sec) +
                         1e-9 * static_cast<double>(t1.tv_nsec - t0.tv_nsec);
  return static_cast<double>(iters) * 2 * 16 * 16 * 2 / seconds * 1e-9;
}

}  // namespace kvl::bench
