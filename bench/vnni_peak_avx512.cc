// The int8 multiply-add ceiling the matmul benchmark reports against: independent vpdpbusd chains
// on the given threads at once, in two loop shapes, of which the faster counts. Compiled with
// AVX-512 VNNI flags; matmul_bench calls it only when the CPU runs the avx512 table (VNNI).
//
// Why two shapes: the compiler barrier that keeps the chains in registers costs differently per
// core. On Zen 5, 16 chains with two rounds between barriers ran at twice the rate of 10 chains
// with one (the shared tools/vnni_peak.c); on a Zen 4 VM (2026-11-26) the 10-chain loop ran at
// 1.3-1.4x the 16-chain one (466 against 340 GOPS on one thread). A peak below the machine's
// makes every "%peak" above it a lie (the bench printed 111-125% on that Zen 4).
#include <immintrin.h>

#include <algorithm>
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

// 16 chains, two rounds between barriers: iters x 32 vpdpbusd.
int64_t SixteenChainsTwoRounds(int64_t iters) {
  const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
  __m512i s[16];
  for (__m512i& v : s) v = _mm512_setzero_si512();
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512i& v : s) v = _mm512_dpbusd_epi32(v, x, y);
    for (__m512i& v : s) v = _mm512_dpbusd_epi32(v, x, y);
    // Keeps the chains in registers and the loop from being folded.
    __asm__ volatile("" : "+v"(s[0]), "+v"(s[1]), "+v"(s[2]), "+v"(s[3]), "+v"(s[4]), "+v"(s[5]),
                     "+v"(s[6]), "+v"(s[7]));
    __asm__ volatile("" : "+v"(s[8]), "+v"(s[9]), "+v"(s[10]), "+v"(s[11]), "+v"(s[12]),
                     "+v"(s[13]), "+v"(s[14]), "+v"(s[15]));
  }
  return iters * 32;
}

// 10 chains, one round between barriers (tools/vnni_peak.c's loop): iters x 10 vpdpbusd.
int64_t TenChainsOneRound(int64_t iters) {
  const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
          s7 = s0, s8 = s0, s9 = s0;
  for (int64_t i = 0; i < iters; ++i) {
    s0 = _mm512_dpbusd_epi32(s0, x, y);
    s1 = _mm512_dpbusd_epi32(s1, x, y);
    s2 = _mm512_dpbusd_epi32(s2, x, y);
    s3 = _mm512_dpbusd_epi32(s3, x, y);
    s4 = _mm512_dpbusd_epi32(s4, x, y);
    s5 = _mm512_dpbusd_epi32(s5, x, y);
    s6 = _mm512_dpbusd_epi32(s6, x, y);
    s7 = _mm512_dpbusd_epi32(s7, x, y);
    s8 = _mm512_dpbusd_epi32(s8, x, y);
    s9 = _mm512_dpbusd_epi32(s9, x, y);
    __asm__ volatile("" : "+v"(s0), "+v"(s1), "+v"(s2), "+v"(s3), "+v"(s4), "+v"(s5), "+v"(s6),
                     "+v"(s7), "+v"(s8), "+v"(s9));
  }
  return iters * 10;
}

// int8 GOPS (2 ops per multiply-add, 64 per vpdpbusd) of `threads` threads running `loop` at
// once. Each thread times itself in its own CPU time, so time the machine's other processes take
// from it does not count (the machine is shared): the sum is what `threads` cores can do.
double GopsOnThreads(int threads, int64_t (*loop)(int64_t), int64_t iters) {
  std::vector<double> gops(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      const double t0 = ThreadCpuSeconds();
      const int64_t instructions = loop(iters);
      gops[static_cast<size_t>(i)] =
          static_cast<double>(instructions) * 64 * 2 / (ThreadCpuSeconds() - t0) * 1e-9;
    });
  }
  for (std::thread& t : workers) t.join();
  double sum = 0;
  for (double g : gops) sum += g;
  return sum;
}

}  // namespace

// The faster of the two loop shapes, each running `dpbusd_per_thread` instructions per thread.
double MeasureVnniPeakGops(int threads, int64_t dpbusd_per_thread) {
  return std::max(GopsOnThreads(threads, SixteenChainsTwoRounds, dpbusd_per_thread / 32),
                  GopsOnThreads(threads, TenChainsOneRound, dpbusd_per_thread / 10));
}

}  // namespace kvl::bench
