#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "kvl/sampling.h"

namespace kvl {
namespace {

SamplingParams FiltersOff(float temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.seed = seed;
  return p;
}

// Deterministic pseudo-random logits in [-5, 5).
std::vector<float> RandomLogits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-5.0f, 5.0f);
  std::vector<float> logits(static_cast<size_t>(n));
  for (float& l : logits) l = dist(rng);
  return logits;
}

std::vector<double> Softmax(const std::vector<float>& logits, float temperature = 1.0f) {
  double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - max) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams().Validate().ok()); }

TEST(SamplingParamsTest, RejectsOutOfRangeNamingTheField) {
  struct Case {
    SamplingParams params;
    const char* field;
  };
  std::vector<Case> cases;
  SamplingParams p;
  p.temperature = -0.1f;
  cases.push_back({p, "temperature"});
  p = SamplingParams();
  p.temperature = NAN;
  cases.push_back({p, "temperature"});
  p = SamplingParams();
  p.top_p = 0.0f;
  cases.push_back({p, "top_p"});
  p = SamplingParams();
  p.top_p = 1.5f;
  cases.push_back({p, "top_p"});
  p = SamplingParams();
  p.min_p = -0.01f;
  cases.push_back({p, "min_p"});
  p = SamplingParams();
  p.min_p = 1.01f;
  cases.push_back({p, "min_p"});
  p = SamplingParams();
  p.repeat_penalty = 0.0f;
  cases.push_back({p, "repeat_penalty"});
  p = SamplingParams();
  p.repeat_last_n = -2;
  cases.push_back({p, "repeat_last_n"});
  for (const Case& c : cases) {
    Status s = c.params.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
  }
  p = SamplingParams();
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.temperature = 0.0f;
  EXPECT_TRUE(p.Validate().ok());
}

// OpenAI's logit_bias: added to the logit before every filter, greedy included; -100 bans a
// token in practice, +100 forces it; ids and biases out of range are refused by name.
TEST(SamplerTest, LogitBiasShiftsGreedyAndSampledChoices) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sampler(greedy, 4).Sample(logits.data(), {}), 1);
  greedy.logit_bias = {{2, 1.5f}};  // 2 + 1.5 > 3
  EXPECT_EQ(Sampler(greedy, 4).Sample(logits.data(), {}), 2);
  greedy.logit_bias = {{2, 0.5f}};  // 2 + 0.5 < 3: still token 1
  EXPECT_EQ(Sampler(greedy, 4).Sample(logits.data(), {}), 1);
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  sampled.top_k = 0;
  sampled.top_p = 1.0f;
  sampled.min_p = 0.0f;
  sampled.seed = 7;
  sampled.logit_bias = {{1, -100.0f}, {3, 100.0f}};
  Sampler s(sampled, 4);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(logits.data(), {}), 3);
  sampled.logit_bias = {{1, 101.0f}};
  EXPECT_NE(sampled.Validate().message().find("logit_bias"), std::string::npos);
  sampled.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(sampled.Validate().ok());
}

TEST(SamplerTest, ArgmaxTakesLowestIndexOnTies) {
  std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f};
  EXPECT_EQ(Sampler::Argmax(logits.data(), 4), 1);
}

TEST(SamplerTest, GreedyEqualsArgmax) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = RandomLogits(1000, seed);
    SamplingParams p;
    p.temperature = 0.0f;
    Sampler sampler(p, 1000);
    EXPECT_EQ(sampler.Sample(logits.data(), {}), Sampler::Argmax(logits.data(), 1000));
  }
}

TEST(SamplerTest, TopK1EqualsGreedyAtAnyTemperature) {
  for (float temperature : {0.1f, 1.0f, 5.0f, 100.0f}) {
    SamplingParams p = FiltersOff(temperature, 7);
    p.top_k = 1;
    Sampler sampler(p, 500);
    for (uint32_t seed = 0; seed < 20; ++seed) {
      std::vector<float> logits = RandomLogits(500, seed);
      EXPECT_EQ(sampler.Sample(logits.data(), {}), Sampler::Argmax(logits.data(), 500));
    }
  }
}

std::vector<int32_t> SampleSequence(const SamplingParams& p, int steps) {
  std::vector<float> logits = RandomLogits(300, 99);
  Sampler sampler(p, 300);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) out.push_back(sampler.Sample(logits.data(), out));
  return out;
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedsDiffer) {
  SamplingParams p = FiltersOff(1.5f, 1234);
  std::vector<int32_t> a = SampleSequence(p, 100);
  EXPECT_EQ(a, SampleSequence(p, 100));
  p.seed = 1235;
  EXPECT_NE(a, SampleSequence(p, 100));
  // The default filters and a penalty are deterministic too.
  SamplingParams d;
  d.seed = 42;
  d.repeat_penalty = 1.3f;
  EXPECT_EQ(SampleSequence(d, 100), SampleSequence(d, 100));
}

