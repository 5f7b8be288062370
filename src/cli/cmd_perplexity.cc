// kvl perplexity: a text's perplexity under the model, measured as llama.cpp's llama-perplexity
// measures it, so the two figures can be set side by side:
//   - the whole text is tokenized at once, with BOS where the vocabulary adds one;
//   - it is cut into chunks of n_ctx tokens (a tail shorter than a chunk is left out), and each
//     chunk runs on its own, from an empty cache, with its first token replaced by BOS;
//   - only the second half of each chunk is scored: the logits at positions n_ctx/2 .. n_ctx-2
//     predict the tokens after them, so every scored token has at least n_ctx/2 tokens of context;
//   - after each chunk the running estimate exp(mean NLL) is printed as "[i]ppl,", and at the
//     end "Final estimate: PPL = X +/- U" with U from the NLL's standard error.
// Our own last line is "perplexity: X". Teacher-forced logits come from the forward pass over a
// real paged cache of the -ctk/-ctv types, -b tokens per step, as a prompt is prefilled.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"
#include "kvl/tokenizer.h"
#include "kvl/user_file.h"

namespace kvl::cli {
namespace {

// A text larger than this is not one to measure on a CPU; refusing it keeps memory bounded.
constexpr int64_t kMaxTextBytes = 256 << 20;
constexpr int32_t kPageTokens = 16;

// Running sums over the scored tokens of every chunk so far.
struct NllSums {
  double nll = 0;   // sum of -log p(token)
  double nll2 = 0;  // sum of its squares
  int64_t count = 0;
};

// -log softmax(logits)[token], as llama.cpp's log_softmax: the maximum in float, the sum of
// exponentials in double.
double NegativeLogProb(const float* logits, int64_t vocab, int32_t token) {
  float max_logit = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum_exp = 0;
  for (int64_t i = 0; i < vocab; ++i) sum_exp += std::exp(static_cast<double>(logits[i] - max_logit));
  return -(static_cast<double>(logits[token] - max_logit) - std::log(sum_exp));
}

// What a run measures with: the model, its forward pass and a paged cache for one chunk.
class ChunkScorer {
 public:
  static StatusOr<std::unique_ptr<ChunkScorer>> Create(const Model& model, ops::OpsContext& ctx,
                                                       int64_t n_ctx, int64_t n_batch,
                                                       DType type_k, DType type_v) {
    const ModelConfig& c = model.config();
    KvManagerOptions o;
    o.layout = KvBlockLayout{kPageTokens, c.num_layers, c.kv_dim(), 0, type_k, type_v};
    o.budget_bytes = (n_ctx / kPageTokens + 1) * o.layout.block_bytes();
    o.max_seqs = 1;
    o.enable_prefix_cache = false;
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvManager> manager, KvManager::Create(o));
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockStorage> storage,
                         KvBlockStorage::Create(o.layout, manager->num_blocks()));
    return std::unique_ptr<ChunkScorer>(new ChunkScorer(model, ctx, n_ctx, n_batch,
                                                        std::move(manager), std::move(storage)));
  }

  // Scores chunk `tokens` (n_ctx of them, the first already BOS where the vocabulary adds one)
  // into `sums`.
  Status Score(std::span<const int32_t> tokens, NllSums* sums) {
    const int64_t n_ctx = static_cast<int64_t>(tokens.size());
    const int64_t first = n_ctx / 2;
    const int64_t vocab = model_.config().vocab_size;
    PagedKvCache cache(*manager_, *storage_);
    TokenBatch batch;
    for (int64_t begin = 0; begin < n_ctx; begin += n_batch_) {
      const int64_t end = std::min(n_ctx, begin + n_batch_);
      const KvSeqStep step{0, tokens.subspan(static_cast<size_t>(begin),
                                             static_cast<size_t>(end - begin))};
      const KvPlan plan = manager_->Plan(std::span(&step, 1));
      if (!plan.fits) return InternalError("perplexity: a chunk does not fit its KV pool");
      manager_->Commit(plan);
      batch.Clear();
      // Logits only where they are scored: positions first .. n_ctx-2.
      for (int64_t i = begin; i < end; ++i) {
        batch.Add(tokens[static_cast<size_t>(i)], i, 0, i >= first && i < n_ctx - 1);
      }
      forward_.Run(batch, cache);
      int64_t row = 0;
      for (int64_t i = std::max(begin, first); i < std::min(end, n_ctx - 1); ++i, ++row) {
        const double nll =
            NegativeLogProb(forward_.logits(row), vocab, tokens[static_cast<size_t>(i + 1)]);
        sums->nll += nll;
        sums->nll2 += nll * nll;
        ++sums->count;
      }
    }
    manager_->Free(0);
    return Status::Ok();
  }

