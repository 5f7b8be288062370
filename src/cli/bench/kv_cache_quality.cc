// MeasureKvRepresentations: each chunk of the text through a paged cache held as f16 (the
// reference) and as each representation; the logits of the chunk's second half compared row by
// row, and the q.k error of each representation's keys on the first chunk (kv_cache_quality.h).
#include "kv_cache_quality.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "kvl/forward.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_quality.h"
#include "kvl/quant.h"

namespace kvl::cli {
namespace {

constexpr int64_t kPageTokens = 16;
// Tokens per forward run of a representation without a page codec (one with a codec runs a page
// at a time, so that every later position reads the completed pages as the codec holds them).
constexpr int64_t kRunTokens = 512;
// The q.k error takes every kQueryStride-th compared position as a query, against every key it
// sees: enough pairs for a stable figure at a fraction of the cost.
constexpr int64_t kQueryStride = 4;

// A paged cache of one sequence of up to `tokens` tokens.
struct OneSequenceCache {
  std::unique_ptr<KvManager> manager;
  std::unique_ptr<KvBlockStorage> storage;
  std::unique_ptr<PagedKvCache> cache;
  KvBlockLayout layout;
};

StatusOr<OneSequenceCache> MakeCache(const ModelConfig& c, int64_t tokens, DType k, DType v,
                                     int64_t residual_dim) {
  OneSequenceCache out;
  KvManagerOptions o;
  o.layout = KvBlockLayout{kPageTokens, c.num_layers, c.kv_dim(), residual_dim, k, v};
  o.budget_bytes = (tokens / kPageTokens + 1) * o.layout.block_bytes();
  o.max_seqs = 1;
  o.enable_prefix_cache = false;
  out.layout = o.layout;
  KVL_ASSIGN_OR_RETURN(out.manager, KvManager::Create(o));
  KVL_ASSIGN_OR_RETURN(out.storage, KvBlockStorage::Create(o.layout, out.manager->num_blocks()));
  out.cache = std::make_unique<PagedKvCache>(*out.manager, *out.storage);
  return out;
}

// The logits of positions [first, n) of a chunk, [n - first][vocab], with K/V held as `rep`;
// with `checkpoints`, also every layer's input at every position, [layer][n][dim].
StatusOr<std::vector<float>> ChunkLogits(const Model& model, Forward& forward,
                                         std::span<const int32_t> tokens, int64_t first,
                                         const KvRepresentation& rep,
                                         std::vector<float>* checkpoints) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVL_ASSIGN_OR_RETURN(OneSequenceCache kv,
                       MakeCache(c, n, rep.type_k, rep.type_v, checkpoints ? c.dim : 0));
  const int64_t step = rep.page_codec ? kPageTokens : kRunTokens;
  std::vector<float> out;
  out.reserve(static_cast<size_t>((n - first) * c.vocab_size));
  std::vector<uint8_t> scratch;
  TokenBatch batch;
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t end = std::min(n, begin + step);
    const KvSeqStep seq_step{0, tokens.subspan(static_cast<size_t>(begin),
                                               static_cast<size_t>(end - begin))};
    const KvPlan plan = kv.manager->Plan(std::span(&seq_step, 1));
    if (!plan.fits) return InternalError("bench quality: a chunk does not fit its KV pool");
    kv.manager->Commit(plan);
    batch.Clear();
    int64_t logit_rows = 0;
    for (int64_t i = begin; i < end; ++i) {
      batch.Add(tokens[static_cast<size_t>(i)], i, 0, i >= first);
      logit_rows += i >= first ? 1 : 0;
    }
    forward.Run(batch, *kv.cache);
    for (int64_t r = 0; r < logit_rows; ++r) {
      out.insert(out.end(), forward.logits(r), forward.logits(r) + c.vocab_size);
    }
    if (rep.page_codec && end % kPageTokens == 0) {
      const BlockId block = kv.manager->block_table(0)[static_cast<size_t>(end / kPageTokens - 1)];
      RoundTripCompressedPage(*kv.storage, block, kv.layout, *rep.page_codec, scratch);
    }
  }
  if (checkpoints != nullptr) {
    checkpoints->resize(static_cast<size_t>(c.num_layers * n * c.dim));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      for (int64_t p = 0; p < n; ++p) {
        const float* x = kv.cache->ResidualAt(0, l, p);
        KVL_CHECK(x != nullptr);
        std::memcpy(&(*checkpoints)[static_cast<size_t>((l * n + p) * c.dim)], x,
                    sizeof(float) * static_cast<size_t>(c.dim));
      }
    }
  }
  kv.manager->Free(0);
  return out;
}

