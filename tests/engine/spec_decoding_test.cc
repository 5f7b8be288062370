// Speculative decoding (issue 26) must never change what a sequence generates: greedy and seeded
// sampled tokens with drafts equal the tokens without, alone (-np 1) and batched (-np 4), with
// prompt lookup and with the suffix index; the drafts really ran (drafted and accepted counts);
// and, over many seeds, the distribution of the first sampled tokens is plain sampling's.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

std::unique_ptr<Engine> MakeEngine(const std::string& spec, int32_t max_seqs,
                                   int32_t draft_max = 8, int32_t block_tokens = 16,
                                   bool force = false) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.context_length = 512;
  o.max_seqs = max_seqs;
  o.block_tokens = block_tokens;
  o.spec = spec;
  o.draft_max = draft_max;
  o.calibrate = false;
  o.spec_force = force;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Prompts that repeat themselves (the drafter's case) and story openings (prose).
std::vector<std::string> Prompts() {
  std::vector<std::string> prompts = testing::StoryPrompts();
  prompts.push_back(
      "Lily and Ben went to the park. They saw a big red ball. Lily and Ben went to the park. "
      "They saw a big red ball. Lily and Ben went to the park.");
  prompts.push_back(
      "Tom said, \"I want to play with the ball.\" Mom said, \"You can play with the ball.\" "
      "Tom said, \"I want to play with the ball.\" Mom said,");
  prompts.push_back(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. Once upon a time, there was a little girl named Lily. She loved to");
  return prompts;
}

Request MakeRequest(const std::string& prompt, float temperature, uint64_t seed, int32_t n) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.ignore_eos = true;
  return r;
}

// Every prompt submitted at once (the engine batches up to its max_seqs); each one's ids.
std::vector<std::vector<int32_t>> RunAll(Engine& e, const std::vector<std::string>& prompts,
                                         float temperature, int32_t n = 120) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    StatusOr<RequestId> id = e.Submit(MakeRequest(prompts[i], temperature, 1000 + i, n),
                                      [&out, i](const TokenEvent& ev) {
                                        EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                                        if (ev.token >= 0) out[i].push_back(ev.token);
                                      });
    EXPECT_TRUE(id.ok()) << id.status().ToString();
  }
  e.RunUntilIdle();
  return out;
}

struct Case {
  std::string spec;
  int32_t max_seqs;
  float temperature;
};

class SpecDecodingTest : public ::testing::TestWithParam<Case> {};

TEST_P(SpecDecodingTest, GivesPlainDecodingsTokens) {
  const Case c = GetParam();
  std::unique_ptr<Engine> plain = MakeEngine("off", c.max_seqs);
  // Every draft sent (--spec-force): the cost model's choices follow measured step times, and
  // the counts below must not depend on the machine's load.
  std::unique_ptr<Engine> spec = MakeEngine(c.spec, c.max_seqs, 8, 16, /*force=*/true);
  ASSERT_TRUE(plain && spec);
  const auto want = RunAll(*plain, Prompts(), c.temperature);
  for (const auto& ids : want) ASSERT_EQ(ids.size(), 120u);
  EXPECT_EQ(RunAll(*spec, Prompts(), c.temperature), want);
  const EngineMetrics m = spec->Metrics();
  // The drafts really ran, and some were right (the repeating prompts).
  EXPECT_GT(m.spec_draft_steps, 10);
  EXPECT_GT(m.spec_accepted, 20);
  EXPECT_LT(m.spec_seq_steps, m.tokens_generated);  // fewer sequence steps than tokens
  EXPECT_EQ(plain->Metrics().spec_drafted, 0);
  EXPECT_TRUE(spec->kv_manager().CheckInvariants().ok())
      << spec->kv_manager().CheckInvariants().message();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, SpecDecodingTest,
    ::testing::Values(Case{"ngram", 1, 0.0f}, Case{"ngram", 4, 0.0f}, Case{"suffix", 4, 0.0f},
                      Case{"ngram", 1, 0.9f}, Case{"ngram", 4, 0.9f}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.spec + "_np" + std::to_string(info.param.max_seqs) +
             (info.param.temperature > 0 ? "_sampled" : "_greedy");
    });

