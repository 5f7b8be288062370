// The three checks of the "KV direct" experiment: K and V are exactly recoverable from the
// residual stream (the input of each layer), so a KV page can be dropped and rebuilt losslessly.
#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <cstring>

#include <unistd.h>

#include "forward/forward_harness.h"
#include "kvl/ops.h"
#include "kvl/synthetic_model.h"
#include "test_paths.h"

namespace kvl {
namespace {

int32_t Argmax(const float* logits, int32_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// Greedy continuation of `prompt` for n tokens. Before every step after the prompt, when
// `no_persistent_kv`, all K and V of the sequence are wiped and rebuilt from the checkpoints.
std::vector<int32_t> Greedy(Harness& h, const std::vector<int32_t>& prompt, int n,
                            bool no_persistent_kv) {
  const int32_t vocab = static_cast<int32_t>(h.model->config().vocab_size);
  std::vector<int32_t> tokens = prompt;
  std::vector<int32_t> out;
  int32_t next = Argmax(h.AllLogits(prompt, 64).back().data(), vocab);
  for (int step = 0; step < n; ++step) {
    out.push_back(next);
    tokens.push_back(next);
    const int64_t pos = static_cast<int64_t>(tokens.size()) - 1;
    if (no_persistent_kv) {
      h.kv->ClearKv(0);
      for (int64_t begin = 0; begin < pos; begin += 64) {
        TokenBatch chunk;
        for (int64_t p = begin; p < std::min(pos, begin + 64); ++p) chunk.Add(0, p, 0, false);
        h.forward.RebuildKvFromResiduals(chunk, *h.kv);
      }
    }
    TokenBatch batch;
    batch.Add(next, pos, 0, true);
    h.forward.Run(batch, *h.kv);
    next = Argmax(h.forward.logits(0), vocab);
  }
  return out;
}

// stories260K and synthetic models of three weight types, written for the test and removed
// after it.
class ModelsUnderTest {
 public:
  ModelsUnderTest() {
    paths_.push_back(testing::Stories260KPath());
    for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kF16}) {
      const std::string path =
          ::testing::TempDir() + "/kvdirect-" + std::to_string(getpid()) + "-" +
          std::string(DTypeName(type)) + ".gguf";  // ctest runs these tests in parallel processes
      EXPECT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test"), type, 3, path}).ok());
      paths_.push_back(path);
    }
  }
  ~ModelsUnderTest() {
    for (size_t i = 1; i < paths_.size(); ++i) std::remove(paths_[i].c_str());
  }
  std::vector<std::string>::const_iterator begin() const { return paths_.begin(); }
  std::vector<std::string>::const_iterator end() const { return paths_.end(); }

 private:
  std::vector<std::string> paths_;
};

// Check 1: rebuilt K and V equal the stored ones on every layer, difference exactly zero.
TEST(KvDirectTest, KvRebuiltFromResidualsIsBitIdentical) {
  const ModelsUnderTest models;
  for (const std::string& path : models) {
    for (ops::Isa isa : ops::RunnableIsas()) {
      Harness h(path, isa, 2, 64, /*residuals=*/true);
      const ModelConfig& c = h.model->config();
      const std::vector<int32_t> ids = SomeTokens(50, c.vocab_size);
      h.AllLogits(ids, 13);  // prefill in uneven chunks

      std::vector<float> k_before, v_before;
      for (int64_t l = 0; l < c.num_layers; ++l) {
        for (int64_t p = 0; p < 50; ++p) {
          KvCache::Rows r = h.kv->RowsAt(0, l, p);
          k_before.insert(k_before.end(), r.k, r.k + c.kv_dim());
          v_before.insert(v_before.end(), r.v, r.v + c.kv_dim());
        }
      }
      h.kv->ClearKv(0);
      TokenBatch batch;
      for (int64_t p = 0; p < 50; ++p) batch.Add(0, p, 0, false);
      h.forward.RebuildKvFromResiduals(batch, *h.kv);

      size_t i = 0;
      int64_t differing = 0;
      for (int64_t l = 0; l < c.num_layers; ++l) {
        for (int64_t p = 0; p < 50; ++p, i += static_cast<size_t>(c.kv_dim())) {
          KvCache::Rows r = h.kv->RowsAt(0, l, p);
          const size_t bytes = sizeof(float) * static_cast<size_t>(c.kv_dim());
          differing += std::memcmp(r.k, &k_before[i], bytes) != 0;
          differing += std::memcmp(r.v, &v_before[i], bytes) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << path << " " << ops::IsaName(isa);
    }
  }
}

// Check 2: with no persistent KV (everything rebuilt from checkpoints before every step), greedy
// decoding gives the keep-all tokens.
TEST(KvDirectTest, NoPersistentKvMatchesKeepAllForSixtyTokens) {
  const ModelsUnderTest models;
  for (const std::string& path : models) {
    Harness keep(path, ops::BestIsa(), 1, 64, true);  // one thread each: see Harness
    Harness rebuild(path, ops::BestIsa(), 1, 64, true);
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
    const std::vector<int32_t> expected = Greedy(keep, prompt, 60, false);
    EXPECT_EQ(Greedy(rebuild, prompt, 60, true), expected) << path;
  }
}

// Check 3: residual checkpoints computed earlier (here: in another cache) and used later to
// precompute the KV give the same continuation as keeping the KV.
TEST(KvDirectTest, ResidualPrecomputedKvReusedLaterMatchesKeepAll) {
  // One thread each: see Harness.
  Harness first(testing::Stories260KPath(), ops::BestIsa(), 1, 64, true);
  const std::vector<int32_t> prompt = SomeTokens(30, 512);
  const std::vector<int32_t> expected = Greedy(first, prompt, 40, false);

  Harness later(testing::Stories260KPath(), ops::BestIsa(), 1, 64, true);
  const ModelConfig& c = later.model->config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t p = 0; p < 30; ++p) {
      std::memcpy(later.kv->ResidualAt(0, l, p), first.kv->ResidualAt(0, l, p),
                  sizeof(float) * static_cast<size_t>(c.dim));
    }
  }
  TokenBatch batch;
  for (int64_t p = 0; p < 29; ++p) batch.Add(0, p, 0, false);
  later.forward.RebuildKvFromResiduals(batch, *later.kv);
  // Only the last prompt token runs through the model; everything before it came from checkpoints.
  TokenBatch last;
  last.Add(prompt.back(), 29, 0, true);
  later.forward.Run(last, *later.kv);
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  std::vector<int32_t> out;
  int32_t next = Argmax(later.forward.logits(0), vocab);
  for (int step = 0; step < 40; ++step) {
    out.push_back(next);
    TokenBatch b;
    b.Add(next, 30 + step, 0, true);
    later.forward.Run(b, *later.kv);
    next = Argmax(later.forward.logits(0), vocab);
  }
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace kvl
