// Sampler::Sample runs once per token and must not touch the heap, in every mode of the chain.
// This file also holds test_sampling's allocation hooks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "alloc_counter.h"
#include "kvl/sampling.h"

KVL_ALLOC_COUNTER_HOOKS()

namespace kvl {
namespace {

using ::kvl::testing::AllocCounter;

constexpr int32_t kVocab = 4096;

struct Mode {
  std::string name;
  SamplingParams params;
};

std::vector<Mode> Modes() {
  std::vector<Mode> modes;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.repeat_penalty = 1.0f;
  modes.push_back({"greedy", greedy});
  SamplingParams greedy_penalty = greedy;
  greedy_penalty.repeat_penalty = 1.3f;
  modes.push_back({"greedy+penalty", greedy_penalty});
  SamplingParams chain;  // temperature, top-k, top-p, min-p, penalty: llama.cpp's chain
  chain.temperature = 0.8f;
  chain.top_k = 40;
  chain.top_p = 0.9f;
  chain.min_p = 0.05f;
  chain.repeat_penalty = 1.1f;
  modes.push_back({"top-k+top-p+min-p", chain});
  SamplingParams top_p_only = chain;  // top-p over the whole vocab: the growing sorted prefix
  top_p_only.top_k = 0;
  top_p_only.top_p = 0.99f;
  top_p_only.min_p = 0.0f;
  modes.push_back({"top-p over the vocab", top_p_only});
  SamplingParams min_p_only = top_p_only;
  min_p_only.top_p = 1.0f;
  min_p_only.min_p = 0.1f;
  modes.push_back({"min-p unsorted", min_p_only});
  SamplingParams openai = chain;  // OpenAI's penalties over the generated tokens
  openai.frequency_penalty = 0.7f;
  openai.presence_penalty = -0.3f;
  modes.push_back({"frequency+presence", openai});
  SamplingParams greedy_openai = greedy;
  greedy_openai.frequency_penalty = 1.5f;
  greedy_openai.penalty_scope = SamplingParams::PenaltyScope::kRepeatWindow;
  modes.push_back({"greedy+frequency in the window", greedy_openai});
  return modes;
}

TEST(SamplerAllocTest, SampleDoesNotAllocateAfterWarmUp) {
  // Logits from peaked to nearly flat, so top-p sorts anything from one probe to the whole vocab.
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(8, std::vector<float>(kVocab));
  for (size_t r = 0; r < rows.size(); ++r) {
    const float spread = 0.05f + 2.0f * static_cast<float>(r);
    for (float& x : rows[r]) x = spread * noise(rng);
  }
  std::vector<int32_t> history;
  history.reserve(1024);
  for (int32_t i = 0; i < 100; ++i) history.push_back((i * 37) % kVocab);

  for (const Mode& mode : Modes()) {
    Sampler sampler(mode.params, kVocab, /*prompt_tokens=*/50);
    std::vector<int32_t> picked;
    picked.reserve(200);
    for (int i = 0; i < 8; ++i)
      picked.push_back(sampler.Sample(rows[i % rows.size()].data(), history));
    AllocCounter counter;
    for (int i = 0; i < 100; ++i) {
      const int32_t id = sampler.Sample(rows[i % rows.size()].data(), history);
      picked.push_back(id);
      history.push_back(id);  // within the reserved capacity
    }
    const int64_t allocations = counter.Stop();
    EXPECT_EQ(allocations, 0) << mode.name;
    for (int32_t id : picked) ASSERT_TRUE(id >= 0 && id < kVocab) << mode.name;
    history.resize(100);
  }
}

}  // namespace
}  // namespace kvl
