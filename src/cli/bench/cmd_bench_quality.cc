// `kvl bench quality`: what each way of holding K and V costs in quality on the loaded model, as
// practitioners measure it (llama-perplexity --kl-divergence): teacher-forced over a text (the
// built-in one, or -f) in chunks of 512 tokens and of the model's whole context (or --ctx), every
// position of each chunk's second half compared with an f16 cache's: mean and 99th-percentile KL
// divergence, top-1 agreement, and the relative RMS error of the attention logits q.k. The cache
// types (-ctk/-ctv, the rotated q8_0r / q4_0r among them) store every row that way from the
// start; compress int8 / int4 encodes every completed page with the lattice's page codec and
// reads it back as a compressed page is read (kv_cache_quality.h).
//
// The lossless actions (demote to RAM or disk, recompute from residual checkpoints or tokens)
// bring a page back bit-identical: their KLD is 0 by construction, which the engine's tests
// assert (tests/engine/kv_actions_test.cc, checkpoint_depth_test.cc), so they are not measured.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "kv_cache_quality.h"
#include "kvl/kv_quality.h"  // kKvQualityText
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"
#include "kvl/tokenizer.h"
#include "kvl/user_file.h"

namespace kvl::cli {
namespace {

// A text file is read whole; more than this is not a text to teacher-force a small model over.
constexpr int64_t kMaxTextBytes = 16 << 20;
// The shorter context every model is measured at (llama-perplexity's default).
constexpr int64_t kShortContext = 512;

std::string Family(const KvRepresentation& r) { return r.page_codec ? "compress" : "cache type"; }

void PrintTable(const KvQualityRun& run, std::span<const KvRepresentation> reps,
                const ModelConfig& c) {
  fmt::print("\nctx {}: {} chunk(s), {} positions compared (each chunk's second half), reference "
             "f16 cache; q.k error on the first chunk against f32 keys\n\n",
             run.ctx, run.chunks, run.positions);
  fmt::print("| {:<17} | {:<10} | {:>6} | {:>12} | {:>12} | {:>8} | {:>10} |\n", "name", "family",
             "bits", "kld_mean", "kld_p99", "top1", "q.k error");
  fmt::print("|-------------------|------------|-------:|-------------:|-------------:|---------:|-----------:|\n");
  for (size_t i = 0; i < reps.size(); ++i) {
    const KvQualityFigures& f = run.figures[i];
    fmt::print("| {:<17} | {:<10} | {:>6.2f} | {:>12.4e} | {:>12.4e} | {:>7.2f}% | {:>10.3e} |\n",
               reps[i].name, Family(reps[i]), BitsPerValue(reps[i], c.kv_dim()), f.kld_mean,
               f.kld_p99, 100.0 * f.top1, f.qk_error);
  }
}

nlohmann::json ToJson(const std::vector<KvQualityRun>& runs, std::span<const KvRepresentation> reps,
                      const std::vector<std::string>& skipped, const ModelConfig& c,
                      const std::string& model_path, int64_t text_tokens) {
  nlohmann::json j;
  j["bench"] = "quality";
  j["model"] = model_path;
  j["model_name"] = c.name;
  j["layers"] = c.num_layers;
  j["kv_dim"] = c.kv_dim();
  j["head_dim"] = c.head_dim;
  j["reference"] = "f16";
  j["text_tokens"] = text_tokens;
  j["skipped"] = skipped;
  j["contexts"] = nlohmann::json::array();
  j["configs"] = nlohmann::json::array();
  for (const KvQualityRun& run : runs) {
    j["contexts"].push_back(
        {{"ctx", run.ctx}, {"chunks", run.chunks}, {"positions", run.positions}});
    for (size_t i = 0; i < reps.size(); ++i) {
      const KvQualityFigures& f = run.figures[i];
      j["configs"].push_back({{"name", reps[i].name},
                              {"ctx", run.ctx},
                              {"family", Family(reps[i])},
                              {"bits_per_value", BitsPerValue(reps[i], c.kv_dim())},
                              {"kld_mean", f.kld_mean},
                              {"kld_p99", f.kld_p99},
                              {"top1", f.top1},
                              {"qk_error", f.qk_error},
                              {"positions", f.positions}});
    }
  }
  return j;
}

}  // namespace

int BenchQualityCommand(const BenchQualityArgs& args) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kvl bench quality: {}\n", s.ToString());
    return 1;
  };
  StatusOr<std::unique_ptr<Model>> model = Model::Load(args.model_path);
  if (!model.ok()) return fail(model.status());
  StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf((*model)->file());
  if (!tokenizer.ok()) return fail(tokenizer.status());
  std::string text(kKvQualityText);
  if (!args.text_path.empty()) {
    StatusOr<std::string> file = ReadUserFile(args.text_path, "-f", kMaxTextBytes);
    if (!file.ok()) return fail(file.status());
    text = std::move(*file);
  }
  const std::vector<int32_t> tokens = (*tokenizer)->Encode(text, /*add_bos=*/true);
  const int32_t bos = (*tokenizer)->add_bos_default() ? (*tokenizer)->bos() : -1;
  const ModelConfig& c = (*model)->config();
  const int64_t full = c.context_length > 0 ? c.context_length : kShortContext;
  if (args.ctx > full) {
    return fail(InvalidArgumentError(fmt::format(
        "--ctx {} is larger than the model's context ({} tokens)", args.ctx, full)));
  }
  std::vector<int64_t> contexts = {args.ctx};
  if (args.ctx == 0) contexts = {std::min(kShortContext, full), full};
  // A text shorter than a context is measured once, at its own length.
  for (int64_t& n : contexts) n = std::min<int64_t>(n, static_cast<int64_t>(tokens.size()));
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());

  const int threads = ThreadsOrEveryCore(args.num_threads);
  StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(threads);
  if (!pool.ok()) return fail(pool.status());
  ops::OpsContext ctx(ops::BestIsa(), pool->get());

  std::vector<std::string> skipped;
  const std::vector<KvRepresentation> reps = QualityRepresentations(c, &skipped);
  // The table's header lines; with -o json, stdout is the JSON alone.
  std::FILE* notes = args.output == "json" ? stderr : stdout;
  fmt::print(notes, "model {}: {} layers, {} KV heads of {}, context {}; text {} tokens\n", c.name,
             c.num_layers, c.num_kv_heads, c.head_dim, full, tokens.size());
  for (const std::string& line : skipped) fmt::print(notes, "not measured: {}\n", line);
  std::vector<KvQualityRun> runs;
  for (const int64_t n : contexts) {
    StatusOr<KvQualityRun> run =
        MeasureKvRepresentations(**model, ctx, tokens, n, args.chunks, bos, reps);
    if (!run.ok()) return fail(run.status());
    if (args.output != "json") PrintTable(*run, reps, c);
    runs.push_back(std::move(*run));
  }
  const nlohmann::json j =
      ToJson(runs, reps, skipped, c, args.model_path, static_cast<int64_t>(tokens.size()));
  if (args.output == "json") fmt::print("{}\n", j.dump(1));
  if (!args.json_path.empty()) {
    std::ofstream f(args.json_path);
    f << j.dump(1) << "\n";
    if (!f) return fail(IoError(fmt::format("--json: cannot write {}", args.json_path)));
  }
  return 0;
}

}  // namespace kvl::cli
