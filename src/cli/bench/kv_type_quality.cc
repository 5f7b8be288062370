#include "kv_type_quality.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "kvl/kv_quality.h"
#include "kvl/thread_pool.h"

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
}  // namespace

StatusOr<KvTypeQuality> MeasureKvTypeQuality(const Model& model, const Tokenizer& tokenizer,
                                             ops::Isa isa, int threads, DType type_k,
                                             DType type_v) {
  ThreadPool pool(std::max(threads, 1));
  ops::OpsContext ops(isa, &pool);
  std::vector<std::vector<int32_t>> prompts;
  for (std::string_view text : kPrompts) prompts.push_back(tokenizer.Encode(text, true));
  KvQualityVariant variant;
  variant.type_k = type_k;
  variant.type_v = type_v;
  KVL_ASSIGN_OR_RETURN(const std::vector<KvQualityMeasurement> measured,
                       MeasureKvQuality(model, ops, prompts, std::span(&variant, 1),
                                        KvQualityRows::kLast));
  const KvQualityMeasurement& q = measured[0];
  KvTypeQuality out;
  out.mean_kld = q.mean_kld;
  out.top1 = q.top1;
  out.num_prompts = static_cast<int>(q.positions);
  return out;
}

}  // namespace kvl::cli
