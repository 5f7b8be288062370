// MatMul throughput at llama-family projection shapes (TinyLlama-1.1B and Llama-7B) for batches
// of M = 1 .. 512 tokens, against the machine's measured int8 ceiling.
//
// For Q8_0 / Q4_0 and the K-quants (Q4_K, Q5_K, Q6_K) each shape and M is timed twice in the same
// run: on the weights as stored in GGUF ("rows", the 1x8 / 4x4 tile kernels, and the per-row
// K-quant kernels) and repacked by ops::PackMatrix ("packed", the int8 GEMM), with GOPS (2 ops per
// multiply-add) and the fraction of the vpdpbusd peak, which the benchmark measures itself on the
// same threads (vnni_peak_avx512.cc; only when the CPU has VNNI).
// F16 / F32 are timed at M = 1 and 512 on the TinyLlama shapes.
//
// Decode reads every weight from DRAM once per step, but a benchmark that calls one matrix again
// and again reads it from cache. With --cold each call takes the next of enough copies of the
// matrix (kColdBytes, 8x the L3 of the machines we run on) that none is still cached, so the GB/s
// column (weight bytes per second) is what decode gets, to compare with the machine's read
// bandwidth (/work/shared/tools/membw.c).
//
// Usage: matmul_bench [threads=2] [--json] [--type=q8_0]... [--shapes=tinyllama|llama7b|all]
//                     [--m=1,8,512] [--cpu-time] [--cold]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/ops.h"
#include "kvl/quant.h"
#include "kvl/thread_pool.h"

namespace kvl::bench {
double MeasureVnniPeakGops(int threads, int64_t iters);
}  // namespace kvl::bench

namespace {

struct Shape {
  const char* model;
  const char* name;
  int64_t rows;  // N: outputs
  int64_t cols;  // K: reduction
};

constexpr Shape kShapes[] = {
    {"tinyllama", "attn_q/o", 2048, 2048},  {"tinyllama", "attn_k/v", 256, 2048},
    {"tinyllama", "ffn_gate/up", 5632, 2048}, {"tinyllama", "ffn_down", 2048, 5632},
    {"llama7b", "attn_qkvo", 4096, 4096},   {"llama7b", "ffn_gate/up", 11008, 4096},
    {"llama7b", "ffn_down", 4096, 11008},
};

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wall time, or with --cpu-time this thread's CPU time: on a loaded machine that measures the
// kernel itself (meaningful with 1 thread only; with more, workers' time is not counted).
bool g_cpu_time = false;
double Seconds() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return WallSeconds();
}

// Best-of-N seconds per call over about 0.25 s of calls (at least 3): the machine is shared, and
// the minimum is the least noisy estimate.
template <typename Fn>
double BestSeconds(Fn&& fn) {
  fn();  // warm-up
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

constexpr int64_t kColdBytes = int64_t{256} << 20;

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

}  // namespace

