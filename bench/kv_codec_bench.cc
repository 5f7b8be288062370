// KV page codec cost at TinyLlama-1.1B shapes (22 layers, 4 KV heads x 64 = kv_dim 256, 32 query
// heads, 16-token pages): encode time per page, and one decode step's attention over a context of
// 512 / 4096 tokens, f32 rows (DotRows / AxpyRows) vs compressed pages read directly (DotRowsK /
// AxpyRowsV), single thread. Scores and weighted sums are timed separately; "ns/row" is per
// (layer, query head, token), i.e. per kernel row. The compress action's compute cost for the cost
// model is the difference.
//
// Usage: kv_codec_bench [--json] [--reps-ms=300]   (KVL_ISA=avx2|scalar lowers the ISA)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvl/kv_codec.h"
#include "kvl/ops.h"

namespace {

using kvl::KvCodecType;

constexpr int64_t kLayers = 22, kKvHeads = 4, kHeadDim = 64, kHeads = 32, kBlock = 16;
constexpr int64_t kKvDim = kKvHeads * kHeadDim;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs fn until at least min_s have passed (after one warm-up call); seconds per call.
template <typename Fn>
double TimePerCall(double min_s, Fn&& fn) {
  fn();
  int64_t calls = 0;
  const double t0 = Now();
  double t1 = t0;
  do {
    fn();
    ++calls;
    t1 = Now();
  } while (t1 - t0 < min_s);
  return (t1 - t0) / static_cast<double>(calls);
}

// 64-byte aligned bytes.
struct Aligned {
  explicit Aligned(int64_t bytes) : raw(static_cast<size_t>(bytes + 64)) {}
  uint8_t* data() {
    const auto p = reinterpret_cast<uintptr_t>(raw.data());
    return raw.data() + ((64 - p % 64) % 64);
  }
  std::vector<uint8_t> raw;
};

struct Row {
  std::string format;
  int64_t context = 0;
  double page_bytes = 0;
  double dot_ns_per_row = 0;
  double axpy_ns_per_row = 0;
  double rel_err = 0;  // attention output vs f32, relative L2, layer 0 head 0
};

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  double min_s = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") json = true;
    if (a.rfind("--reps-ms=", 0) == 0) min_s = std::stod(a.substr(10)) / 1000.0;
  }
  kvl::ThreadPool pool(1);
  kvl::ops::OpsContext ctx(kvl::ops::BestIsa(), &pool);

  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
  };

  // Encode cost: one page = 22 layers of K and V.
  const int64_t page_floats = kLayers * kBlock * kKvDim;
  const std::vector<float> pk = random(page_floats), pv = random(page_floats);
  double encode_us[2] = {0, 0};
  const KvCodecType types[2] = {KvCodecType::kInt8, KvCodecType::kInt4};
  for (int t = 0; t < 2; ++t) {
    Aligned out(kvl::CompressedPageBytes(types[t], kBlock, kLayers, kKvDim));
    encode_us[t] =
        1e6 * TimePerCall(min_s, [&] {
          kvl::EncodePage(types[t], pk.data(), pv.data(), kBlock, kLayers, kKvDim, out.data());
        });
  }

  std::vector<Row> rows;
  const std::vector<float> q = random(kHeads * kHeadDim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (int64_t context : {512, 4096}) {
    const int64_t pages = context / kBlock;
    // f32 pages as KvBlockStorage holds them: [page][layer][token][kv_dim], K and V apart.
    const std::vector<float> k = random(pages * page_floats), v = random(pages * page_floats);
    std::vector<float> scores(static_cast<size_t>(context)), weights(static_cast<size_t>(context));
    std::vector<float> out(static_cast<size_t>(kHeads * kHeadDim));
    std::vector<float> ref_out(kHeadDim);
    const double n_rows = static_cast<double>(kLayers * kHeads * context);

    // Attention output of layer 0, head 0 (for the error column).
    auto head0 = [&](auto&& dot, auto&& axpy, float* y) {
      for (int64_t p = 0; p < pages; ++p) dot(p, 0, 0, scores.data() + p * kBlock);
      kvl::ops::Softmax(ctx, scores.data(), context);
      std::fill(y, y + kHeadDim, 0.0f);
      for (int64_t p = 0; p < pages; ++p) axpy(p, 0, 0, scores.data() + p * kBlock, y);
    };
    // A decode step's attention: per layer, per query head, every page.
    auto step = [&](auto&& dot, auto&& axpy, Row& row) {
      row.dot_ns_per_row = 1e9 / n_rows * TimePerCall(min_s, [&] {
                             for (int64_t l = 0; l < kLayers; ++l) {
                               for (int64_t h = 0; h < kHeads; ++h) {
                                 for (int64_t p = 0; p < pages; ++p) {
                                   dot(p, l, h, scores.data() + p * kBlock);
                                 }
                               }
                             }
                           });
      for (int64_t i = 0; i < context; ++i) weights[i] = 1.0f / static_cast<float>(context);
      row.axpy_ns_per_row = 1e9 / n_rows * TimePerCall(min_s, [&] {
                              for (int64_t l = 0; l < kLayers; ++l) {
                                for (int64_t h = 0; h < kHeads; ++h) {
                                  float* y = out.data() + h * kHeadDim;
                                  for (int64_t p = 0; p < pages; ++p) {
                                    axpy(p, l, h, weights.data() + p * kBlock, y);
                                  }
                                }
                              }
                            });
    };

    {
      auto dot = [&](int64_t p, int64_t l, int64_t h, float* s) {
        const float* rows_k = k.data() + (p * kLayers + l) * kBlock * kKvDim;
        kvl::ops::DotRows(ctx, q.data() + h * kHeadDim, rows_k + (h / 8) * kHeadDim, kKvDim, kBlock,
                          kHeadDim, scale, s);
      };
      auto axpy = [&](int64_t p, int64_t l, int64_t h, const float* w, float* y) {
        const float* rows_v = v.data() + (p * kLayers + l) * kBlock * kKvDim;
        kvl::ops::AxpyRows(ctx, w, rows_v + (h / 8) * kHeadDim, kKvDim, kBlock, kHeadDim, y);
      };
      Row row{"f32", context, static_cast<double>(2 * page_floats * sizeof(float))};
      head0(dot, axpy, ref_out.data());
      step(dot, axpy, row);
      rows.push_back(row);
    }
    for (KvCodecType type : types) {
      const int64_t page_bytes = kvl::CompressedPageBytes(type, kBlock, kLayers, kKvDim);
      Aligned store(pages * page_bytes);
      std::vector<kvl::ops::QuantKvLayerView> views(static_cast<size_t>(pages * kLayers));
      for (int64_t p = 0; p < pages; ++p) {
        uint8_t* page = store.data() + p * page_bytes;
        kvl::EncodePage(type, k.data() + p * page_floats, v.data() + p * page_floats, kBlock,
                        kLayers, kKvDim, page);
        for (int64_t l = 0; l < kLayers; ++l) {
          views[p * kLayers + l] = kvl::PageLayerView(type, page, kBlock, kLayers, kKvDim, l);
        }
      }
      auto dot = [&](int64_t p, int64_t l, int64_t h, float* s) {
        kvl::ops::DotRowsK(ctx, q.data() + h * kHeadDim, views[p * kLayers + l], 0, kBlock,
                           (h / 8) * kHeadDim, kHeadDim, scale, s);
      };
      auto axpy = [&](int64_t p, int64_t l, int64_t h, const float* w, float* y) {
        kvl::ops::AxpyRowsV(ctx, w, views[p * kLayers + l], 0, kBlock, (h / 8) * kHeadDim, kHeadDim,
                            y);
      };
      Row row{std::string(kvl::KvCodecName(type)), context, static_cast<double>(page_bytes)};
      std::vector<float> y(kHeadDim);
      head0(dot, axpy, y.data());
      double num = 0, den = 0;
      for (int64_t c = 0; c < kHeadDim; ++c) {
        num += (y[c] - ref_out[c]) * (y[c] - ref_out[c]);
        den += ref_out[c] * ref_out[c];
      }
      row.rel_err = std::sqrt(num / std::max(den, 1e-30));
      step(dot, axpy, row);
      rows.push_back(row);
    }
  }

  const std::string isa(kvl::ops::IsaName(ctx.isa()));
  if (json) {
    std::printf("{\"isa\":\"%s\",\"encode_us_per_page\":{\"int8\":%.2f,\"int4\":%.2f},\"rows\":[",
                isa.c_str(), encode_us[0], encode_us[1]);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "%s{\"format\":\"%s\",\"context\":%lld,\"page_bytes\":%.0f,\"dot_ns_per_row\":%.3f,"
          "\"axpy_ns_per_row\":%.3f,\"rel_err\":%.3g}",
          i ? "," : "", r.format.c_str(), static_cast<long long>(r.context), r.page_bytes,
          r.dot_ns_per_row, r.axpy_ns_per_row, r.rel_err);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf(
      "kv_codec_bench: TinyLlama shapes (%lld layers, kv_dim %lld, head_dim %lld, %lld q "
      "heads, %lld-token pages), isa %s, 1 thread\n\n",
      static_cast<long long>(kLayers), static_cast<long long>(kKvDim),
      static_cast<long long>(kHeadDim), static_cast<long long>(kHeads),
      static_cast<long long>(kBlock), isa.c_str());
  std::printf(
      "| codec | page bytes | encode us/page | encode MB/s (f32 in) |\n|---|---|---|---|\n");
  for (int t = 0; t < 2; ++t) {
    std::printf("| %s | %lld | %.1f | %.0f |\n", std::string(kvl::KvCodecName(types[t])).c_str(),
                static_cast<long long>(kvl::CompressedPageBytes(types[t], kBlock, kLayers, kKvDim)),
                encode_us[t], 2.0 * page_floats * 4 / encode_us[t]);
  }
  std::printf(
      "\n| context | format | page bytes | dot ns/row | axpy ns/row | dot f32/x | "
      "axpy f32/x | out rel err |\n|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const Row& f32 = *std::find_if(rows.begin(), rows.end(), [&](const Row& o) {
      return o.context == r.context && o.format == "f32";
    });
    std::printf("| %lld | %s | %.0f | %.2f | %.2f | %.2fx | %.2fx | %.2g |\n",
                static_cast<long long>(r.context), r.format.c_str(), r.page_bytes, r.dot_ns_per_row,
                r.axpy_ns_per_row, f32.dot_ns_per_row / r.dot_ns_per_row,
                f32.axpy_ns_per_row / r.axpy_ns_per_row, r.rel_err);
  }
  return 0;
}
