// Partial-depth residual checkpoints: storage saved against rebuild time, per stride s.
//
// For each model and each s it prefills a context of --pages full 16-token pages (and one token
// more) into a pool that keeps checkpoints every s-th layer, preempts the sequence with every
// page kept as checkpoints in a RAM tier (KvPager::Preempt), re-admits it and rebuilds the pages
// into fresh blocks in order (KvPager::RestorePages, the engine's own resume path: per layer the
// K/V projections, and for a layer without a checkpoint the layer before run whole for the
// page's tokens). It reports the checkpoint bytes one page keeps (as the tier holds them), the
// rebuild time per page (median over pages and repetitions), recomputing the same page from its
// tokens for comparison, and whether every rebuilt K/V byte equals what the prefill stored. A
// stride past the model's layers is measured as s = layers.
//
// Usage: checkpoint_depth_bench [--json | --json-file PATH] [--cpu-time] [-t THREADS] [--pages N] [--reps N]
//                               [--strides 1,2,4,8] MODEL.gguf...
//   --json-file PATH: the JSON written there too, beside the table on stdout.
//   --cpu-time: this thread's CPU time instead of wall time (with -t 1 the calling thread does all
//   the work), for a shared machine where other processes take the cores.
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvl/forward.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_pager.h"
#include "kvl/kv_tier.h"
#include "kvl/model.h"

namespace kvl {
namespace {

constexpr int32_t kBlockTokens = 16;

struct Settings {
  bool json = false;
  bool cpu_time = false;
  std::string json_file;
  int threads = 1;
  int64_t pages = 3;
  int reps = 3;
  std::vector<int64_t> strides = {1, 2, 4, 8};
  std::vector<std::string> models;
};

struct Row {
  std::string model;
  int64_t layers = 0;
  int64_t every = 1;
  int64_t layers_kept = 0;
  int64_t kv_bytes_per_page = 0;
  int64_t checkpoint_bytes_per_page = 0;  // measured: the RAM tier's bytes / pages kept
  double rebuild_ms = 0;                  // median per page
  double tokens_ms = 0;                   // median per page, recomputed from its tokens
  int64_t differing_bytes = 0;            // rebuilt K/V bytes that differ from the prefill's
};

// Wall time, or with --cpu-time this thread's CPU time, in ms.
bool g_cpu_time = false;
double NowMs() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The pool, pager and tier of one stride, with one sequence (slot 0) of `tokens`.
class Pool {
 public:
  static StatusOr<std::unique_ptr<Pool>> Create(const Model& model, Forward& forward,
                                                int64_t every, int64_t num_tokens) {
    const ModelConfig& c = model.config();
    auto p = std::unique_ptr<Pool>(new Pool(forward));
    KvManagerOptions o;
    o.layout.block_tokens = kBlockTokens;
    o.layout.num_layers = c.num_layers;
    o.layout.kv_dim = c.kv_dim();
    o.layout.residual_dim = c.dim;
    o.layout.checkpoint_every = every;
    o.enable_prefix_cache = false;  // the re-admission takes fresh blocks, to be rebuilt
    o.max_seqs = 1;
    o.budget_bytes = o.layout.block_bytes() * ((num_tokens + kBlockTokens - 1) / kBlockTokens + 1);
    KVL_ASSIGN_OR_RETURN(p->manager_, KvManager::Create(o));
    KVL_ASSIGN_OR_RETURN(p->storage_, KvBlockStorage::Create(o.layout, p->manager_->num_blocks()));
    p->pager_ = std::make_unique<KvPager>(*p->manager_, *p->storage_, 1, num_tokens);
    p->pager_->ReserveStaging(0, /*compresses=*/false);
    p->cache_ = std::make_unique<PagedKvCache>(*p->manager_, *p->storage_, p->pager_.get());
    KVL_ASSIGN_OR_RETURN(const TierSpec spec, ParseTierSpec("ram:8GiB"));
    KVL_ASSIGN_OR_RETURN(p->ram_, MakeTier(spec, p->pager_->layer_page_bytes()));
    p->pager_->set_tiers({p->ram_.get(), nullptr});
    p->pager_->set_rebuilder(&forward, p->cache_.get());
    return p;
  }