// With all filters off at temperature T, draw frequencies match softmax(logits / T).
void ExpectFrequenciesMatchSoftmax(float temperature) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  const std::vector<double> expected = Softmax(logits, temperature);
  Sampler sampler(FiltersOff(temperature, 2024), static_cast<int32_t>(logits.size()));
  const int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(sampler.Sample(logits.data(), {}))];
  for (size_t i = 0; i < logits.size(); ++i) {
    const double sigma = std::sqrt(kDraws * expected[i] * (1 - expected[i]));
    EXPECT_NEAR(counts[i], kDraws * expected[i], 4.5 * sigma + 1) << "token " << i;
  }
}

TEST(SamplerTest, FrequenciesMatchSoftmaxAtTemperatureOne) { ExpectFrequenciesMatchSoftmax(1.0f); }
TEST(SamplerTest, FrequenciesMatchSoftmaxAtTemperatureTwo) { ExpectFrequenciesMatchSoftmax(2.0f); }

// Logits 0..n-1 with ids shuffled so the order of the array says nothing.
std::vector<float> ShuffledRamp(int n, uint32_t seed) {
  std::vector<float> logits(static_cast<size_t>(n));
  std::iota(logits.begin(), logits.end(), 0.0f);
  std::mt19937 rng(seed);
  std::shuffle(logits.begin(), logits.end(), rng);
  return logits;
}

std::set<int32_t> Draws(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler sampler(p, static_cast<int32_t>(logits.size()));
  std::set<int32_t> seen;
  for (int i = 0; i < n; ++i) seen.insert(sampler.Sample(logits.data(), {}));
  return seen;
}

TEST(SamplerTest, TopKNeverReturnsFilteredTokens) {
  // Scale 0.01 keeps the ramp nearly flat so every surviving token gets drawn.
  std::vector<float> logits = ShuffledRamp(5000, 1);
  for (float& l : logits) l *= 0.001f;
  SamplingParams p = FiltersOff(1.0f, 5);
  p.top_k = 10;
  std::set<int32_t> seen = Draws(p, logits, 3000);
  EXPECT_EQ(seen.size(), 10u);  // all ten survivors appear
  for (int32_t id : seen) EXPECT_GE(logits[static_cast<size_t>(id)], 4990 * 0.001f - 1e-4f);
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingTheMass) {
  // Probabilities 0.5, 0.25, 0.125, ... (logits k*ln2 down): top_p = 0.8 needs 0.5+0.25+0.125.
  std::vector<float> logits(20);
  for (int i = 0; i < 20; ++i) logits[static_cast<size_t>(i)] = -static_cast<float>(i) * std::log(2.0f);
  std::reverse(logits.begin(), logits.end());  // the best token is the last id
  SamplingParams p = FiltersOff(1.0f, 9);
  p.top_p = 0.8f;
  EXPECT_EQ(Draws(p, logits, 3000), (std::set<int32_t>{19, 18, 17}));
  // A tiny top_p still keeps one token.
  p.top_p = 1e-6f;
  EXPECT_EQ(Draws(p, logits, 100), (std::set<int32_t>{19}));
}

TEST(SamplerTest, TopPOnLargeFlatVocabularyGrowsItsProbe) {
  // A flat distribution over 100k tokens: top_p = 0.5 must keep about half of them, far more
  // than the first probe, and never a token below the cut.
  std::vector<float> logits = ShuffledRamp(100000, 3);
  for (float& l : logits) l *= 1e-7f;
  SamplingParams p = FiltersOff(1.0f, 11);
  p.top_p = 0.5f;
  std::set<int32_t> seen = Draws(p, logits, 100);
  float lowest = 1e9f;
  for (int32_t id : seen) lowest = std::min(lowest, logits[static_cast<size_t>(id)]);
  EXPECT_GE(lowest, 49000 * 1e-7f);
  EXPECT_GT(seen.size(), 90u);  // draws spread over ~50k tokens
}

TEST(SamplerTest, MinPKeepsTokensAboveFractionOfTheBest) {
  // p_i / p_max = exp(l_i - l_max); min_p = 0.3 keeps l_i >= l_max + ln 0.3 = l_max - 1.204.
  std::vector<float> logits = {0.0f, -1.0f, -1.2f, -1.21f, -3.0f, -0.5f, -10.0f};
  SamplingParams p = FiltersOff(1.0f, 13);
  p.min_p = 0.3f;
  EXPECT_EQ(Draws(p, logits, 3000), (std::set<int32_t>{0, 1, 2, 5}));
  // The same with top-k on (the sorted path).
  p.top_k = 6;
  EXPECT_EQ(Draws(p, logits, 3000), (std::set<int32_t>{0, 1, 2, 5}));
}

