// The int8 multiply-add ceiling the matmul benchmark reports against: independent vpdpbusd chains
// (10 per thread, more than latency x throughput), on the given threads at once. Compiled with
// AVX-512 VNNI flags; matmul_bench calls it only when the CPU runs the avx512 table (VNNI).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvl::bench {

// int8 GOPS (2 ops per multiply-add) of `threads` threads, each running `iters` x 10 vpdpbusd.
double MeasureVnniPeakGops(int threads, int64_t iters) {
  const auto run = [iters] {
    const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
    __m512i s[10];
    for (__m512i& v : s) v = _mm512_setzero_si512();
    for (int64_t i = 0; i < iters; ++i) {
      for (__m512i& v : s) v = _mm512_dpbusd_epi32(v, x, y);
      __asm__ volatile("" : "+v"(s[0]), "+v"(s[1]), "+v"(s[2]), "+v"(s[3]), "+v"(s[4]),
                       "+v"(s[5]), "+v"(s[6]), "+v"(s[7]), "+v"(s[8]), "+v"(s[9]));
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) workers.emplace_back(run);
  for (std::thread& t : workers) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(iters) * 10 * 64 * 2 * threads / seconds * 1e-9;
}

}  // namespace kvl::bench