  void Admit(const std::vector<int32_t>& tokens) {
    const KvSeqStep step{0, tokens};
    const KvPlan plan = manager_->Plan(std::span(&step, 1));
    KVL_CHECK_MSG(plan.fits, "the bench's pool holds the whole context");
    manager_->Commit(plan);
    pager_->StartSequence(0, &pages_);
  }

  // Runs tokens [first, last) of `tokens` (admitted) as one batch.
  void Run(const std::vector<int32_t>& tokens, int64_t first, int64_t last) {
    TokenBatch batch;
    for (int64_t p = first; p < last; ++p) batch.Add(tokens[static_cast<size_t>(p)], p, 0, false);
    const SeqId seq = 0;
    pager_->BeginStep(std::span(&seq, 1));
    forward_.Run(batch, *cache_);
    pager_->EndStep();
  }

  // The K/V bytes of pages [0, pages), in block order.
  std::vector<uint8_t> KvBytes(int64_t pages) {
    std::vector<uint8_t> out;
    const KvBlockLayout& l = storage_->layout();
    for (int64_t b = 0; b < pages; ++b) {
      const BlockId block = manager_->block_table(0)[static_cast<size_t>(b)];
      const uint8_t* k = storage_->key_bytes(block, 0);
      out.insert(out.end(), k, k + l.kv_bytes());  // a block's layers of K and V are contiguous
    }
    return out;
  }

  // Every full page kept as checkpoints in the RAM tier; the blocks go back to the pool.
  void Preempt(int64_t pages) {
    KvPagePlan plan;
    plan.state_version = manager_->state_version();
    for (int64_t b = 0; b < pages; ++b) {
      plan.actions.push_back({0, b, KvAction::kRecomputeResidual});
    }
    pager_->Preempt(0, plan);
    for (const KvPageAction& a : plan.actions) KVL_CHECK_MSG(a.applied, "the RAM tier is full");
    manager_->Free(0);
  }

  // Re-admits the sequence and rebuilds page b alone, timed.
  double Restore(int64_t b) {
    const double start = NowMs();
    const int64_t restored = pager_->RestorePages(0, b, 1);
    const double ms = NowMs() - start;
    KVL_CHECK_MSG(restored == 1, "a page could not be rebuilt from its checkpoints");
    return ms;
  }

  void Settle() { pager_->SettleRestoredPages(0); }
  int64_t tier_bytes() const { return ram_->stats().bytes_used; }
  const KvBlockLayout& layout() const { return storage_->layout(); }

 private:
  explicit Pool(Forward& forward) : forward_(forward) {}
  Forward& forward_;
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<KvPager> pager_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<KvTier> ram_;
  KvSequencePages pages_;
};

StatusOr<Row> Measure(const std::string& path, const Model& model, Forward& forward,
                      int64_t every, const Settings& s) {
  const ModelConfig& c = model.config();
  const int64_t num_tokens = s.pages * kBlockTokens + 1;  // the last page full, one token after
  std::vector<int32_t> tokens = {1};
  for (int64_t i = 1; i < num_tokens; ++i) {
    tokens.push_back(static_cast<int32_t>((i * 7919 + 13) % c.vocab_size));
  }
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, Pool::Create(model, forward, every, num_tokens));
  pool->Admit(tokens);
  pool->Run(tokens, 0, num_tokens);
  const std::vector<uint8_t> prefilled = pool->KvBytes(s.pages);