int main(int argc, char** argv) {
  using namespace kvl;
  int threads = 2;
  bool json = false;
  bool cold = false;
  std::string shapes_wanted = "all";
  std::vector<std::string> only_types;
  std::vector<int64_t> ms = {1, 2, 4, 8, 16, 64, 128, 512};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strcmp(argv[i], "--cold") == 0) {
      cold = true;
    } else if (std::strncmp(argv[i], "--type=", 7) == 0) {
      only_types.push_back(argv[i] + 7);
    } else if (std::strncmp(argv[i], "--shapes=", 9) == 0) {
      shapes_wanted = argv[i] + 9;
    } else if (std::strncmp(argv[i], "--m=", 4) == 0) {
      ms = ParseList(argv[i] + 4);
    } else {
      threads = std::atoi(argv[i]);
    }
  }
  const DType types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                         DType::kQ6_K, DType::kF16, DType::kF32};
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());

  ThreadPool pool(threads);
  const ops::Isa isa = ops::BestIsa();
  ops::OpsContext ctx(isa, &pool);
  ctx.Reserve(std::max<int64_t>(max_m, 512), 11008);
  // The ceiling: only where the avx512 table (which requires VNNI) runs.
  const bool has_vnni = isa == ops::Isa::kAvx512;
  const double peak = has_vnni ? bench::MeasureVnniPeakGops(threads, 320'000'000) : 0.0;
  std::printf("isa=%s threads=%d cpu: %s\n", std::string(ops::IsaName(isa)).c_str(), threads,
              ops::CpuFeatureString().c_str());
  if (has_vnni) std::printf("vpdpbusd peak: %.0f int8 GOPS on %d threads\n", peak, threads);
  if (cold) std::printf("cold: every call reads its weights from DRAM (%ld MiB of copies)\n",
                        static_cast<long>(kColdBytes >> 20));
  std::printf("%-6s %-9s %-11s %6s %6s %4s | %9s %8s %6s | %9s %8s %6s %6s | %7s\n", "type",
              "model", "tensor", "N", "K", "M", "rows ms", "GOPS", "GB/s", "packed ms", "GOPS",
              "GB/s", "%peak", "speedup");
  std::string json_rows, pack_lines;

  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(std::max<int64_t>(max_m, 512) * 11008));
  for (float& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(max_m, 512) * 11008));

  for (DType type : types) {
    const std::string type_name(DTypeName(type));
    if (!only_types.empty() &&
        std::find(only_types.begin(), only_types.end(), type_name) == only_types.end()) {
      continue;
    }
    const bool quantized = type != DType::kF16 && type != DType::kF32;
    for (const Shape& s : kShapes) {
      if (shapes_wanted != "all" && shapes_wanted != s.model) continue;
      if (!quantized && std::strcmp(s.model, "tinyllama") != 0) continue;
      const int64_t row_bytes = RowBytes(type, s.cols);
      std::vector<uint8_t> w(static_cast<size_t>(row_bytes * s.rows));
      std::vector<float> row(static_cast<size_t>(s.cols));
      for (int64_t r = 0; r < s.rows; ++r) {
        for (float& v : row) v = dist(rng) * 0.02f;
        quant::QuantizeRow(type, row.data(), s.cols, w.data() + r * row_bytes);
      }
      const ops::MatrixView view{type, w.data(), s.rows, s.cols, row_bytes};
      // Load-time cost of the packed layout: the copy's bytes and the time to build it on the
      // benchmark's threads (as Forward does at load).
      const double t_pack0 = WallSeconds();
      const ops::PackedMatrix packed = ops::PackMatrix(isa, view, &pool);
      const double pack_ms = (WallSeconds() - t_pack0) * 1e3;
      const bool has_packed = packed.bytes() > 0;
      // --cold: the copies each call cycles through (the first is the matrix itself).
      const int64_t copies = cold ? (kColdBytes + static_cast<int64_t>(w.size()) - 1) /
                                        static_cast<int64_t>(w.size())
                                  : 1;
      std::vector<std::vector<uint8_t>> w_copies(static_cast<size_t>(copies - 1), w);
      std::vector<ops::MatrixView> views = {view};
      std::vector<ops::PackedMatrix> packed_copies;
      std::vector<ops::MatrixView> packed_views = {packed.view()};
      for (const std::vector<uint8_t>& c : w_copies) {
        views.push_back({type, c.data(), s.rows, s.cols, row_bytes});
        if (!has_packed) continue;
        packed_copies.push_back(ops::PackMatrix(isa, views.back(), &pool));
        packed_views.push_back(packed_copies.back().view());
      }
      size_t next_copy = 0;
      const auto next = [&](const std::vector<ops::MatrixView>& v) -> const ops::MatrixView& {
        return v[next_copy++ % v.size()];
      };
      if (has_packed) {
        char line[256];
        std::snprintf(line, sizeof(line), "%-6s %-9s %-11s %6ld %6ld  GGUF %8.2f MiB  packed %8.2f MiB (%+.2f%%)  pack %7.2f ms\n",
                      type_name.c_str(), s.model, s.name, static_cast<long>(s.rows),
                      static_cast<long>(s.cols), static_cast<double>(w.size()) / (1 << 20),
                      static_cast<double>(packed.bytes()) / (1 << 20),
                      100.0 * (static_cast<double>(packed.bytes()) / static_cast<double>(w.size()) - 1.0),
                      pack_ms);
        pack_lines += line;
      }
      for (int64_t m : ms) {
        if (!quantized && m != 1 && m != 512) continue;
        const double ops_count = 2.0 * static_cast<double>(s.rows * s.cols * m);
        const double t_rows =
            BestSeconds([&] { ops::MatMul(ctx, next(views), x.data(), m, y.data()); });
        const double t_packed =
            has_packed ? BestSeconds([&] {
              ops::MatMul(ctx, next(packed_views), x.data(), m, y.data());
            })
                       : t_rows;
        const double gops_rows = ops_count / t_rows * 1e-9;
        const double gops_packed = ops_count / t_packed * 1e-9;
        const double frac = peak > 0 ? gops_packed / peak : 0.0;
        // Weight bytes read per second (the packed copy has the GGUF's bytes, give or take the
        // padding of the last panel).
        const double bytes = static_cast<double>(w.size());
        std::printf("%-6s %-9s %-11s %6ld %6ld %4ld | %9.3f %8.1f %6.1f | ", type_name.c_str(),
                    s.model, s.name, static_cast<long>(s.rows), static_cast<long>(s.cols),
                    static_cast<long>(m), t_rows * 1e3, gops_rows, bytes / t_rows * 1e-9);
        if (has_packed) {
          std::printf("%9.3f %8.1f %6.1f %5.1f%% | %6.2fx\n", t_packed * 1e3, gops_packed,
                      bytes / t_packed * 1e-9, 100 * frac, t_rows / t_packed);
        } else {
          std::printf("%9s %8s %6s %6s | %7s\n", "-", "-", "-", "-", "-");
        }
        std::fflush(stdout);
        char buf[512];
        std::snprintf(buf, sizeof(buf),
                      "%s{\"type\":\"%s\",\"model\":\"%s\",\"tensor\":\"%s\",\"n\":%ld,\"k\":%ld,"
                      "\"m\":%ld,\"rows_ms\":%.4f,\"rows_gops\":%.2f,\"packed_ms\":%.4f,"
                      "\"packed_gops\":%.2f,\"peak_fraction\":%.4f,\"weight_gbs\":%.2f}",
                      json_rows.empty() ? "" : ",", type_name.c_str(), s.model, s.name,
                      static_cast<long>(s.rows), static_cast<long>(s.cols), static_cast<long>(m),
                      t_rows * 1e3, gops_rows, has_packed ? t_packed * 1e3 : 0.0,
                      has_packed ? gops_packed : 0.0, has_packed ? frac : 0.0,
                      static_cast<double>(w.size()) / std::min(t_rows, t_packed) * 1e-9);
        json_rows += buf;
      }
    }
  }
  if (!pack_lines.empty()) std::printf("\npacked layout (load-time cost):\n%s", pack_lines.c_str());
  if (json) {
    std::printf("{\"isa\":\"%s\",\"threads\":%d,\"vnni_peak_gops\":%.1f,\"results\":[%s]}\n",
                std::string(ops::IsaName(isa)).c_str(), threads, peak, json_rows.c_str());
  }
  return 0;
}
