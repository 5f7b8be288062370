// Speculative decoding from a draft model (issue 26, item 2): the draft's KV follows the
// sequence it drafts for (a rejected draft is rolled back and the next draft is what a fresh
// drafter gives), the engine's output with a draft model is plain decoding's, a perfect draft
// (stories260K drafting for itself) is accepted whole, a poor one (random weights, the same
// vocabulary) is turned down by the cost model, and a draft model of another vocabulary is
// refused by name.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/spec_draft_model.h"
#include "kvl/engine.h"
#include "kvl/synthetic_model.h"
#include "kvl/thread_pool.h"
#include "test_paths.h"

namespace kvl {
namespace {

// A draft model of stories260K's shape with random weights: with `same_vocab` its vocabulary is
// copied from stories260K, otherwise the generator's own (same size, other token texts).
std::string WriteRandomDraft(bool same_vocab) {
  const std::string path = fmt::format("/tmp/kvl-draft-{}-{}.gguf", ::getpid(), same_vocab);
  SynthOptions o;
  o.shape = {"draft-test", 64, 2, 4, 2, 128, 512, 512, 10000.0f, 1e-5f, true};
  o.weight_type = DType::kF32;
  o.output_path = path;
  if (same_vocab) o.vocab_path = testing::Stories260KPath();
  const Status s = WriteSyntheticModel(o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return path;
}

class DraftModelDrafterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<Model>> model = Model::Load(testing::Stories260KPath());
    ASSERT_TRUE(model.ok());
    model_ = std::move(model).value();
    StatusOr<std::unique_ptr<Tokenizer>> vocab = Tokenizer::FromGguf(model_->file());
    ASSERT_TRUE(vocab.ok());
    vocab_ = std::move(vocab).value();
    StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(2);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(pool).value();
    ops_ = std::make_unique<ops::OpsContext>(ops::BestIsa(), pool_.get());
  }
  std::unique_ptr<DraftModelDrafter> MakeDrafter() {
    DraftModelOptions o;
    o.path = testing::Stories260KPath();
    o.max_seqs = 4;
    o.context_length = 256;
    // Small blocks: a rollback that reaches into a full block lets the slot go and admits it
    // again (through the draft pool's prefix cache), one that does not cuts the last block.
    o.block_tokens = 4;
    StatusOr<std::unique_ptr<DraftModelDrafter>> d = DraftModelDrafter::Create(o, *vocab_, *ops_);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(d).value() : nullptr;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> vocab_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ops::OpsContext> ops_;
};

TEST_F(DraftModelDrafterTest, DraftsGreedilyAndFollowsTheSequenceThroughRejections) {
  std::unique_ptr<DraftModelDrafter> drafter = MakeDrafter();
  ASSERT_TRUE(drafter);
  const std::vector<int32_t>& greedy = testing::Stories260KGreedyReference();
  std::vector<int32_t> draft;
  // From BOS, the draft is stories260K's own greedy continuation.
  std::vector<int32_t> context = {1};
  drafter->Draft(context, 8, &draft);
  EXPECT_EQ(draft, std::vector<int32_t>(greedy.begin(), greedy.begin() + 8));
  // The sequence took 3 of them and then another token (a rejection): the slot keeps the
  // common part, and the next draft is what a drafter that never saw the rejected tokens gives.
  context = {1, greedy[0], greedy[1], greedy[2], 5};
  drafter->Draft(context, 6, &draft);
  EXPECT_EQ(drafter->tokens_held(0), static_cast<int64_t>(context.size()) + 6 - 1);
  std::unique_ptr<DraftModelDrafter> fresh = MakeDrafter();
  std::vector<int32_t> fresh_draft;
  fresh->Draft(context, 6, &fresh_draft);
  EXPECT_EQ(draft, fresh_draft);
  // Another sequence in the same slot (a new request): nothing of the old one is used.
  context = {1, 385, 410};
  drafter->Draft(context, 4, &draft);
  fresh->Forget(0);
  fresh->Draft(context, 4, &fresh_draft);
  EXPECT_EQ(draft, fresh_draft);
  ASSERT_EQ(draft.size(), 4u);
  EXPECT_TRUE(drafter->kv_manager().CheckInvariants().ok());
}

TEST_F(DraftModelDrafterTest, BatchedDraftsEqualOneAtATime) {
  std::unique_ptr<DraftModelDrafter> batched = MakeDrafter();
  std::unique_ptr<DraftModelDrafter> single = MakeDrafter();
  ASSERT_TRUE(batched && single);
  const std::vector<std::vector<int32_t>> contexts = {
      {1, 403, 407}, {1, 385}, {1, 403, 407, 261, 378, 432, 383, 286, 261, 376}};
  const std::vector<int32_t> max_tokens = {8, 3, 5};
  std::vector<std::vector<int32_t>> drafts(contexts.size());
  std::vector<DraftRequest> requests;
  for (size_t i = 0; i < contexts.size(); ++i) {
    requests.push_back({static_cast<int32_t>(i), contexts[i], max_tokens[i], &drafts[i]});
  }
  batched->DraftAll(requests);
  for (size_t i = 0; i < contexts.size(); ++i) {
    std::vector<int32_t> one;
    single->Forget(0);
    single->Draft(contexts[i], max_tokens[i], &one);
    EXPECT_EQ(drafts[i], one) << "sequence " << i;
    EXPECT_EQ(static_cast<int32_t>(drafts[i].size()), max_tokens[i]);
  }
}

std::unique_ptr<Engine> MakeEngine(const std::string& spec, const std::string& draft_model,
                                   int32_t max_seqs, bool force) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.context_length = 512;
  o.max_seqs = max_seqs;
  o.spec = spec;
  o.draft_model_path = draft_model;
  o.calibrate = false;
  o.spec_force = force;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<std::vector<int32_t>> RunAll(Engine& e, const std::vector<std::string>& prompts,
                                         float temperature, int32_t n = 100) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_new_tokens = n;
    r.sampling.temperature = temperature;
    r.sampling.seed = 7000 + i;
    r.ignore_eos = true;
    StatusOr<RequestId> id = e.Submit(r, [&out, i](const TokenEvent& ev) {
      EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
      if (ev.token >= 0) out[i].push_back(ev.token);
    });
    EXPECT_TRUE(id.ok()) << id.status().ToString();
  }
  e.RunUntilIdle();
  return out;
}

