// MatMul throughput on TinyLlama-1.1B shapes: decode (1 token, reports weight GB/s) and prefill
// (512 tokens, reports GFLOP/s), for each weight type, on the best ISA (KVL_ISA may lower it).
//
// Build: g++ -O3 -std=c++20 -Iinclude bench/matmul_bench.cc build-ops/libkvl_ops.a \
//          build-ops/libkvl_quant.a build-ops/libkvl_base.a -lfmt -lpthread
// Usage: matmul_bench [threads=2] [--json] [--type=q8_0]... [--cpu-time]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <ctime>
#include <string>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/ops.h"
#include "kvl/quant.h"
#include "kvl/thread_pool.h"

namespace {

struct Shape {
  int64_t rows;
  int64_t cols;
  const char* name;
};

// Wall time, or with --cpu-time this thread's CPU time: on a loaded machine that measures the
// kernel itself (meaningful with 1 thread only; with more, workers' time is not counted).
bool g_cpu_time = false;
double Seconds() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvl;
  int threads = 2;
  bool json = false;
  std::vector<std::string> only_types;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strncmp(argv[i], "--type=", 7) == 0) {
      only_types.push_back(argv[i] + 7);
    } else {
      threads = std::atoi(argv[i]);
    }
  }
  const Shape shapes[] = {{2048, 2048, "attn_q/o"}, {256, 2048, "attn_k/v"}, {5632, 2048, "ffn_gate/up"},
                          {2048, 5632, "ffn_down"}, {32000, 2048, "output"}};
  const DType types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                         DType::kQ6_K, DType::kF16, DType::kF32};
  const int64_t token_counts[] = {1, 512};

  ThreadPool pool(threads);
  const ops::Isa isa = ops::BestIsa();
  ops::OpsContext ctx(isa, &pool);
  ctx.Reserve(512, 5632);
  std::printf("isa=%s threads=%d cpu: %s\n", std::string(ops::IsaName(isa)).c_str(), threads,
              ops::CpuFeatureString().c_str());
  std::printf("%-6s %-12s %6s %6s %6s %10s %10s %8s\n", "type", "tensor", "rows", "cols", "tokens",
              "ms/call", "GFLOP/s", "GB/s");
  std::string json_rows;

  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(512 * 5632);
  for (float& v : x) v = dist(rng);
  std::vector<float> y(512 * 32000);

  for (DType type : types) {
    if (!only_types.empty() &&
        std::find(only_types.begin(), only_types.end(), std::string(DTypeName(type))) == only_types.end()) {
      continue;
    }
    for (const Shape& s : shapes) {
      // Quantize a random matrix row by row (the quantizer is the reference, so this is slow-ish).
      const int64_t row_bytes = RowBytes(type, s.cols);
      std::vector<uint8_t> w(static_cast<size_t>(row_bytes * s.rows));
      std::vector<float> row(s.cols);
      for (int64_t r = 0; r < s.rows; ++r) {
        for (float& v : row) v = dist(rng) * 0.02f;
        quant::QuantizeRow(type, row.data(), s.cols, w.data() + r * row_bytes);
      }
      const ops::MatrixView view{type, w.data(), s.rows, s.cols, row_bytes};
      for (int64_t tokens : token_counts) {
        const double flops = 2.0 * s.rows * s.cols * tokens;
        // About 0.3 s of work per measurement, at least 3 calls.
        ops::MatMul(ctx, view, x.data(), tokens, y.data());  // warm-up
        const double t_probe = Seconds();
        ops::MatMul(ctx, view, x.data(), tokens, y.data());
        const double probe = Seconds() - t_probe;
        const int reps = std::max(3, static_cast<int>(0.3 / std::max(probe, 1e-6)));
        double best = 1e30;
        for (int rep = 0; rep < reps; ++rep) {
          const double t0 = Seconds();
          ops::MatMul(ctx, view, x.data(), tokens, y.data());
          best = std::min(best, Seconds() - t0);
        }
        // Best-of-N: the machine is shared, and the minimum is the least noisy estimate.
        const double gflops = flops / best * 1e-9;
        const double gbs = static_cast<double>(w.size()) / best * 1e-9;
        std::printf("%-6s %-12s %6ld %6ld %6ld %10.3f %10.1f %8s\n", std::string(DTypeName(type)).c_str(),
                    s.name, static_cast<long>(s.rows), static_cast<long>(s.cols), static_cast<long>(tokens),
                    best * 1e3, gflops, tokens == 1 ? std::to_string(gbs).substr(0, 5).c_str() : "-");
        std::fflush(stdout);
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "%s{\"type\":\"%s\",\"rows\":%ld,\"cols\":%ld,\"tokens\":%ld,\"ms\":%.4f,"
                      "\"gflops\":%.2f,\"gbs\":%.2f}",
                      json_rows.empty() ? "" : ",", std::string(DTypeName(type)).c_str(),
                      static_cast<long>(s.rows), static_cast<long>(s.cols), static_cast<long>(tokens),
                      best * 1e3, gflops, gbs);
        json_rows += buf;
      }
    }
  }
  if (json) std::printf("{\"isa\":\"%s\",\"threads\":%d,\"results\":[%s]}\n",
                        std::string(ops::IsaName(isa)).c_str(), threads, json_rows.c_str());
  return 0;
}
