// `kvl bench quality`: what each way of holding a KV page costs in quality against what it keeps
// resident, on the loaded model. Every lossy representation the lattice can give a page is run
// through a real paged cache (kvl/kv_quality.h, the core calibration and `kvl bench`'s kld
// column share): the cache types (-ctk/-ctv) store every row that way from the start; compress
// int8 / int4 encodes every completed page with the page codec and reads it back as a compressed
// page is read. Teacher-forced over a text (the built-in one, or -f): the next-token distribution
// at every position after the first page against the f32 cache's, as mean KL divergence, top-1
// agreement.
//
// The lossless actions (demote to RAM or disk, recompute from residual checkpoints or tokens)
// leave nothing of the page in the pool and bring it back bit-identical: their KLD is 0 by
// construction, which the engine's tests assert on every path (tests/engine/kv_actions_test.cc,
// checkpoint_depth_test.cc), so they are listed, not measured. Eviction is not measured here: its
// quality depends on which pages a budget drops, which `kvl bench turns` shows per reply.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "kvl/dtype.h"
#include "kvl/kv_codec.h"
#include "kvl/kv_quality.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"
#include "kvl/tokenizer.h"
#include "kvl/user_file.h"

namespace kvl::cli {
namespace {

// A text file is read whole; more than this is not a text to teacher-force a small model over.
constexpr int64_t kMaxTextBytes = 16 << 20;

struct Config {
  std::string name;    // "f16", "q8_0", "compress int8", ...
  std::string family;  // "cache type", "compress", "lossless"
  KvQualityVariant variant;
  double bytes_per_token = 0;  // K+V of one token over every layer, as held
};

// Bytes one token's K and V take over every layer, rows stored as (type_k, type_v).
double RowTypeBytes(const ModelConfig& c, DType type_k, DType type_v) {
  return static_cast<double>(c.num_layers) *
         static_cast<double>(RowBytes(type_k, c.kv_dim()) + RowBytes(type_v, c.kv_dim()));
}

// The same for a page compressed by the codec (its slab slot: codes, scales, padding).
double CodecBytes(const ModelConfig& c, KvCodecType type) {
  constexpr int64_t kPageTokens = 16;
  return static_cast<double>(CompressedPageBytes(type, kPageTokens, c.num_layers, c.kv_dim())) /
         kPageTokens;
}

std::vector<Config> Configs(const ModelConfig& c) {
  std::vector<Config> out;
  auto type = [&](const char* name, DType k, DType v) {
    Config cfg{name, "cache type", {}, RowTypeBytes(c, k, v)};
    cfg.variant.type_k = k;
    cfg.variant.type_v = v;
    out.push_back(cfg);
  };
  type("f32", DType::kF32, DType::kF32);
  type("f16", DType::kF16, DType::kF16);
  type("bf16", DType::kBF16, DType::kBF16);
  type("q8_0", DType::kQ8_0, DType::kQ8_0);
  type("q8_0 K, f16 V", DType::kQ8_0, DType::kF16);
  type("q4_0", DType::kQ4_0, DType::kQ4_0);
  for (KvCodecType codec : {KvCodecType::kInt8, KvCodecType::kInt4}) {
    Config cfg{codec == KvCodecType::kInt8 ? "compress int8" : "compress int4", "compress", {},
               CodecBytes(c, codec)};
    cfg.variant.page_codec = codec;
    out.push_back(cfg);
  }
  return out;
}

// One representation and what it measured against the f32 cache.
struct Row {
  Config config;
  KvQualityMeasurement measured;
};

void PrintTable(const std::vector<Row>& rows, const ModelConfig& c, const std::string& model_name,
                int64_t text_tokens) {
  const double f32 = rows.front().config.bytes_per_token;
  fmt::print("model     {}: {} layers, kv_dim {}\n", model_name, c.num_layers, c.kv_dim());
  fmt::print("text      {} tokens, teacher-forced; compared at every position after the first "
             "16-token page\n\n",
             text_tokens);
  fmt::print("| representation    | family     | bytes / token | of f32 | mean KLD (nats) | top-1 agree |\n");
  fmt::print("|-------------------|------------|--------------:|-------:|----------------:|------------:|\n");
  for (const Row& r : rows) {
    fmt::print("| {:<17} | {:<10} | {:>13.0f} | {:>5.1f}% | {:>15.3e} | {:>10.2f}% |\n",
               r.config.name, r.config.family, r.config.bytes_per_token,
               100.0 * r.config.bytes_per_token / f32, r.measured.mean_kld, 100.0 * r.measured.top1);
  }
  fmt::print("| {:<17} | {:<10} | {:>13} | {:>6} | {:>15} | {:>11} |\n", "demote, recompute",
             "lossless", "0 in the pool", "0%", "0 (bit-exact)", "100.00%");
}

nlohmann::json ToJson(const std::vector<Row>& rows, const ModelConfig& c,
                      const std::string& model_path, const std::string& model_name,
                      int64_t text_tokens) {
  nlohmann::json j;
  j["bench"] = "quality";
  j["model"] = model_path;
  j["model_name"] = model_name;
  j["layers"] = c.num_layers;
  j["kv_dim"] = c.kv_dim();
  j["text_tokens"] = text_tokens;
  j["compared_from"] = 16;
  j["configs"] = nlohmann::json::array();
  const double f32 = rows.front().config.bytes_per_token;
  for (const Row& r : rows) {
    j["configs"].push_back({{"name", r.config.name},
                            {"family", r.config.family},
                            {"bytes_per_token", r.config.bytes_per_token},
                            {"fraction_of_f32", r.config.bytes_per_token / f32},
                            {"mean_kld", r.measured.mean_kld},
                            {"top1", r.measured.top1},
                            {"positions", r.measured.positions}});
  }
  j["lossless"] = {{"actions", {"demote-ram", "demote-disk", "recompute-residual", "recompute-tokens"}},
                   {"bytes_per_token_in_pool", 0},
                   {"mean_kld", 0},
                   {"how", "bit-exact by construction; asserted by the engine tests, not measured here"}};
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
  const std::vector<std::vector<int32_t>> texts = {(*tokenizer)->Encode(text, /*add_bos=*/true)};
  const ModelConfig& c = (*model)->config();
  const int64_t text_tokens =
      std::min<int64_t>(static_cast<int64_t>(texts[0].size()),
                        c.context_length > 0 ? c.context_length : INT64_MAX);

  const int threads = ThreadsOrEveryCore(args.num_threads);
  StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(threads);
  if (!pool.ok()) return fail(pool.status());
  ops::OpsContext ctx(ops::BestIsa(), pool->get());

  const std::vector<Config> configs = Configs(c);
  std::vector<KvQualityVariant> variants;
  for (const Config& cfg : configs) variants.push_back(cfg.variant);
  StatusOr<std::vector<KvQualityMeasurement>> measured =
      MeasureKvQuality(**model, ctx, texts, variants, KvQualityRows::kAfterFirstPage);
  if (!measured.ok()) return fail(measured.status());
  std::vector<Row> rows;
  for (size_t i = 0; i < configs.size(); ++i) rows.push_back({configs[i], (*measured)[i]});

  const std::string& model_name = c.name;
  const nlohmann::json j = ToJson(rows, c, args.model_path, model_name, text_tokens);
  if (args.output == "json") {
    fmt::print("{}\n", j.dump(1));
  } else {
    PrintTable(rows, c, model_name, text_tokens);
  }
  if (!args.json_path.empty()) {
    std::ofstream f(args.json_path);
    f << j.dump(1) << "\n";
    if (!f) return fail(IoError(fmt::format("--json: cannot write {}", args.json_path)));
  }
  return 0;
}

}  // namespace kvl::cli
