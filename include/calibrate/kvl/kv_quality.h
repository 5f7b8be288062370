// What a KV representation costs in quality on the loaded model: the KL divergence of its
// next-token distributions against the same model with f32 K/V, run through a real paged cache.
// Two users: `kvl bench` (cache dtypes, the distribution after each prompt of a fixed set) and
// calibration (int8 / int4 pages through the codec, teacher-forced at every position of
// kKvQualityText), so both share this one core.
//
// Thread-safety: uses ctx's pool; one call at a time per pool.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/kv_codec.h"
#include "kvl/kv_manager.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/status.h"

namespace kvl {

// The built-in text calibration measures page quality on: plain narrative English, a few hundred
// tokens for most tokenizers, so that late positions attend over many earlier pages.
extern const std::string_view kKvQualityText;

// Encodes and decodes one f32 page in place, every layer, as the pool's compressed slabs hold it:
// the K/V a compressed page is read back as (calibration and kvl bench quality measure with it).
void RoundTripCompressedPage(KvBlockStorage& storage, BlockId block, const KvBlockLayout& layout,
                             KvCodecType codec, std::vector<uint8_t>& scratch);

// How the K/V under test differ from f32: the cache's row types, and optionally every completed
// page encoded and decoded with the page codec (as a page compressed in the pool is read).
struct KvQualityVariant {
  DType type_k = DType::kF32;
  DType type_v = DType::kF32;
  std::optional<KvCodecType> page_codec;
};

struct KvQualityMeasurement {
  double mean_kld = 0;    // mean KL(f32 || variant) over the compared positions, in nats
  double top1 = 0;        // fraction of compared positions whose most likely token is f32's
  int64_t positions = 0;  // positions compared
};

// Which positions of each text are compared.
enum class KvQualityRows {
  kLast,             // the distribution after the whole text (a prompt's next token)
  kAfterFirstPage,   // teacher-forced: every position from the second page on
};

// Runs each text in page-sized chunks (16 tokens) through a paged cache, once with f32 K/V and
// once per variant, and compares the logits at `rows`: one result per variant. A text longer
// than the model's context is cut to it. f32 against f32 gives 0 and 1 exactly.
// INVALID_ARGUMENT for no text or (kAfterFirstPage) no text longer than one page, and for a page
// codec over a cache that is not f32.
StatusOr<std::vector<KvQualityMeasurement>> MeasureKvQuality(const Model& model, ops::OpsContext& ctx,
                                                  std::span<const std::vector<int32_t>> texts,
                                                  std::span<const KvQualityVariant> variants,
                                                  KvQualityRows rows);

}  // namespace kvl
