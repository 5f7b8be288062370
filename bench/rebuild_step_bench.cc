// What a page rebuilt from residual checkpoints adds to the decode step it rides in: issue 28's
// goal measure (TinyLlama shape Q8_0, 2 threads, a 64-token page over every layer: at most 1.15x
// the step alone), without the rest of `kvl bench frontier` around it.
//
// The step alone and the step with the page alternate, round after round, so a machine that other
// processes load slows both alike; the table prints the minimum and the median of each and their
// ratio. --only=page (or step) runs --rounds steps with the page (or without) and nothing else,
// for `perf record`.
//
// Usage: rebuild_step_bench -m MODEL.gguf [-t 2] [--rows 64] [--position 512] [--rounds 15]
//                           [--only=page|step] [--kv=f32|f16|q8_0]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/thread_pool.h"

namespace kvl {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time of the whole process (every thread, spinning workers included): on a machine others
// load, wall time counts their time slices, this does not.
double CpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

struct Sample {
  double wall_ms, cpu_ms;  // per step
};

// A contiguous cache that hands the forward pass one page to rebuild at every layer, from
// checkpoints of its own ([layer][rows][dim]), as the pager does for a page riding in the step.
class RebuildingCache final : public KvCache {
 public:
  explicit RebuildingCache(std::unique_ptr<ContiguousKvCache> inner) : inner_(std::move(inner)) {}
  void SetRebuild(bool on, const KvLayerRebuild& page, const float* checkpoints, int64_t dim) {
    on_ = on;
    page_ = page;
    checkpoints_ = checkpoints;
    dim_ = dim;
  }
  int64_t kv_dim() const override { return inner_->kv_dim(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override {
    return inner_->RowsAt(seq, layer, pos);
  }
  float* ResidualAt(int32_t seq, int64_t layer, int64_t pos) override {
    return inner_->ResidualAt(seq, layer, pos);
  }
  KvLayerRebuild BeginLayer(int64_t layer) override {
    if (!on_) return {};
    KvLayerRebuild r = page_;
    r.input = checkpoints_ + layer * r.rows * dim_;
    return r;
  }

 private:
  std::unique_ptr<ContiguousKvCache> inner_;
  bool on_ = false;
  KvLayerRebuild page_;
  const float* checkpoints_ = nullptr;
  int64_t dim_ = 0;
};

struct Args {
  std::string model;
  int threads = 2;
  int64_t rows = 64;
  int64_t position = 512;
  int rounds = 15;
  std::string only;
  DType kv_type = DType::kF32;
};

int Usage() {
  std::fprintf(stderr,
               "usage: rebuild_step_bench -m MODEL.gguf [-t 2] [--rows 64] [--position 512] "
               "[--rounds 15] [--only=page|step] [--kv=f32|f16|q8_0]\n");
  return 2;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (s == "-m" && (v = next())) {
      a.model = v;
    } else if (s == "-t" && (v = next())) {
      a.threads = std::atoi(v);
    } else if (s == "--rows" && (v = next())) {
      a.rows = std::atoll(v);
    } else if (s == "--position" && (v = next())) {
      a.position = std::atoll(v);
    } else if (s == "--rounds" && (v = next())) {
      a.rounds = std::atoi(v);
    } else if (s.rfind("--only=", 0) == 0) {
      a.only = s.substr(7);
    } else if (s == "--kv=f16") {
      a.kv_type = DType::kF16;
    } else if (s == "--kv=q8_0") {
      a.kv_type = DType::kQ8_0;
    } else if (s == "--kv=f32") {
      a.kv_type = DType::kF32;
    } else {
      return Usage();
    }
  }
  if (a.model.empty() || a.threads < 1 || a.rows < 1 || a.rounds < 1) return Usage();
  StatusOr<std::unique_ptr<Model>> model = Model::Load(a.model);
  if (!model.ok()) {
    std::fprintf(stderr, "rebuild_step_bench: %s\n", model.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  ThreadPool pool(a.threads);
  ops::OpsContext ctx(ops::BestIsa(), &pool);
  ForwardOptions fo;
  fo.max_batch_tokens = 1;
  fo.max_logit_rows = 1;
  fo.max_context = a.position + a.rows + 2;
  fo.max_rebuild_rows = a.rows;
  Forward forward(**model, ctx, fo);
  RebuildingCache cache(
      std::move(ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, fo.max_context, c.dim).value()));

  // The page's checkpoints: any residual stream will do for the time (the tests check the rows).
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> checkpoints(static_cast<size_t>(c.num_layers * a.rows * c.dim));
  for (float& x : checkpoints) x = normal(rng);
  std::vector<int64_t> positions(static_cast<size_t>(a.rows));
  for (int64_t i = 0; i < a.rows; ++i) positions[static_cast<size_t>(i)] = a.position + i;
  std::vector<int32_t> seqs(static_cast<size_t>(a.rows), 0);
  const size_t out_bytes = static_cast<size_t>(RowBytes(a.kv_type, a.rows * c.kv_dim()));
  std::vector<uint8_t> k_out(out_bytes), v_out(out_bytes);
  KvLayerRebuild page;
  page.rows = a.rows;
  page.positions = positions.data();
  page.seq_ids = seqs.data();
  page.k_type = a.kv_type;
  page.v_type = a.kv_type;
  page.k_out = k_out.data();
  page.v_out = v_out.data();

  TokenBatch step;
  step.Add(1, a.position + a.rows, 0, true);
  // Each sample is the mean of enough steps to fill 20 ms: one preemption moves a single step.
  auto sample = [&](bool with_page) {
    cache.SetRebuild(with_page, page, checkpoints.data(), c.dim);
    const double t0 = NowMs(), c0 = CpuMs();
    int steps = 0;
    do {
      forward.Run(step, cache);
      ++steps;
    } while (NowMs() - t0 < 20);
    return Sample{(NowMs() - t0) / steps, (CpuMs() - c0) / steps};
  };
  if (!a.only.empty()) {
    // A fixed number of steps, so two profiles compare sample counts step for step.
    cache.SetRebuild(a.only == "page", page, checkpoints.data(), c.dim);
    const double t0 = NowMs();
    for (int r = 0; r < a.rounds; ++r) forward.Run(step, cache);
    std::printf("%s: %d steps, %.2f ms each\n", a.only == "page" ? "step + page" : "step",
                a.rounds, (NowMs() - t0) / a.rounds);
    return 0;
  }
  sample(false);
  sample(true);
  std::vector<Sample> alone, with_page;
  for (int r = 0; r < a.rounds; ++r) {
    alone.push_back(sample(false));
    with_page.push_back(sample(true));
  }
  std::printf("model %s, %d threads, page of %lld rows over %lld layers at position %lld\n",
              a.model.c_str(), a.threads, static_cast<long long>(a.rows),
              static_cast<long long>(c.num_layers), static_cast<long long>(a.position));
  std::printf("| measure | step ms | step + page ms | page adds ms | ratio |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  auto row = [&](const char* name, double Sample::*field, bool median) {
    std::vector<double> x, y;
    for (const Sample& s : alone) x.push_back(s.*field);
    for (const Sample& s : with_page) y.push_back(s.*field);
    const double u = median ? Median(x) : *std::min_element(x.begin(), x.end());
    const double v = median ? Median(y) : *std::min_element(y.begin(), y.end());
    std::printf("| %s | %.2f | %.2f | %.2f | %.3fx |\n", name, u, v, v - u, v / u);
  };
  row("wall, min", &Sample::wall_ms, false);
  row("wall, median", &Sample::wall_ms, true);
  row("cpu (all threads), min", &Sample::cpu_ms, false);
  row("cpu (all threads), median", &Sample::cpu_ms, true);
  return 0;
}

}  // namespace
}  // namespace kvl

int main(int argc, char** argv) { return kvl::Main(argc, argv); }