// A layer's keys [n][kv_dim] as `rep` holds them, in the basis its queries meet: rotated per head
// for a rotated type. A compressed representation holds complete pages only (the last partial
// page stays exact, as in the pool).
void HeldKeys(const KvRepresentation& rep, const ModelConfig& c, ops::OpsContext& ctx,
              const float* k, int64_t n, std::vector<float>* out) {
  const int64_t kv_dim = c.kv_dim();
  out->assign(k, k + n * kv_dim);
  if (rep.page_codec) {
    std::vector<uint8_t> code(static_cast<size_t>(
        CompressedLayerBytes(*rep.page_codec, kPageTokens, kv_dim)));
    std::vector<float> values(static_cast<size_t>(kPageTokens * kv_dim));
    for (int64_t p = 0; p + kPageTokens <= n; p += kPageTokens) {
      float* page = out->data() + p * kv_dim;
      std::memcpy(values.data(), page, sizeof(float) * values.size());
      EncodeLayer(*rep.page_codec, page, values.data(), kPageTokens, kv_dim, code.data());
      DecodeLayer(*rep.page_codec, code.data(), kPageTokens, kv_dim, page, values.data());
    }
    return;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(RowBytes(rep.type_k, kv_dim)));
  for (int64_t t = 0; t < n; ++t) {
    float* row = out->data() + t * kv_dim;
    if (IsRotatedKvType(rep.type_k)) {
      ops::HadamardRotate(ctx, row, c.num_kv_heads, c.head_dim);
    }
    quant::QuantizeRow(rep.type_k, row, kv_dim, bytes.data());
    quant::DequantizeRow(rep.type_k, bytes.data(), kv_dim, row);
  }
}

double Dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// Sum of squared q.k errors and of squared q.k over one layer, per representation:
// [rep] += {error^2, reference^2}, for the queries at every kQueryStride-th position from `first`
// against every key they see.
void AccumulateScoreErrors(const ModelConfig& c, ops::OpsContext& ctx, Forward& forward,
                           int64_t layer, const float* checkpoints, int64_t n, int64_t first,
                           std::span<const KvRepresentation> reps,
                           std::vector<std::pair<double, double>>* sums) {
  const int64_t d = c.head_dim, group = c.num_heads / c.num_kv_heads;
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) positions[static_cast<size_t>(p)] = p;
  std::vector<float> q(static_cast<size_t>(n * c.q_dim()));
  std::vector<float> k(static_cast<size_t>(n * c.kv_dim())), v(k.size());
  forward.LayerQueries(layer, checkpoints, positions.data(), n, q.data());
  forward.RebuildLayerKv(layer, checkpoints, positions.data(), n, DType::kF32, k.data(),
                         DType::kF32, v.data());
  std::vector<float> q_rotated = q;
  ops::HadamardRotate(ctx, q_rotated.data(), n * c.num_heads, d);
  std::vector<float> held;
  for (size_t r = 0; r < reps.size(); ++r) {
    HeldKeys(reps[r], c, ctx, k.data(), n, &held);
    const std::vector<float>& queries = IsRotatedKvType(reps[r].type_k) ? q_rotated : q;
    for (int64_t i = first; i < n; i += kQueryStride) {
      for (int64_t h = 0; h < c.num_heads; ++h) {
        const int64_t kv_off = (h / group) * d;
        const float* qi = &q[static_cast<size_t>(i * c.q_dim() + h * d)];
        const float* qh = &queries[static_cast<size_t>(i * c.q_dim() + h * d)];
        for (int64_t j = 0; j <= i; ++j) {
          const double want = Dot(qi, &k[static_cast<size_t>(j * c.kv_dim() + kv_off)], d);
          const double got = Dot(qh, &held[static_cast<size_t>(j * c.kv_dim() + kv_off)], d);
          (*sums)[r].first += (got - want) * (got - want);
          (*sums)[r].second += want * want;
        }
      }
    }
  }
}

}  // namespace

double BitsPerValue(const KvRepresentation& r, int64_t kv_dim) {
  if (r.page_codec) {
    const double bytes = static_cast<double>(CompressedLayerBytes(*r.page_codec, kPageTokens, kv_dim));
    return 8.0 * bytes / static_cast<double>(2 * kPageTokens * kv_dim);
  }
  const double bytes = static_cast<double>(RowBytes(r.type_k, kv_dim) + RowBytes(r.type_v, kv_dim));
  return 8.0 * bytes / static_cast<double>(2 * kv_dim);
}

