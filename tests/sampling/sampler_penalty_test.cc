// The frequency and presence penalties (OpenAI's definition, llama.cpp's order and window), with
// the logits they must give worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kvl/sampling.h"

namespace kvl {
namespace {

// Six tokens; the prompt is [4, 4] and the generated tokens [0, 0, 2, 0, 3], so among the
// generated tokens 0 occurs 3 times, 2 and 3 once, and 4 only in the prompt.
const std::vector<float> kLogits = {1.0f, 2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
const std::vector<int32_t> kHistory = {4, 4, 0, 0, 2, 0, 3};
constexpr size_t kPromptTokens = 2;

SamplingParams Penalties(float frequency, float presence) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repeat_penalty = 1.0f;
  p.frequency_penalty = frequency;
  p.presence_penalty = presence;
  return p;
}

std::vector<float> Penalized(const SamplingParams& params, const std::vector<float>& logits,
                             const std::vector<int32_t>& history, size_t prompt_tokens) {
  Sampler sampler(params, static_cast<int32_t>(logits.size()), prompt_tokens);
  std::vector<float> out(logits.size());
  sampler.PenalizedLogits(logits.data(), history, out.data());
  return out;
}

void ExpectLogits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "token " << i;
}

TEST(SamplerPenaltyTest, FrequencyAndPresenceCountOnlyTheGeneratedTokens) {
  // logit - count * 0.5 - (count > 0) * 0.25; token 4 (prompt only) untouched.
  ExpectLogits(Penalized(Penalties(0.5f, 0.25f), kLogits, kHistory, kPromptTokens),
               {1.0f - 1.5f - 0.25f, 2.0f, -1.0f - 0.5f - 0.25f, 0.5f - 0.5f - 0.25f, 3.0f,
                -2.0f});
}

TEST(SamplerPenaltyTest, FrequencyAloneScalesWithTheCountPresenceAloneDoesNot) {
  ExpectLogits(Penalized(Penalties(0.5f, 0.0f), kLogits, kHistory, kPromptTokens),
               {-0.5f, 2.0f, -1.5f, 0.0f, 3.0f, -2.0f});
  ExpectLogits(Penalized(Penalties(0.0f, 0.25f), kLogits, kHistory, kPromptTokens),
               {0.75f, 2.0f, -1.25f, 0.25f, 3.0f, -2.0f});
}

TEST(SamplerPenaltyTest, NegativePenaltiesRaiseRepeatedTokens) {
  ExpectLogits(Penalized(Penalties(-1.0f, -2.0f), kLogits, kHistory, kPromptTokens),
               {1.0f + 3.0f + 2.0f, 2.0f, -1.0f + 1.0f + 2.0f, 0.5f + 1.0f + 2.0f, 3.0f, -2.0f});
}

TEST(SamplerPenaltyTest, WithoutAPromptLengthEveryTokenCounts) {
  // prompt_tokens 0: token 4 counts twice.
  ExpectLogits(Penalized(Penalties(0.5f, 0.0f), kLogits, kHistory, 0),
               {-0.5f, 2.0f, -1.5f, 0.0f, 3.0f - 1.0f, -2.0f});
}

TEST(SamplerPenaltyTest, LlamaCppScopeCountsTheRepeatWindowAfterTheRepetitionPenalty) {
  // llama.cpp's penalty sampler: the last repeat_last_n = 4 tokens [0, 2, 0, 3] (prompt or
  // not), each divided (positive) or multiplied (negative) by repeat_penalty 2 first, then
  // count * 0.5 + 0.25 subtracted. Token 4 is outside the window.
  SamplingParams p = Penalties(0.5f, 0.25f);
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 4;
  p.penalty_scope = SamplingParams::PenaltyScope::kRepeatWindow;
  ExpectLogits(Penalized(p, kLogits, kHistory, kPromptTokens),
               {1.0f / 2 - 2 * 0.5f - 0.25f, 2.0f, -1.0f * 2 - 0.5f - 0.25f,
                0.5f / 2 - 0.5f - 0.25f, 3.0f, -2.0f});
  // A window reaching into the prompt counts the prompt's tokens too.
  p.repeat_last_n = -1;
  ExpectLogits(Penalized(p, kLogits, kHistory, kPromptTokens),
               {1.0f / 2 - 1.5f - 0.25f, 2.0f, -2.0f - 0.75f, 0.25f - 0.75f,
                3.0f / 2 - 1.0f - 0.25f, -2.0f});
  // repeat_last_n 0 turns the window, and so these penalties, off.
  p.repeat_last_n = 0;
  ExpectLogits(Penalized(p, kLogits, kHistory, kPromptTokens), kLogits);
}

TEST(SamplerPenaltyTest, RepetitionPenaltyWindowAndGeneratedCountsAreIndependent) {
  // OpenAI's scope with a repetition penalty over the last 2 tokens [0, 3]: the repetition
  // penalty touches 0 and 3, the frequency penalty 0, 2 and 3.
  SamplingParams p = Penalties(1.0f, 0.0f);
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 2;
  ExpectLogits(Penalized(p, kLogits, kHistory, kPromptTokens),
               {0.5f - 3.0f, 2.0f, -2.0f, 0.25f - 1.0f, 3.0f, -2.0f});
}

TEST(SamplerPenaltyTest, LogitBiasComesBeforeThePenalties) {
  SamplingParams p = Penalties(0.0f, 1.0f);
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = -1;
  p.logit_bias = {{0, 3.0f}};
  // (1 + 3) / 2 - 1 = 1.
  EXPECT_FLOAT_EQ(Penalized(p, kLogits, kHistory, kPromptTokens)[0], 1.0f);
}

TEST(SamplerPenaltyTest, PenaltiesChangeTheGreedyChoiceAndLeaveNoStateBehind) {
  // Token 4 leads token 1 by 1; each 4 generated costs it 0.5 (the prompt's 0 counts nothing).
  const std::vector<float> logits = {0.0f, 2.0f, 0.0f, 0.0f, 3.0f, 0.0f};
  Sampler sampler(Penalties(0.5f, 0.0f), 6, /*prompt_tokens=*/1);
  EXPECT_EQ(sampler.Sample(logits.data(), {0}), 4);
  EXPECT_EQ(sampler.Sample(logits.data(), {0, 4}), 4);        // 3 - 0.5 = 2.5 > 2
  EXPECT_EQ(sampler.Sample(logits.data(), {0, 4, 4}), 1);     // 3 - 1 = 2 ties: lower id
  EXPECT_EQ(sampler.Sample(logits.data(), {0, 4, 4, 4}), 1);  // 1.5 < 2
  // The counts of one call are cleared before the next: a fresh history is not penalized.
  EXPECT_EQ(sampler.Sample(logits.data(), {0}), 4);
}

TEST(SamplerPenaltyTest, PenaltiesApplyAtTemperatureToo) {
  // A presence penalty of 2 on every token but 1 leaves 1 far ahead: with top-k 1 the draw
  // must take it at any temperature.
  SamplingParams p = Penalties(0.0f, 2.0f);
  p.temperature = 1.5f;
  p.top_k = 1;
  const std::vector<float> logits = {3.0f, 2.0f, 2.5f};
  Sampler sampler(p, 3);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.Sample(logits.data(), {0, 2}), 1);
}

TEST(SamplerPenaltyTest, ValidateRefusesValuesOutsideOpenAisRange) {
  for (float bad : {2.5f, -2.01f, std::numeric_limits<float>::quiet_NaN()}) {
    SamplingParams p;
    p.frequency_penalty = bad;
    EXPECT_NE(p.Validate().message().find("frequency_penalty"), std::string::npos) << bad;
    p = SamplingParams();
    p.presence_penalty = bad;
    EXPECT_NE(p.Validate().message().find("presence_penalty"), std::string::npos) << bad;
  }
  SamplingParams edge;
  edge.frequency_penalty = -2.0f;
  edge.presence_penalty = 2.0f;
  EXPECT_TRUE(edge.Validate().ok());
}

}  // namespace
}  // namespace kvl