TEST(SamplerTest, FiltersCompose) {
  std::vector<float> logits = ShuffledRamp(1000, 4);
  for (float& l : logits) l *= 0.05f;
  SamplingParams p = FiltersOff(0.7f, 17);
  p.top_k = 200;
  p.top_p = 0.9f;
  p.min_p = 0.1f;
  // min_p 0.1 keeps logits >= max + ln 0.1 = 49.95 - 2.30: ramp values >= 953.
  std::set<int32_t> seen = Draws(p, logits, 5000);
  for (int32_t id : seen) EXPECT_GE(logits[static_cast<size_t>(id)], 953 * 0.05f - 1e-3f);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  // Token 0 (positive) and token 2 (negative) are repeated. Penalty 2: logit 1 -> 0.5 and
  // -1 -> -2; token 1 (logit 0.5) is untouched. Greedy makes the effect exact and visible.
  std::vector<float> logits = {1.0f, 0.75f, -1.0f, -1.5f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.repeat_penalty = 2.0f;
  Sampler sampler(p, 4);
  EXPECT_EQ(sampler.Sample(logits.data(), {}), 0);
  EXPECT_EQ(sampler.Sample(logits.data(), {0, 0, 0}), 1);  // once, not three times: 0.5 < 0.75
  std::vector<float> negatives = {-1.0f, -1.5f, -2.5f};
  Sampler neg(p, 3);
  EXPECT_EQ(neg.Sample(negatives.data(), {0}), 1);  // -1 * 2 = -2 < -1.5
  // Applied once per distinct token: -1 * 2 = -2 > -2.5, so token 0 still beats token 2.
  std::vector<int32_t> twice = {0, 0, 1, 1};
  EXPECT_EQ(neg.Sample(negatives.data(), twice), 0);
  // Tokens outside the window are not penalized.
  SamplingParams windowed = p;
  windowed.repeat_last_n = 2;
  Sampler w(windowed, 4);
  EXPECT_EQ(w.Sample(logits.data(), {0, 3, 3}), 0);
  EXPECT_EQ(w.Sample(logits.data(), {3, 0, 3}), 1);
  // The logits are not modified.
  EXPECT_EQ(logits[0], 1.0f);
}

TEST(SamplerTest, RepetitionPenaltyLowersProbabilityByTheSpecifiedFactor) {
  // Two tokens, logits 2 and 0, penalty 2 on token 0: its logit becomes 1, so
  // P(0) = e^1 / (e^1 + 1) instead of e^2 / (e^2 + 1).
  std::vector<float> logits = {2.0f, 0.0f};
  SamplingParams p = FiltersOff(1.0f, 21);
  p.repeat_penalty = 2.0f;
  Sampler sampler(p, 2);
  const int kDraws = 20000;
  int zeros = 0;
  std::vector<int32_t> history = {0};
  for (int i = 0; i < kDraws; ++i) zeros += sampler.Sample(logits.data(), history) == 0;
  const double expected = std::exp(1.0) / (std::exp(1.0) + 1.0);
  const double sigma = std::sqrt(kDraws * expected * (1 - expected));
  EXPECT_NEAR(zeros, kDraws * expected, 4.5 * sigma);
}

TEST(SamplerTest, PenaltyAppliesBeforeTopK) {
  // Token 3 is the best until penalized (4 / 4 = 1), which drops it out of the top 2.
  std::vector<float> logits = {3.0f, 0.0f, 2.9f, 4.0f, -1.0f};
  SamplingParams p = FiltersOff(1.0f, 8);
  p.top_k = 2;
  p.repeat_penalty = 4.0f;
  Sampler sampler(p, 5);
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) seen.insert(sampler.Sample(logits.data(), {3, 3, 1}));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 2}));
  // Without history the penalty is gone again (the flags are per call).
  seen.clear();
  for (int i = 0; i < 500; ++i) seen.insert(sampler.Sample(logits.data(), {}));
  EXPECT_EQ(seen, (std::set<int32_t>{3, 0}));
}

TEST(SamplerTest, TopKMatchesAFullSortOnLargeVocabularies) {
  // The one-pass heap selection keeps exactly the k best of a large vocab: at a high temperature
  // the k survivors are drawn near-uniformly, so all of them, and nothing else, show up.
  std::vector<float> logits = RandomLogits(50000, 5);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  SamplingParams p = FiltersOff(100.0f, 6);
  p.top_k = 5;
  EXPECT_EQ(Draws(p, logits, 1000), std::set<int32_t>(order.begin(), order.begin() + 5));
}

TEST(SamplerTest, NegativeInfinityLogitsAreNeverDrawn) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {-inf, 0.0f, -inf, 0.1f};
  EXPECT_EQ(Draws(FiltersOff(1.0f, 3), logits, 500), (std::set<int32_t>{1, 3}));
  SamplingParams p = FiltersOff(1.0f, 3);
  p.top_p = 0.5f;
  p.min_p = 0.05f;
  std::set<int32_t> seen = Draws(p, logits, 500);
  EXPECT_TRUE(seen.count(0) == 0 && seen.count(2) == 0);
}

}  // namespace
}  // namespace kvl