 private:
  ChunkScorer(const Model& model, ops::OpsContext& ctx, int64_t n_ctx, int64_t n_batch,
              std::unique_ptr<KvManager> manager, std::unique_ptr<KvBlockStorage> storage)
      : model_(model),
        n_batch_(n_batch),
        manager_(std::move(manager)),
        storage_(std::move(storage)),
        forward_(model, ctx, ForwardOptions{n_batch, n_batch, n_ctx}) {}

  const Model& model_;
  int64_t n_batch_;
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  Forward forward_;
};

Status Measure(const PerplexityArgs& args) {
  KVL_ASSIGN_OR_RETURN(const DType type_k, ParseKvCacheType(args.cache_type_k));
  KVL_ASSIGN_OR_RETURN(const DType type_v, ParseKvCacheType(args.cache_type_v));
  KVL_ASSIGN_OR_RETURN(const std::string text,
                       ReadUserFile(args.text_path, "text file (-f)", kMaxTextBytes));
  if (text.empty()) {
    return InvalidArgumentError(fmt::format("-f: the text file '{}' is empty", args.text_path));
  }
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(args.model_path));
  const ModelConfig& c = model->config();
  KVL_RETURN_IF_ERROR(CheckKvCacheTypes(c, type_k, type_v));
  const int64_t n_ctx = args.context_length > 0
                            ? args.context_length
                            : std::min<int64_t>(512, c.context_length > 0 ? c.context_length : 512);
  if (c.context_length > 0 && n_ctx > c.context_length) {
    return InvalidArgumentError(fmt::format(
        "-c {} is larger than the model's context ({} tokens)", n_ctx, c.context_length));
  }
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromGguf(model->file()));
  std::vector<int32_t> tokens = tokenizer->Encode(text, /*add_bos=*/true);
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  // As llama-perplexity: at least two chunks, so the estimate has an uncertainty.
  if (n_tokens < 2 * n_ctx) {
    return InvalidArgumentError(fmt::format(
        "the text tokenizes to {} tokens; a context of {} (-c) needs at least {} (two chunks)",
        n_tokens, n_ctx, 2 * n_ctx));
  }
  const int64_t n_chunks = n_tokens / n_ctx;
  const int64_t n_batch = std::min<int64_t>(args.batch_size, n_ctx);
  const int32_t bos = tokenizer->add_bos_default() ? tokenizer->bos() : -1;

  const int threads = ThreadsOrEveryCore(args.num_threads);
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<ThreadPool> pool, ThreadPool::Create(threads));
  ops::OpsContext ctx(ops::BestIsa(), pool.get());
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<ChunkScorer> scorer,
                       ChunkScorer::Create(*model, ctx, n_ctx, n_batch, type_k, type_v));

  fmt::print(stderr,
             "perplexity: tokenizing the input: {} tokens\n"
             "perplexity: calculating perplexity over {} chunks, n_ctx={}, batch_size={}, "
             "cache {}/{}\n",
             n_tokens, n_chunks, n_ctx, n_batch, args.cache_type_k, args.cache_type_v);
  NllSums sums;
  for (int64_t i = 0; i < n_chunks; ++i) {
    std::vector<int32_t> chunk(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
    if (bos >= 0) chunk[0] = bos;
    KVL_RETURN_IF_ERROR(scorer->Score(chunk, &sums));
    fmt::print("[{}]{:.4f},", i + 1, std::exp(sums.nll / static_cast<double>(sums.count)));
    std::fflush(stdout);
  }
  // llama.cpp's uncertainty: the standard error of the mean NLL, carried to the PPL.
  const double mean = sums.nll / static_cast<double>(sums.count);
  double spread = sums.nll2 / static_cast<double>(sums.count) - mean * mean;
  spread = spread > 0 ? std::sqrt(spread / static_cast<double>(sums.count - 1)) : 0;
  const double ppl = std::exp(mean);
  fmt::print("\nFinal estimate: PPL = {:.4f} +/- {:.5f}\n", ppl, spread * ppl);
  fmt::print("perplexity: {:.4f}\n", ppl);
  return FlushStdout();
}

}  // namespace

int PerplexityCommand(const PerplexityArgs& args) {
  if (const Status s = Measure(args); !s.ok()) {
    fmt::print(stderr, "kvl perplexity: {}\n", s.ToString());
    return 1;
  }
  return 0;
}

}  // namespace kvl::cli
