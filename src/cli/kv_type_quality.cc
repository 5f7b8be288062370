#include "kv_type_quality.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvl/forward.h"
#include "kvl/kv_manager.h"

namespace kvl::cli {
namespace {

// Fixed prompts of a few dozen tokens each, so the last token attends over a real context.
constexpr std::string_view kPrompts[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
    "with her dog. One day, she found a shiny red ball under a big tree, and she",
    "Tom and his mom went to the market to buy apples. The market was full of people and noise. "
    "Tom saw a man selling balloons of every color, so he asked his mom if",
    "The old lighthouse keeper climbed the stairs every night to light the lamp. One stormy night "
    "the lamp would not turn on, and far out at sea a small boat",
    "In the garden there was a tiny ant who wanted to see the world. He packed a crumb of bread "
    "and said goodbye to his friends. The first thing he saw was",
    "Sara had a box of crayons and a big white paper. She drew a house, a tree and a cat. Then "
    "her brother came in and spilled water on the paper, so Sara",
    "The train left the station early in the morning. Ben sat by the window and watched the "
    "fields go by. A girl with a book sat down next to him and said",
    "Every summer the family drove to the lake. The children swam and built castles of sand "
    "while their father fished. This year, something strange was in the water:",
    "A little bird could not fly because its wing was hurt. A kind boy found it, made it a bed "
    "in a shoebox and gave it seeds. After many days the bird",
};
constexpr int32_t kBlockTokens = 16;

// Next-token logits after each prompt, with a fresh paged cache of the given types per prompt.
StatusOr<std::vector<std::vector<float>>> FinalLogits(const Model& model,
                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                      ops::OpsContext& ops, DType type_k,
                                                      DType type_v) {
  const ModelConfig& c = model.config();
  int64_t longest = 1;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  KvManagerOptions o;
  o.layout = KvBlockLayout{kBlockTokens, c.num_layers, c.kv_dim(), 0, type_k, type_v};
  o.budget_bytes = (longest / kBlockTokens + 1) * o.layout.block_bytes();
  o.max_seqs = 1;
  o.enable_prefix_cache = false;
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvManager> manager, KvManager::Create(o));
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockStorage> storage,
                       KvBlockStorage::Create(o.layout, manager->num_blocks()));
  PagedKvCache cache(*manager, *storage);
  Forward forward(model, ops, ForwardOptions{longest, 1, longest});
  std::vector<std::vector<float>> out;
  for (const std::vector<int32_t>& tokens : prompts) {
    const KvSeqStep step{0, std::span(tokens)};
    const KvPlan plan = manager->Plan(std::span(&step, 1));
    if (!plan.fits) return InternalError("kld: a prompt does not fit its KV pool");
    manager->Commit(plan);
    TokenBatch batch;
    for (size_t i = 0; i < tokens.size(); ++i) {
      batch.Add(tokens[i], static_cast<int64_t>(i), 0, i + 1 == tokens.size());
    }
    forward.Run(batch, cache);
    out.emplace_back(forward.logits(0), forward.logits(0) + c.vocab_size);
    manager->Free(0);
  }
  return out;
}

}  // namespace

StatusOr<KvTypeQuality> MeasureKvTypeQuality(const Model& model, const Tokenizer& tokenizer,
                                             ops::Isa isa, int threads, DType type_k,
                                             DType type_v) {
  ThreadPool pool(std::max(threads, 1));
  ops::OpsContext ops(isa, &pool);
  std::vector<std::vector<int32_t>> prompts;
  for (std::string_view text : kPrompts) {
    std::vector<int32_t> tokens = tokenizer.Encode(text, true);
    const int64_t context = model.config().context_length;
    if (context > 0 && static_cast<int64_t>(tokens.size()) > context) {
      tokens.resize(static_cast<size_t>(context));
    }
    prompts.push_back(std::move(tokens));
  }
  KVL_ASSIGN_OR_RETURN(const auto want, FinalLogits(model, prompts, ops, DType::kF32, DType::kF32));
  KVL_ASSIGN_OR_RETURN(const auto got, FinalLogits(model, prompts, ops, type_k, type_v));
  KvTypeQuality q;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const ops::LogitsDivergence d = ops::CompareLogits(
        want[i].data(), got[i].data(), static_cast<int64_t>(want[i].size()));
    q.mean_kld += d.kld;
    q.top1 += d.same_top1;
  }
  q.num_prompts = static_cast<int>(prompts.size());
  q.mean_kld /= q.num_prompts;
  q.top1 /= q.num_prompts;
  return q;
}

}  // namespace kvl::cli