struct SelfDraftCase {
  int32_t max_seqs;
  float temperature;
};

class SelfDraftTest : public ::testing::TestWithParam<SelfDraftCase> {};

// stories260K drafting for itself: every greedy draft token is the target's own (the kernels are
// batch-invariant), so all are accepted and a step yields up to 1 + draft_max tokens.
TEST_P(SelfDraftTest, GivesPlainTokensWithFullAcceptance) {
  const SelfDraftCase c = GetParam();
  const std::vector<std::string> prompts(testing::StoryPrompts().begin(),
                                         testing::StoryPrompts().begin() + 4);
  std::unique_ptr<Engine> plain = MakeEngine("off", "", c.max_seqs, false);
  std::unique_ptr<Engine> spec =
      MakeEngine("draft", testing::Stories260KPath(), c.max_seqs, /*force=*/true);
  ASSERT_TRUE(plain && spec);
  const auto want = RunAll(*plain, prompts, c.temperature);
  EXPECT_EQ(RunAll(*spec, prompts, c.temperature), want);
  const EngineMetrics m = spec->Metrics();
  const double tokens_per_step =
      static_cast<double>(m.tokens_generated) / static_cast<double>(m.spec_seq_steps);
  std::printf("draft model: %lld drafted, %lld accepted, %.2f tokens per sequence step\n",
              static_cast<long long>(m.spec_drafted), static_cast<long long>(m.spec_accepted),
              tokens_per_step);
  if (c.temperature == 0) {
    EXPECT_EQ(m.spec_accepted, m.spec_drafted);  // full acceptance
    EXPECT_GT(tokens_per_step, 5.0);             // 9 at most with --draft-max 8
  } else {
    EXPECT_GT(m.spec_accepted, 0);
    EXPECT_LT(m.spec_accepted, m.spec_drafted);  // sampled tokens leave the greedy draft
  }
  EXPECT_TRUE(spec->kv_manager().CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Cases, SelfDraftTest,
                         ::testing::Values(SelfDraftCase{1, 0.0f}, SelfDraftCase{4, 0.0f},
                                           SelfDraftCase{4, 0.9f}),
                         [](const ::testing::TestParamInfo<SelfDraftCase>& info) {
                           return "np" + std::to_string(info.param.max_seqs) +
                                  (info.param.temperature > 0 ? "_sampled" : "_greedy");
                         });

// A draft model with random weights of the same vocabulary is nearly always wrong: the output is
// still plain decoding's, and the cost model sends a small share of what the same drafter sends
// when forced (the first drafts, before the acceptance is known; probes after are not sent).
TEST(PoorDraftTest, IsTurnedDownByTheCostModel) {
  const std::string draft = WriteRandomDraft(/*same_vocab=*/true);
  const std::vector<std::string> prompts(testing::StoryPrompts().begin(),
                                         testing::StoryPrompts().begin() + 4);
  std::unique_ptr<Engine> plain = MakeEngine("off", "", 1, false);
  std::unique_ptr<Engine> chosen = MakeEngine("draft", draft, 1, false);
  std::unique_ptr<Engine> forced = MakeEngine("draft", draft, 1, true);
  ASSERT_TRUE(plain && chosen && forced);
  const auto want = RunAll(*plain, prompts, 0.0f);
  EXPECT_EQ(RunAll(*chosen, prompts, 0.0f), want);
  EXPECT_EQ(RunAll(*forced, prompts, 0.0f), want);
  const EngineMetrics m = chosen->Metrics();
  const EngineMetrics f = forced->Metrics();
  std::printf("poor draft: forced %lld drafted (%lld accepted), cost model %lld drafted\n",
              static_cast<long long>(f.spec_drafted), static_cast<long long>(f.spec_accepted),
              static_cast<long long>(m.spec_drafted));
  EXPECT_GT(f.spec_drafted, 1000);  // 400 steps of up to 8 tokens
  EXPECT_LT(f.spec_accepted * 5, f.spec_drafted);  // it is a poor draft
  EXPECT_LT(m.spec_drafted * 20, f.spec_drafted);
  EXPECT_LT(m.spec_draft_steps, 10);
  std::remove(draft.c_str());
}

TEST(DraftModelOptionsTest, AnotherVocabularyIsRefusedByName) {
  const std::string draft = WriteRandomDraft(/*same_vocab=*/false);
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.calibrate = false;
  o.spec = "draft";
  o.draft_model_path = draft;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("-md " + draft), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("vocabulary"), std::string::npos) << e.status().message();
  o.draft_model_path = "/nonexistent/draft.gguf";
  e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("-md"), std::string::npos) << e.status().message();
  std::remove(draft.c_str());
}

}  // namespace
}  // namespace kvl
