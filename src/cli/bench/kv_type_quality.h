// What a KV cache type costs in quality on the loaded model (kvl bench's kld column, as
// llama-bench's -ctk shows speed): the next-token distribution after each prompt of a fixed set,
// with the cache at (type_k, type_v), against the same with an f32 cache. The measuring core is
// calibration's (kvl/kv_quality.h); this file holds the prompts.
#pragma once

#include "kvl/dtype.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/status.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {

struct KvTypeQuality {
  double mean_kld = 0;  // mean over the prompts of KL(f32 || this type), in nats
  double top1 = 0;      // fraction of prompts whose most likely next token is f32's
  int num_prompts = 0;
};

// Runs every prompt of the fixed set through a paged cache of each type (prefill, one sequence at
// a time, on `isa` with `threads` threads). f32 / f32 gives 0 and 1 exactly.
StatusOr<KvTypeQuality> MeasureKvTypeQuality(const Model& model, const Tokenizer& tokenizer,
                                             ops::Isa isa, int threads, DType type_k,
                                             DType type_v);

}  // namespace kvl::cli
