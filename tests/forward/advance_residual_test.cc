// Partial-depth checkpoints rest on one property: running a layer again for a page's tokens, as a
// batch of their own, gives each token exactly the next layer's input the forward pass computed
// for it, whatever chunks it was first computed in (prefill chunks of any size, decode steps).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "forward/forward_harness.h"
#include "kvl/ops.h"
#include "kvl/synthetic_model.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr int64_t kPrefillTokens = 20;  // in chunks of 7
constexpr int64_t kTokens = 48;         // the rest one decode step at a time
constexpr int64_t kPageFirst = 16;      // the page run again: positions [16, 32)
constexpr int64_t kPageTokens = 16;

// Runs layer `run` for the page's tokens from the checkpoint of layer `layer` and counts the
// tokens whose result differs in any bit from the checkpoint of layer `layer` + 1 Run stored.
int64_t DifferingAdvances(Harness& h, int64_t layer, int64_t run) {
  const ModelConfig& c = h.model->config();
  const size_t row = static_cast<size_t>(c.dim);
  std::vector<float> residual(static_cast<size_t>(kPageTokens) * row);
  std::vector<int64_t> positions;
  std::vector<int32_t> seqs(static_cast<size_t>(kPageTokens), 0);
  for (int64_t t = 0; t < kPageTokens; ++t) {
    positions.push_back(kPageFirst + t);
    std::memcpy(&residual[static_cast<size_t>(t) * row], h.kv->ResidualAt(0, layer, kPageFirst + t),
                row * sizeof(float));
  }
  h.forward.AdvanceResidual(run, residual.data(), seqs.data(), positions.data(), kPageTokens, *h.kv);
  int64_t differing = 0;
  for (int64_t t = 0; t < kPageTokens; ++t) {
    differing += std::memcmp(&residual[static_cast<size_t>(t) * row],
                             h.kv->ResidualAt(0, layer + 1, kPageFirst + t), row * sizeof(float)) != 0;
  }
  return differing;
}

TEST(AdvanceResidualTest, RunningALayerAgainForAPageIsBitIdentical) {
  std::vector<std::string> paths = {testing::Stories260KPath()};
  // A q8_0 model too: its matmuls quantize the activations per row (the int8 GEMM path).
  const std::string q8 = ::testing::TempDir() + "/advance-residual-" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test"), DType::kQ8_0, 3, q8}).ok());
  paths.push_back(q8);
  for (const std::string& path : paths) {
    for (ops::Isa isa : ops::RunnableIsas()) {
      Harness h(path, isa, 2, 64, /*residuals=*/true);
      const ModelConfig& c = h.model->config();
      const std::vector<int32_t> ids = SomeTokens(kTokens, c.vocab_size);
      const std::vector<int32_t> prefill(ids.begin(), ids.begin() + kPrefillTokens);
      h.AllLogits(prefill, 7);
      for (int64_t p = kPrefillTokens; p < kTokens; ++p) {
        TokenBatch step;
        step.Add(ids[static_cast<size_t>(p)], p, 0, true);
        h.forward.Run(step, *h.kv);
      }
      for (int64_t l = 0; l + 1 < c.num_layers; ++l) {
        EXPECT_EQ(DifferingAdvances(h, l, l), 0) << path << " " << ops::IsaName(isa) << " layer " << l;
      }
    }
  }
  std::remove(q8.c_str());
}

// The check above can fail: a page run one layer past the one its input belongs to is not the
// next layer's input.
TEST(AdvanceResidualTest, TheWrongLayerIsCaught) {
  Harness h(testing::Stories260KPath(), ops::BestIsa(), 2, 64, /*residuals=*/true);
  const std::vector<int32_t> ids = SomeTokens(kTokens, h.model->config().vocab_size);
  h.AllLogits(ids, 16);
  EXPECT_EQ(DifferingAdvances(h, 0, /*run=*/1), kPageTokens);
}

}  // namespace
}  // namespace kvl
