// The int8 multiply-add ceiling the matmul benchmark reports against: independent vpdpbusd chains
// (16 per thread), on the given threads at once. Compiled with
// AVX-512 VNNI flags; matmul_bench calls it only when the CPU runs the avx512 table (VNNI).
#include <immintrin.h>

#include <ctime>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvl::bench {
namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

// int8 GOPS (2 ops per multiply-add) of `threads` threads running at once, each `iters` x 2 x 16
// vpdpbusd. Each thread times itself in its own CPU time, so time the machine's other processes
// take from it does not count (the machine is shared): the sum is what `threads` cores can do.
double MeasureVnniPeakGops(int threads, int64_t iters) {
  std::vector<double> gops(static_cast<size_t>(threads));
  const auto run = [iters](double* out) {
    const double t0 = ThreadCpuSeconds();
    const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
    __m512i s[16];
    for (__m512i& v : s) v = _mm512_setzero_si512();
    for (int64_t i = 0; i < iters; ++i) {
      // Two rounds between the barriers: with a barrier after every round the loop ran at half
      // the rate on Zen 5 (and the shared vnni_peak.c's 10 chains at about the same).
      for (__m512i& v : s) v = _mm512_dpbusd_epi32(v, x, y);
      for (__m512i& v : s) v = _mm512_dpbusd_epi32(v, x, y);
      // Keeps the chains in registers and the loop from being folded.
      __asm__ volatile("" : "+v"(s[0]), "+v"(s[1]), "+v"(s[2]), "+v"(s[3]), "+v"(s[4]),
                       "+v"(s[5]), "+v"(s[6]), "+v"(s[7]));
      __asm__ volatile("" : "+v"(s[8]), "+v"(s[9]), "+v"(s[10]), "+v"(s[11]), "+v"(s[12]),
                       "+v"(s[13]), "+v"(s[14]), "+v"(s[15]));
    }
    *out = static_cast<double>(iters) * 2 * 16 * 64 * 2 / (ThreadCpuSeconds() - t0) * 1e-9;
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) workers.emplace_back(run, &gops[static_cast<size_t>(i)]);
  for (std::thread& t : workers) t.join();
  double sum = 0;
  for (double g : gops) sum += g;
  return sum;
}

}  // namespace kvl::bench
