// Sampling under an allowed-token mask (a grammar's) is exact: greedy takes the best allowed
// token, no chain ever draws a masked one, and a draw follows the distribution renormalized over
// the allowed tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvl/sampling.h"

namespace kvl {
namespace {

constexpr int32_t kVocab = 1000;

std::vector<uint64_t> MaskOf(const std::vector<int32_t>& allowed) {
  std::vector<uint64_t> words((kVocab + 63) / 64, 0);
  for (int32_t id : allowed) words[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  return words;
}

bool IsSet(const std::vector<uint64_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
}

TEST(SamplerMaskTest, GreedyTakesTheBestAllowedToken) {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(kVocab);
    for (float& x : logits) x = noise(rng);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < kVocab; ++id) {
      if (rng() % 7 == 0) allowed.push_back(id);
    }
    if (allowed.empty()) allowed.push_back(5);
    const std::vector<uint64_t> mask = MaskOf(allowed);
    int32_t best = allowed[0];
    for (int32_t id : allowed) {
      if (logits[id] > logits[best]) best = id;
    }
    for (float penalty : {1.0f, 1.3f}) {
      SamplingParams p;
      p.temperature = 0.0f;
      p.repeat_penalty = penalty;
      Sampler sampler(p, kVocab);
      const std::vector<int32_t> history = {1, 2, 3};
      const int32_t got = sampler.Sample(logits.data(), history, mask.data());
      if (penalty == 1.0f) {
        EXPECT_EQ(got, best);
      }
      EXPECT_TRUE(IsSet(mask, got));
    }
    // The unmasked best is usually not allowed: the mask changed the answer.
    if (trial == 0) {
      EXPECT_NE(Sampler::Argmax(logits.data(), kVocab), best);
    }
  }
}

TEST(SamplerMaskTest, NoChainDrawsAMaskedTokenAndDrawsFollowTheRenormalizedDistribution) {
  // Four allowed tokens, deliberately not among the most likely, with known relative weights.
  std::vector<float> logits(kVocab, 0.0f);
  for (int32_t id = 0; id < 50; ++id) logits[id] = 10.0f;  // the masked favourites
  const std::vector<int32_t> allowed = {100, 200, 300, 400};
  const float allowed_logits[] = {1.0f, 2.0f, 0.0f, 1.5f};
  for (size_t i = 0; i < allowed.size(); ++i) logits[allowed[i]] = allowed_logits[i];
  const std::vector<uint64_t> mask = MaskOf(allowed);
  double z = 0;
  for (float l : allowed_logits) z += std::exp(l);

  struct Chain {
    int32_t top_k;
    float top_p, min_p;
  };
  for (const Chain& c : {Chain{0, 1.0f, 0.0f}, Chain{40, 1.0f, 0.0f}, Chain{2, 1.0f, 0.0f},
                         Chain{0, 0.9f, 0.0f}, Chain{0, 1.0f, 0.05f}}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 11;
    Sampler sampler(p, kVocab);
    std::vector<int> counts(kVocab, 0);
    const int draws = 20000;
    const std::vector<int32_t> history;
    for (int i = 0; i < draws; ++i) ++counts[sampler.Sample(logits.data(), history, mask.data())];
    for (int32_t id = 0; id < kVocab; ++id) {
      if (!IsSet(mask, id)) {
        ASSERT_EQ(counts[id], 0) << "masked token " << id << " drawn";
      }
    }
    if (c.top_k == 0 && c.top_p == 1.0f && c.min_p == 0.0f) {
      // Plain temperature 1: each allowed token at exp(l) / z, within 5 standard deviations.
      for (size_t i = 0; i < allowed.size(); ++i) {
        const double p_expected = std::exp(allowed_logits[i]) / z;
        const double sd = std::sqrt(draws * p_expected * (1 - p_expected));
        EXPECT_NEAR(counts[allowed[i]], draws * p_expected, 5 * sd) << "token " << allowed[i];
      }
    }
    if (c.top_k == 2) {
      // Top-k applies after the mask: the two best allowed tokens, not the two best overall.
      EXPECT_GT(counts[200], 0);
      EXPECT_GT(counts[400], 0);
      EXPECT_EQ(counts[100] + counts[300], 0);
    }
  }
}

}  // namespace
}  // namespace kvl
