// What each KV cache type and compress choice costs in quality on the loaded model, measured as
// llama-perplexity --kl-divergence does: teacher-forced over a text in chunks of a context's
// length, every position of each chunk's second half compared with an f16 cache's next-token
// distribution (mean and 99th-percentile KL divergence, top-1 agreement), and the relative RMS
// error of the attention logits q.k the representation's keys give (`kvl bench quality`).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/kv_codec.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/status.h"

namespace kvl::cli {

// One way of holding K and V: the cache's row types, or (page_codec) an f32 cache whose every
// completed 16-token page is encoded and decoded by the lattice's page codec, as a page the
// compress action took is read.
struct KvRepresentation {
  std::string name;  // "q4_0r", "compress int4", ...
  DType type_k = DType::kF32;
  DType type_v = DType::kF32;
  std::optional<KvCodecType> page_codec;
};

// Bits one K or V value takes as held, averaged over K and V (q8_0: 8.5, q4_0: 4.5; a compressed
// page: its codes, scales and minimums over its values).
double BitsPerValue(const KvRepresentation& r, int64_t kv_dim);

// The representations the bench measures for a model: f32, q8_0, q4_0, the rotated q8_0r, q4_0r
// and q8_0r K / q4_0r V where head_dim allows a rotation (kvl/forward.h CheckKvCacheTypes), and
// the codec's int8 / int4 pages. `skipped` gets a line per representation left out, and why.
std::vector<KvRepresentation> QualityRepresentations(const ModelConfig& c,
                                                     std::vector<std::string>* skipped);

struct KvQualityFigures {
  double kld_mean = 0;  // nats, against the f16 cache
  double kld_p99 = 0;   // 99th percentile of the per-position KLD
  double top1 = 0;      // fraction of positions whose argmax is the f16 cache's
  double qk_error = 0;  // relative RMS error of q.k against f32 keys (sum of squared errors over
                        // sum of squares, square-rooted), on the first chunk
  int64_t positions = 0;
};

struct KvQualityRun {
  int64_t ctx = 0;         // tokens per chunk
  int64_t chunks = 0;      // chunks of the text measured
  int64_t positions = 0;   // positions compared per representation
  std::vector<KvQualityFigures> figures;  // [representation]
};

// Measures every representation at a context of `ctx` tokens over the first `max_chunks` chunks
// of `tokens` (0: every whole chunk; a text shorter than ctx is one chunk of its own length),
// each chunk's first token replaced by `bos` (-1: kept).
// INVALID_ARGUMENT when the text has fewer than 32 tokens.
StatusOr<KvQualityRun> MeasureKvRepresentations(const Model& model, ops::OpsContext& ctx,
                                                std::span<const int32_t> tokens, int64_t ctx_tokens,
                                                int64_t max_chunks, int32_t bos,
                                                std::span<const KvRepresentation> reps);

}  // namespace kvl::cli