  Row row;
  row.model = path.substr(path.find_last_of('/') + 1);
  row.layers = c.num_layers;
  row.every = every;
  row.layers_kept = pool->layout().checkpoint_layers();
  row.kv_bytes_per_page = pool->layout().kv_bytes();
  std::vector<double> rebuild_ms, tokens_ms;
  for (int rep = 0; rep < s.reps; ++rep) {
    const int64_t before = pool->tier_bytes();
    pool->Preempt(s.pages);
    row.checkpoint_bytes_per_page = (pool->tier_bytes() - before) / s.pages;
    pool->Admit(tokens);
    for (int64_t b = 0; b < s.pages; ++b) rebuild_ms.push_back(pool->Restore(b));
    pool->Settle();
    const std::vector<uint8_t> rebuilt = pool->KvBytes(s.pages);
    for (size_t i = 0; i < rebuilt.size(); ++i) row.differing_bytes += rebuilt[i] != prefilled[i];
    // The same pages recomputed from their tokens (over the rebuilt context), for comparison.
    for (int64_t b = 0; b < s.pages; ++b) {
      const double start = NowMs();
      pool->Run(tokens, b * kBlockTokens, (b + 1) * kBlockTokens);
      tokens_ms.push_back(NowMs() - start);
    }
  }
  row.rebuild_ms = Median(rebuild_ms);
  row.tokens_ms = Median(tokens_ms);
  return row;
}

void PrintTable(const std::vector<Row>& rows) {
  fmt::print(
      "| model | layers | s | checkpoint layers | checkpoint bytes/page | saved vs s=1 | K+V "
      "bytes/page | rebuild ms/page | vs s=1 | recompute from tokens ms/page | rebuild / "
      "recompute | bit-exact |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Row& r : rows) {
    const Row* base = nullptr;
    for (const Row& b : rows) {
      if (b.model == r.model && b.every == 1) base = &b;
    }
    const double saved =
        base != nullptr ? 1.0 - static_cast<double>(r.checkpoint_bytes_per_page) /
                                    static_cast<double>(base->checkpoint_bytes_per_page)
                        : 0.0;
    const double slower = base != nullptr && base->rebuild_ms > 0 ? r.rebuild_ms / base->rebuild_ms : 0.0;
    fmt::print("| {} | {} | {} | {} | {} | {:.1f}% | {} | {:.2f} | {:.2f}x | {:.2f} | {:.2f} | {} |\n",
               r.model, r.layers, r.every, r.layers_kept, r.checkpoint_bytes_per_page, 100.0 * saved,
               r.kv_bytes_per_page, r.rebuild_ms, slower, r.tokens_ms,
               r.tokens_ms > 0 ? r.rebuild_ms / r.tokens_ms : 0.0,
               r.differing_bytes == 0 ? "yes" : fmt::format("NO ({} bytes differ)", r.differing_bytes));
  }
}

void PrintJson(std::FILE* out, const std::vector<Row>& rows, const Settings& s) {
  fmt::print(out, 
      "{{\"threads\": {}, \"pages\": {}, \"reps\": {}, \"block_tokens\": {}, \"clock\": \"{}\", "
      "\"rows\": [\n",
      s.threads, s.pages, s.reps, kBlockTokens, s.cpu_time ? "thread-cpu" : "wall");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    fmt::print(
        out,
        "  {{\"model\": \"{}\", \"layers\": {}, \"checkpoint_every\": {}, \"checkpoint_layers\": {}, "
        "\"checkpoint_bytes_per_page\": {}, \"kv_bytes_per_page\": {}, \"rebuild_ms_per_page\": "
        "{:.4f}, \"recompute_tokens_ms_per_page\": {:.4f}, \"bit_exact\": {}}}{}\n",
        r.model, r.layers, r.every, r.layers_kept, r.checkpoint_bytes_per_page, r.kv_bytes_per_page,
        r.rebuild_ms, r.tokens_ms, r.differing_bytes == 0 ? "true" : "false",
        i + 1 < rows.size() ? "," : "");
  }
  fmt::print(out, "]}}\n");
}

