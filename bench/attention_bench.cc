// Attention kernel throughput for one KV head over a context of N cached positions, on one
// thread: the tiled online softmax (ops::PackAttentionKeys + ops::AttentionTile, what Forward
// runs) against the per-row kernels it replaced (DotRows + Softmax + AxpyRows per query row,
// which read every K/V row once per query head and keep a score row of the context's length).
//
// Rows are the query rows sharing the KV head: 8 is a TinyLlama decode step (its GQA group), 64
// a prefill work item (8 positions x 8 heads). GFLOPS counts 4 flops per (row, position, channel)
// (a multiply-add in q.K and one in p.V); the peak of the FMA units is measured on the same
// thread, so the fraction says where the kernel stands.
//
// Usage: attention_bench [--json] [--cpu-time] [--ctx=512,4096] [--rows=8,64]
//   --cpu-time: this thread's CPU time instead of wall time (on a shared machine).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/ops.h"
#include "kvl/quant.h"
#include "kvl/thread_pool.h"

namespace kvl::bench {
double MeasureFmaPeakGflops(int64_t iters);
}  // namespace kvl::bench

namespace {

using namespace kvl;

bool g_cpu_time = false;
double Seconds() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best-of-N seconds per call over about 0.25 s of calls (at least 3).
template <typename Fn>
double BestSeconds(Fn&& fn) {
  fn();
  const double t_probe = Seconds();
  fn();
  const double probe = Seconds() - t_probe;
  const int reps = std::max(3, static_cast<int>(0.25 / std::max(probe, 1e-6)));
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = Seconds();
    fn();
    best = std::min(best, Seconds() - t0);
  }
  return best;
}

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p != '\0';) {
    out.push_back(std::atoll(p));
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return out;
}

// One KV head's cache rows ([ctx][head_dim], f32 or f16) and `rows` query rows.
struct Case {
  Case(DType type, int64_t head_dim, int64_t ctx, int64_t rows) : type(type), d(head_dim), n(ctx) {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    k32.resize(static_cast<size_t>(n * d));
    v32.resize(static_cast<size_t>(n * d));
    for (float& x : k32) x = dist(rng);
    for (float& x : v32) x = dist(rng);
    if (type == DType::kF16) {
      for (float x : k32) k16.push_back(quant::Fp32ToFp16(x));
      for (float x : v32) v16.push_back(quant::Fp32ToFp16(x));
    }
    q.resize(static_cast<size_t>(rows * d));
    for (float& x : q) x = dist(rng);
    out.resize(q.size());
    scores.resize(static_cast<size_t>(n));
  }
  DType type;
  int64_t d, n;
  std::vector<float> k32, v32, q, out, scores;
  std::vector<uint16_t> k16, v16;
};

// The per-row kernels: for each query row, scores over the context, softmax, then the values.
void RowKernels(const ops::OpsContext& ctx, Case& c, int64_t rows, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* q = &c.q[static_cast<size_t>(r * c.d)];
    float* out = &c.out[static_cast<size_t>(r * c.d)];
    std::fill(out, out + c.d, 0.0f);
    if (c.type == DType::kF32) {
      ops::DotRows(ctx, q, c.k32.data(), c.d, c.n, c.d, scale, c.scores.data());
      ops::Softmax(ctx, c.scores.data(), c.n);
      ops::AxpyRows(ctx, c.scores.data(), c.v32.data(), c.d, c.n, c.d, out);
    } else {
      ops::DotRowsHalf(ctx, c.type, q, c.k16.data(), c.d, c.n, c.d, scale, c.scores.data());
      ops::Softmax(ctx, c.scores.data(), c.n);
      ops::AxpyRowsHalf(ctx, c.type, c.scores.data(), c.v16.data(), c.d, c.n, c.d, out);
    }
  }
}

// What Forward does per work item: per tile, pack the keys, widen the values where the cache
// holds halves, one AttentionTile call for every row; then out = acc / l.
struct TiledScratch {
  explicit TiledScratch(int64_t rows, int64_t tile, int64_t d)
      : kt_storage(static_cast<size_t>(ops::kAttentionTileFloats + 16)),
        v_stage(static_cast<size_t>(tile * d)), v_rows(static_cast<size_t>(tile)),
        q_rows(static_cast<size_t>(rows)), acc_rows(static_cast<size_t>(rows)),
        m(static_cast<size_t>(rows)), l(static_cast<size_t>(rows)) {
    const auto addr = reinterpret_cast<uintptr_t>(kt_storage.data());
    kt = reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
  }
  std::vector<float> kt_storage;
  float* kt;
  std::vector<float> v_stage;
  std::vector<const float*> v_rows, q_rows;
  std::vector<float*> acc_rows;
  std::vector<float> m, l;
};