// Blocks that held draft tokens enter the prefix cache only as the verified tokens they hold: a
// second run of the same prompt finds the first one's pages (prompt and output) and still gives
// the same tokens, with a block size that splits drafts across blocks.
TEST(SpecDecodingKvTest, VerifiedPagesAreFoundAgainAndGiveTheSameTokens) {
  std::unique_ptr<Engine> plain = MakeEngine("off", 1, 8, 4);
  std::unique_ptr<Engine> spec = MakeEngine("ngram", 1, 8, 4, /*force=*/true);
  ASSERT_TRUE(plain && spec);
  const std::vector<std::string> prompts = Prompts();
  const auto want = RunAll(*plain, {prompts.back()}, 0.0f, 60);
  EXPECT_EQ(RunAll(*spec, {prompts.back()}, 0.0f, 60), want);
  ASSERT_GT(spec->Metrics().spec_accepted, 0);
  // The prompt followed by the reply: its pages are all cached (verified tokens only).
  std::string text = prompts.back();
  Request again = MakeRequest(prompts.back(), 0.0f, 0, 60);
  int64_t cached = -1;
  std::vector<int32_t> got;
  ASSERT_TRUE(spec->Submit(again, [&](const TokenEvent& ev) {
                      if (ev.token >= 0) got.push_back(ev.token);
                      if (ev.finished) cached = ev.cached_prompt_tokens;
                    }).ok());
  spec->RunUntilIdle();
  EXPECT_EQ(got, want[0]);
  EXPECT_GT(cached, 0);
  EXPECT_TRUE(spec->kv_manager().CheckInvariants().ok());
}

// Sampling with drafts keeps the target distribution. The seeds differ between the runs (so this
// is not the identity above again): the histograms of each of the first sampled positions over
// 2000 seeds must be within a total-variation distance that two samples of one distribution stay
// under (printed beside it: plain decoding with two sets of seeds).
constexpr int kSeeds = 2000;
constexpr int kPositions = 3;  // position 0 comes from the prompt's step: no draft
// Two samples of one distribution stay under this (measured: plain/plain 0.058 and 0.070;
// plain/spec 0.077 and 0.084); a rule that always took the draft token moves a position by
// the probability of the other tokens, ~0.3 here.
constexpr double kMaxVariation = 0.1;

TEST(SpecDecodingStatsTest, SampledTokensFollowTheTargetDistribution) {
  const std::string prompt =
      "Lily and Ben went to the park. They saw a big red ball. Lily and Ben went to the park. "
      "They saw a big";
  auto histograms = [&](const std::string& mode, uint64_t first_seed, int64_t* drafted) {
    std::unique_ptr<Engine> e = MakeEngine(mode, 16, 4, 16, /*force=*/true);
    std::vector<std::map<int32_t, int>> h(kPositions);
    for (int s = 0; s < kSeeds; ++s) {
      // Room for drafts after the histogram's positions (a draft stops at max_tokens).
      Request r = MakeRequest(prompt, 1.0f, first_seed + static_cast<uint64_t>(s), 5);
      auto at = std::make_shared<int>(0);
      EXPECT_TRUE(e->Submit(r, [&h, at](const TokenEvent& ev) {
                     if (ev.token >= 0 && *at < kPositions) ++h[static_cast<size_t>((*at)++)][ev.token];
                   }).ok());
    }
    e->RunUntilIdle();
    *drafted = e->Metrics().spec_drafted;
    return h;
  };
  int64_t drafted_plain = 0, drafted_spec = 0, drafted_other = 0;
  const auto plain = histograms("off", 1, &drafted_plain);
  const auto other = histograms("off", 200001, &drafted_other);
  const auto spec = histograms("ngram", 100001, &drafted_spec);
  EXPECT_GT(drafted_spec, kSeeds / 2);  // most requests verified drafts
  auto tv = [](const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
    std::map<int32_t, double> diff;
    for (const auto& [token, n] : a) diff[token] += n;
    for (const auto& [token, n] : b) diff[token] -= n;
    double sum = 0;
    for (const auto& [token, d] : diff) sum += std::abs(d);
    return sum / (2.0 * kSeeds);
  };
  for (size_t p = 1; p < kPositions; ++p) {
    const double noise = tv(plain[p], other[p]);
    const double spec_tv = tv(plain[p], spec[p]);
    std::printf("position %zu: total variation plain/plain %.3f, plain/spec %.3f\n", p, noise,
                spec_tv);
    EXPECT_LT(spec_tv, kMaxVariation) << "position " << p;
  }
}

TEST(SpecDecodingOptionsTest, BadFlagsAreRefusedByName) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.spec = "magic";
  EXPECT_NE(ValidateEngineOptions(o).message().find("--spec"), std::string::npos);
  o.spec = "ngram";
  o.draft_max = 0;
  EXPECT_NE(ValidateEngineOptions(o).message().find("--draft-max"), std::string::npos);
  o.draft_max = 8;
  o.spec = "draft";
  EXPECT_NE(ValidateEngineOptions(o).message().find("-md"), std::string::npos);
}

}  // namespace
}  // namespace kvl