std::vector<KvRepresentation> QualityRepresentations(const ModelConfig& c,
                                                     std::vector<std::string>* skipped) {
  std::vector<KvRepresentation> out = {
      {"f32", DType::kF32, DType::kF32, std::nullopt},
      {"q8_0", DType::kQ8_0, DType::kQ8_0, std::nullopt},
      {"q4_0", DType::kQ4_0, DType::kQ4_0, std::nullopt},
  };
  const Status rotates = CheckKvCacheTypes(c, DType::kQ4_0R, DType::kQ4_0R);
  if (rotates.ok()) {
    out.push_back({"q8_0r", DType::kQ8_0R, DType::kQ8_0R, std::nullopt});
    out.push_back({"q4_0r", DType::kQ4_0R, DType::kQ4_0R, std::nullopt});
    out.push_back({"q8_0r K, q4_0r V", DType::kQ8_0R, DType::kQ4_0R, std::nullopt});
  } else {
    skipped->push_back(fmt::format("q8_0r, q4_0r: {}", rotates.message()));
  }
  out.push_back({"compress int8", DType::kF32, DType::kF32, KvCodecType::kInt8});
  out.push_back({"compress int4", DType::kF32, DType::kF32, KvCodecType::kInt4});
  return out;
}

StatusOr<KvQualityRun> MeasureKvRepresentations(const Model& model, ops::OpsContext& ctx,
                                                std::span<const int32_t> tokens, int64_t ctx_tokens,
                                                int64_t max_chunks, int32_t bos,
                                                std::span<const KvRepresentation> reps) {
  const ModelConfig& c = model.config();
  const int64_t total = static_cast<int64_t>(tokens.size());
  if (total < 2 * kPageTokens) {
    return InvalidArgumentError(fmt::format(
        "the text tokenizes to {} tokens; the bench compares the second half of a chunk and "
        "needs at least {}",
        total, 2 * kPageTokens));
  }
  KvQualityRun run;
  run.ctx = std::min(ctx_tokens, total);
  run.chunks = total / run.ctx;
  if (max_chunks > 0) run.chunks = std::min(run.chunks, max_chunks);
  const int64_t first = run.ctx / 2;  // as llama-perplexity scores a chunk: its second half

  Forward forward(model, ctx, ForwardOptions{kRunTokens, kRunTokens, run.ctx});
  std::vector<std::vector<double>> klds(reps.size());
  std::vector<int64_t> agree(reps.size(), 0);
  std::vector<std::pair<double, double>> score_sums(reps.size(), {0.0, 0.0});
  const KvRepresentation reference{"f16", DType::kF16, DType::kF16, std::nullopt};
  for (int64_t chunk = 0; chunk < run.chunks; ++chunk) {
    // As llama-perplexity: each chunk starts with BOS in place of its first token.
    std::vector<int32_t> part(tokens.begin() + chunk * run.ctx,
                              tokens.begin() + (chunk + 1) * run.ctx);
    if (bos >= 0) part[0] = bos;
    std::vector<float> checkpoints;
    KVL_ASSIGN_OR_RETURN(const std::vector<float> want,
                         ChunkLogits(model, forward, part, first, reference,
                                     chunk == 0 ? &checkpoints : nullptr));
    for (size_t r = 0; r < reps.size(); ++r) {
      KVL_ASSIGN_OR_RETURN(const std::vector<float> got,
                           ChunkLogits(model, forward, part, first, reps[r], nullptr));
      for (size_t at = 0; at < want.size(); at += static_cast<size_t>(c.vocab_size)) {
        const ops::LogitsDivergence d = ops::CompareLogits(&want[at], &got[at], c.vocab_size);
        klds[r].push_back(d.kld);
        agree[r] += d.same_top1 ? 1 : 0;
      }
    }
    if (chunk == 0) {
      for (int64_t l = 0; l < c.num_layers; ++l) {
        AccumulateScoreErrors(c, ctx, forward, l, &checkpoints[static_cast<size_t>(l * run.ctx * c.dim)],
                              run.ctx, first, reps, &score_sums);
      }
    }
  }
  for (size_t r = 0; r < reps.size(); ++r) {
    KvQualityFigures f;
    std::vector<double>& k = klds[r];
    f.positions = static_cast<int64_t>(k.size());
    double sum = 0;
    for (double x : k) sum += x;
    f.kld_mean = sum / static_cast<double>(f.positions);
    std::sort(k.begin(), k.end());
    // Nearest rank: the smallest KLD at or above 99% of the positions.
    const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(k.size())));
    f.kld_p99 = k[std::max<size_t>(rank, 1) - 1];
    f.top1 = static_cast<double>(agree[r]) / static_cast<double>(f.positions);
    f.qk_error = score_sums[r].second > 0 ? std::sqrt(score_sums[r].first / score_sums[r].second) : 0;
    run.figures.push_back(f);
  }
  run.positions = run.figures.empty() ? 0 : run.figures.front().positions;
  return run;
}

}  // namespace kvl::cli