void Tiled(const ops::OpsContext& ctx, Case& c, int64_t rows, float scale, TiledScratch& s) {
  const int64_t tile = ops::AttentionTileTokens(c.d);
  for (int64_t r = 0; r < rows; ++r) {
    s.q_rows[static_cast<size_t>(r)] = &c.q[static_cast<size_t>(r * c.d)];
    s.acc_rows[static_cast<size_t>(r)] = &c.out[static_cast<size_t>(r * c.d)];
    std::fill(s.acc_rows[static_cast<size_t>(r)], s.acc_rows[static_cast<size_t>(r)] + c.d, 0.0f);
    s.m[static_cast<size_t>(r)] = -std::numeric_limits<float>::infinity();
    s.l[static_cast<size_t>(r)] = 0.0f;
  }
  ops::AttentionRows ar;
  ar.num_rows = rows;
  ar.q = s.q_rows.data();
  ar.m = s.m.data();
  ar.l = s.l.data();
  ar.acc = s.acc_rows.data();
  for (int64_t begin = 0; begin < c.n; begin += tile) {
    const int64_t count = std::min(tile, c.n - begin);
    const size_t e = static_cast<size_t>(begin * c.d);
    if (c.type == DType::kF32) {
      ops::PackAttentionKeys(ctx, c.type, &c.k32[e], c.d, count, c.d, s.kt, tile, 0);
      for (int64_t i = 0; i < count; ++i) s.v_rows[static_cast<size_t>(i)] = &c.v32[e + i * c.d];
    } else {
      ops::PackAttentionKeys(ctx, c.type, &c.k16[e], c.d, count, c.d, s.kt, tile, 0);
      for (int64_t i = 0; i < count; ++i) {
        float* v = &s.v_stage[static_cast<size_t>(i * c.d)];
        ops::WidenRow(ctx, c.type, &c.v16[e + static_cast<size_t>(i * c.d)], c.d, v);
        s.v_rows[static_cast<size_t>(i)] = v;
      }
    }
    ops::AttentionTile(ctx, s.kt, tile, s.v_rows.data(), count, c.d, scale, ar);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / s.l[static_cast<size_t>(r)];
    for (int64_t k = 0; k < c.d; ++k) s.acc_rows[static_cast<size_t>(r)][k] *= inv;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<int64_t> contexts = {512, 4096};
  std::vector<int64_t> row_counts = {8, 64};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strncmp(argv[i], "--ctx=", 6) == 0) {
      contexts = ParseList(argv[i] + 6);
    } else if (std::strncmp(argv[i], "--rows=", 7) == 0) {
      row_counts = ParseList(argv[i] + 7);
    } else {
      std::fprintf(stderr, "usage: attention_bench [--json] [--cpu-time] [--ctx=N,..] [--rows=R,..]\n");
      return 1;
    }
  }
  ThreadPool pool(1);
  const ops::Isa isa = ops::BestIsa();
  ops::OpsContext ctx(isa, &pool);
  // The best of several short runs: a shared machine (and its host) takes time from any one.
  double peak = 0.0;
  for (int i = 0; i < 20 && isa == ops::Isa::kAvx512; ++i) {
    peak = std::max(peak, bench::MeasureFmaPeakGflops(1'000'000));
  }
  std::printf("isa=%s threads=1%s\n", std::string(ops::IsaName(isa)).c_str(),
              g_cpu_time ? " (thread CPU time)" : "");
  if (peak > 0) std::printf("f32 FMA peak: %.0f GFLOPS on 1 thread\n", peak);
  std::printf("%-4s %8s %6s %5s | %10s %8s | %10s %8s %6s | %7s\n", "type", "head_dim", "ctx",
              "rows", "rows us", "GFLOPS", "tiled us", "GFLOPS", "%peak", "speedup");
  std::string json_rows;
  for (DType type : {DType::kF32, DType::kF16}) {
    for (int64_t d : {int64_t{64}, int64_t{128}}) {
      for (int64_t n : contexts) {
        for (int64_t rows : row_counts) {
          Case c(type, d, n, rows);
          const float scale = 1.0f / std::sqrt(static_cast<float>(d));
          TiledScratch s(rows, ops::AttentionTileTokens(d), d);
          const double t_rows = BestSeconds([&] { RowKernels(ctx, c, rows, scale); });
          const double t_tiled = BestSeconds([&] { Tiled(ctx, c, rows, scale, s); });
          const double flops = 4.0 * static_cast<double>(rows * n * d);
          const double g_rows = flops / t_rows / 1e9, g_tiled = flops / t_tiled / 1e9;
          const std::string name(DTypeName(type));
          std::printf("%-4s %8lld %6lld %5lld | %10.1f %8.1f | %10.1f %8.1f %5.1f%% | %6.2fx\n",
                      name.c_str(), static_cast<long long>(d), static_cast<long long>(n),
                      static_cast<long long>(rows), t_rows * 1e6, g_rows, t_tiled * 1e6, g_tiled,
                      peak > 0 ? 100.0 * g_tiled / peak : 0.0, t_rows / t_tiled);
          char buf[320];
          std::snprintf(buf, sizeof(buf),
                        "%s{\"type\": \"%s\", \"head_dim\": %lld, \"ctx\": %lld, \"rows\": %lld, "
                        "\"rows_us\": %.2f, \"tiled_us\": %.2f, \"tiled_gflops\": %.2f, "
                        "\"peak_gflops\": %.1f}",
                        json_rows.empty() ? "" : ",\n  ", name.c_str(), static_cast<long long>(d),
                        static_cast<long long>(n), static_cast<long long>(rows), t_rows * 1e6,
                        t_tiled * 1e6, g_tiled, peak);
          json_rows += buf;
        }
      }
    }
  }
  if (json) std::printf("[\n  %s\n]\n", json_rows.c_str());
  return 0;
}
