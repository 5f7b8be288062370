// A model with its pool, kernels, contiguous KV cache and forward pass, for the forward tests.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kvl/forward.h"

namespace kvl {

// A model plus everything needed to run it, on one ISA and thread count. A test that keeps two
// harnesses busy at once gives each one thread: their pools' workers spin while they wait, and
// two 2-thread pools on a 2-core machine spent 97% of a test waiting for each other (21 s for
// what takes 50 ms).
struct Harness {
  Harness(const std::string& path, ops::Isa isa, int threads, int64_t max_batch,
          bool residuals = false)
      : model(std::move(Model::Load(path).value())),
        pool(threads),
        ops(isa, &pool),
        kv(std::move(ContiguousKvCache::Create(model->config().num_layers,
                                               model->config().kv_dim(), 2, 256,
                                               residuals ? model->config().dim : 0)
                         .value())),
        forward(*model, ops, ForwardOptions{max_batch, max_batch, 256}) {}

  // Logits of every position of `ids` run in chunks of `chunk` tokens, for sequence `seq`.
  std::vector<std::vector<float>> AllLogits(const std::vector<int32_t>& ids, int64_t chunk,
                                            int32_t seq = 0) {
    std::vector<std::vector<float>> out;
    const int64_t vocab = model->config().vocab_size;
    for (size_t begin = 0; begin < ids.size(); begin += static_cast<size_t>(chunk)) {
      const size_t end = std::min(ids.size(), begin + static_cast<size_t>(chunk));
      TokenBatch batch;
      for (size_t i = begin; i < end; ++i) batch.Add(ids[i], static_cast<int64_t>(i), seq, true);
      forward.Run(batch, *kv);
      for (int64_t r = 0; r < forward.num_logit_rows(); ++r) {
        out.emplace_back(forward.logits(r), forward.logits(r) + vocab);
      }
    }
    return out;
  }

  std::unique_ptr<Model> model;
  ThreadPool pool;
  ops::OpsContext ops;
  std::unique_ptr<ContiguousKvCache> kv;
  Forward forward;
};

// A fixed, varied token sequence starting with BOS.
inline std::vector<int32_t> SomeTokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids = {1};
  for (int64_t i = 1; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  return ids;
}

}  // namespace kvl