StatusOr<Settings> ParseArgs(int argc, char** argv) {
  Settings s;
  auto number = [&](int& i) -> StatusOr<int64_t> {
    if (i + 1 >= argc) return InvalidArgumentError(fmt::format("{} needs a value", argv[i]));
    return std::stoll(argv[++i]);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      s.json = true;
    } else if (a == "--json-file") {
      if (i + 1 >= argc) return InvalidArgumentError("--json-file needs a path");
      s.json_file = argv[++i];
    } else if (a == "--cpu-time") {
      s.cpu_time = true;
    } else if (a == "-t") {
      KVL_ASSIGN_OR_RETURN(const int64_t t, number(i));
      s.threads = static_cast<int>(t);
    } else if (a == "--pages") {
      KVL_ASSIGN_OR_RETURN(s.pages, number(i));
    } else if (a == "--reps") {
      KVL_ASSIGN_OR_RETURN(const int64_t r, number(i));
      s.reps = static_cast<int>(r);
    } else if (a == "--strides") {
      if (i + 1 >= argc) return InvalidArgumentError("--strides needs a list");
      s.strides.clear();
      std::string list = argv[++i];
      for (size_t pos = 0; pos <= list.size();) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        s.strides.push_back(std::stoll(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else if (!a.empty() && a[0] == '-') {
      return InvalidArgumentError(fmt::format("unknown flag {}", a));
    } else {
      s.models.push_back(a);
    }
  }
  if (s.models.empty() || s.pages < 1 || s.reps < 1 || s.threads < 1) {
    return InvalidArgumentError(
        "usage: checkpoint_depth_bench [--json] [--cpu-time] [-t THREADS] [--pages N] [--reps N] "
        "[--strides 1,2,4,8] MODEL.gguf...");
  }
  return s;
}

int Main(int argc, char** argv) {
  const StatusOr<Settings> settings = ParseArgs(argc, argv);
  if (!settings.ok()) {
    fmt::print(stderr, "{}\n", settings.status().message());
    return 2;
  }
  const Settings& s = *settings;
  g_cpu_time = s.cpu_time;
  std::vector<Row> rows;
  for (const std::string& path : s.models) {
    StatusOr<std::unique_ptr<Model>> model = Model::Load(path);
    if (!model.ok()) {
      fmt::print(stderr, "{}: {}\n", path, model.status().message());
      return 1;
    }
    ThreadPool threads(s.threads);
    ops::OpsContext ops(ops::BestIsa(), &threads);
    const int64_t num_tokens = s.pages * kBlockTokens + 1;
    Forward forward(**model, ops, ForwardOptions{num_tokens, 1, num_tokens});
    // A stride past the model's layers is measured as s = layers, the sparsest there is.
    std::vector<int64_t> strides;
    for (int64_t every : s.strides) {
      const int64_t clamped = std::min(every, (*model)->config().num_layers);
      if (std::find(strides.begin(), strides.end(), clamped) == strides.end()) strides.push_back(clamped);
    }
    for (int64_t every : strides) {
      StatusOr<Row> row = Measure(path, **model, forward, every, s);
      if (!row.ok()) {
        fmt::print(stderr, "{} s={}: {}\n", path, every, row.status().message());
        return 1;
      }
      if (!s.json) fmt::print(stderr, "{} s={}: {:.2f} ms per page\n", row->model, every, row->rebuild_ms);
      rows.push_back(*row);
    }
  }
  if (s.json) {
    PrintJson(stdout, rows, s);
  } else {
    PrintTable(rows);
  }
  if (!s.json_file.empty()) {
    std::FILE* f = std::fopen(s.json_file.c_str(), "w");
    if (f == nullptr) {
      fmt::print(stderr, "{}: cannot write\n", s.json_file);
      return 1;
    }
    PrintJson(f, rows, s);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace kvl

int main(int argc, char** argv) { return kvl::Main(argc, argv); }
