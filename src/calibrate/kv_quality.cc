// MeasureKvQuality: the logits of a text under f32 K/V and under the variant, compared row by row
// (kvl/kv_quality.h).
#include "kvl/kv_quality.h"

#include <algorithm>
#include <memory>

#include "kvl/forward.h"
#include "kvl/kv_manager.h"

namespace kvl {

const std::string_view kKvQualityText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
    "with her dog. One day, she found a shiny red ball under a big tree. She picked it up and ran "
    "to show her mom. Her mom smiled and said that the ball was very pretty, but that it belonged "
    "to the boy who lived next door. Lily felt sad, because she wanted to keep the ball. She "
    "thought about it for a long time. Then she walked to the house next door and knocked. The "
    "boy opened the door, and when he saw the ball his face lit up. He said thank you and asked "
    "Lily if she wanted to play with him. They played in the garden until the sun went down. The "
    "next morning, Tom and his mom went to the market to buy apples. The market was full of "
    "people and noise. Tom saw a man selling balloons of every color, so he asked his mom if he "
    "could have one. She said yes, and Tom chose a blue balloon. On the way home the wind pulled "
    "the balloon out of his hand, and it flew up into the sky. Tom cried, but his mom hugged him "
    "and said that the balloon was going on an adventure. That night Tom looked out of his window "
    "and imagined the balloon flying over the sea, past the old lighthouse, all the way to the "
    "moon. He smiled and fell asleep.";

namespace {

constexpr int64_t kPageTokens = 16;

// The logits rows `rows` selects of one text, [row][vocab], run in page-sized chunks.
StatusOr<std::vector<float>> TextLogits(const Model& model, Forward& forward,
                                        std::span<const int32_t> tokens,
                                        const KvQualityVariant& variant, KvQualityRows rows) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  KvManagerOptions o;
  o.layout = KvBlockLayout{kPageTokens, c.num_layers, c.kv_dim(), 0, variant.type_k, variant.type_v};
  o.budget_bytes = (n / kPageTokens + 1) * o.layout.block_bytes();
  o.max_seqs = 1;
  o.enable_prefix_cache = false;
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvManager> manager, KvManager::Create(o));
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockStorage> storage,
                       KvBlockStorage::Create(o.layout, manager->num_blocks()));
  PagedKvCache cache(*manager, *storage);
  std::vector<float> out;
  std::vector<uint8_t> scratch;
  TokenBatch batch;
  for (int64_t begin = 0; begin < n; begin += kPageTokens) {
    const int64_t end = std::min(n, begin + kPageTokens);
    const KvSeqStep step{0, tokens.subspan(static_cast<size_t>(begin),
                                           static_cast<size_t>(end - begin))};
    const KvPlan plan = manager->Plan(std::span(&step, 1));
    if (!plan.fits) return InternalError("kv quality: a text does not fit its KV pool");
    manager->Commit(plan);
    batch.Clear();
    int64_t logit_rows = 0;
    for (int64_t i = begin; i < end; ++i) {
      const bool want = rows == KvQualityRows::kLast ? i == n - 1 : i >= kPageTokens;
      batch.Add(tokens[static_cast<size_t>(i)], i, 0, want);
      logit_rows += want ? 1 : 0;
    }
    forward.Run(batch, cache);
    for (int64_t r = 0; r < logit_rows; ++r) {
      out.insert(out.end(), forward.logits(r), forward.logits(r) + c.vocab_size);
    }
    // The page just completed is read by every later position as the variant stores it.
    if (variant.page_codec && end % kPageTokens == 0) {
      const BlockId block = manager->block_table(0)[static_cast<size_t>(end / kPageTokens - 1)];
      RoundTripCompressedPage(*storage, block, o.layout, *variant.page_codec, scratch);
    }
  }
  manager->Free(0);
  return out;
}

}  // namespace

StatusOr<std::vector<KvQualityMeasurement>> MeasureKvQuality(const Model& model, ops::OpsContext& ctx,
                                                  std::span<const std::vector<int32_t>> texts,
                                                  std::span<const KvQualityVariant> variants,
                                                  KvQualityRows rows) {
  for (const KvQualityVariant& v : variants) {
    if (v.page_codec && (v.type_k != DType::kF32 || v.type_v != DType::kF32)) {
      return InvalidArgumentError("kv quality: the page codec encodes f32 pages only");
    }
  }
  const int64_t context = model.config().context_length;
  const int64_t vocab = model.config().vocab_size;
  std::vector<std::span<const int32_t>> compared;
  int64_t longest = 1;
  for (const std::vector<int32_t>& text : texts) {
    std::span<const int32_t> tokens(text);
    if (context > 0 && static_cast<int64_t>(tokens.size()) > context) {
      tokens = tokens.first(static_cast<size_t>(context));
    }
    if (tokens.empty() || (rows == KvQualityRows::kAfterFirstPage &&
                           static_cast<int64_t>(tokens.size()) <= kPageTokens)) {
      continue;
    }
    compared.push_back(tokens);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(tokens.size()));
  }
  if (compared.empty()) {
    return InvalidArgumentError(rows == KvQualityRows::kLast
                                    ? "kv quality: no text to compare"
                                    : "kv quality: no text longer than one page to compare");
  }
  // One forward pass for every run: building one packs the weights, which takes longer than a
  // short text runs.
  Forward forward(model, ctx, ForwardOptions{kPageTokens, kPageTokens, longest});
  std::vector<KvQualityMeasurement> out(variants.size());
  for (std::span<const int32_t> tokens : compared) {
    KVL_ASSIGN_OR_RETURN(const std::vector<float> want,
                         TextLogits(model, forward, tokens, KvQualityVariant{}, rows));
    for (size_t i = 0; i < variants.size(); ++i) {
      KVL_ASSIGN_OR_RETURN(const std::vector<float> got,
                           TextLogits(model, forward, tokens, variants[i], rows));
      KvQualityMeasurement& q = out[i];
      for (size_t at = 0; at + static_cast<size_t>(vocab) <= want.size();
           at += static_cast<size_t>(vocab)) {
        const ops::LogitsDivergence d = ops::CompareLogits(&want[at], &got[at], vocab);
        q.mean_kld += d.kld;
        q.top1 += d.same_top1 ? 1 : 0;
        ++q.positions;
      }
    }
  }
  for (KvQualityMeasurement& q : out) {
    q.mean_kld /= static_cast<double>(std::max<int64_t>(1, q.positions));
    q.top1 /= static_cast<double>(std::max<int64_t>(1, q.positions));
  }
  return out;
}

void RoundTripCompressedPage(KvBlockStorage& storage, BlockId block, const KvBlockLayout& layout,
                             KvCodecType codec, std::vector<uint8_t>& scratch) {
  scratch.resize(static_cast<size_t>(CompressedLayerBytes(codec, layout.block_tokens, layout.kv_dim)));
  for (int64_t l = 0; l < layout.num_layers; ++l) {
    float* k = reinterpret_cast<float*>(storage.key_bytes(block, l));
    float* v = reinterpret_cast<float*>(storage.value_bytes(block, l));
    EncodeLayer(codec, k, v, layout.block_tokens, layout.kv_dim, scratch.data());
    DecodeLayer(codec, scratch.data(), layout.block_tokens, layout.kv_dim, k, v);
  }
}

}  // namespace kvl
