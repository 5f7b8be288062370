#include "kvl/forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "forward/forward_harness.h"
#include "kvl/synthetic_model.h"
#include "test_paths.h"

namespace kvl {
namespace {

std::vector<int32_t> TopK(const std::vector<float>& logits, int k) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

TEST(ForwardTest, Stories260KFirstStepMatchesReference) {
  for (ops::Isa isa : ops::RunnableIsas()) {
    Harness h(testing::Stories260KPath(), isa, 2, 16);
    std::vector<std::vector<float>> logits = h.AllLogits({1}, 1);
    ASSERT_EQ(logits.size(), 1u);
    EXPECT_EQ(TopK(logits[0], 5), (std::vector<int32_t>{403, 385, 410, 317, 407}))
        << ops::IsaName(isa);
    EXPECT_NEAR(logits[0][403], 17.0235f, 1e-3f) << ops::IsaName(isa);
  }
}

// Batched prefill and token-by-token decode run the same kernels in the same order per token, so
// the logits agree exactly (the issue asks for 1e-4 relative; we hold ourselves to bit-exact).
void ExpectPrefillEqualsDecode(const std::string& path) {
  for (ops::Isa isa : ops::RunnableIsas()) {
    for (int threads : {1, 2}) {
      Harness h(path, isa, threads, 64);
      const std::vector<int32_t> ids = SomeTokens(40, h.model->config().vocab_size);
      const auto batched = h.AllLogits(ids, 64);
      const auto chunked = h.AllLogits(ids, 7);
      const auto decoded = h.AllLogits(ids, 1);
      ASSERT_EQ(batched.size(), ids.size());
      ASSERT_EQ(decoded.size(), ids.size());
      for (size_t t = 0; t < ids.size(); ++t) {
        for (size_t v = 0; v < batched[t].size(); ++v) {
          ASSERT_EQ(batched[t][v], decoded[t][v])
              << path << " " << ops::IsaName(isa) << " threads " << threads << " pos " << t;
          ASSERT_EQ(chunked[t][v], decoded[t][v]) << path << " pos " << t;
        }
      }
    }
  }
}

TEST(ForwardTest, PrefillEqualsDecodeOnStories260K) {
  ExpectPrefillEqualsDecode(testing::Stories260KPath());
}

TEST(ForwardTest, PrefillEqualsDecodeOnEveryWeightType) {
  for (DType type : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    const std::string path =
        ::testing::TempDir() + "/fwd-tiny-" + std::string(DTypeName(type)) + ".gguf";
    ASSERT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test"), type, 11, path}).ok());
    ExpectPrefillEqualsDecode(path);
  }
}

// Two sequences in one batch give what each gives alone.
TEST(ForwardTest, SequencesInOneBatchDoNotInteract) {
  Harness alone(testing::Stories260KPath(), ops::BestIsa(), 2, 64);
  const std::vector<int32_t> a = SomeTokens(12, 512);
  std::vector<int32_t> b = SomeTokens(9, 512);
  std::reverse(b.begin() + 1, b.end());
  const auto a_alone = alone.AllLogits(a, 64, 0);
  const auto b_alone = alone.AllLogits(b, 64, 1);

  Harness mixed(testing::Stories260KPath(), ops::BestIsa(), 2, 64);
  TokenBatch batch;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size()) batch.Add(a[i], static_cast<int64_t>(i), 0, i + 1 == a.size());
    if (i < b.size()) batch.Add(b[i], static_cast<int64_t>(i), 1, i + 1 == b.size());
  }
  mixed.forward.Run(batch, *mixed.kv);
  ASSERT_EQ(mixed.forward.num_logit_rows(), 2);
  // b ends first in batch order.
  const std::vector<float> b_mixed(mixed.forward.logits(0), mixed.forward.logits(0) + 512);
  const std::vector<float> a_mixed(mixed.forward.logits(1), mixed.forward.logits(1) + 512);
  EXPECT_EQ(a_mixed, a_alone.back());
  EXPECT_EQ(b_mixed, b_alone.back());
}

}  // namespace
}  // namespace kvl
