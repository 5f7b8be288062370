// Under a KV budget the engine cuts its step's rows (the prefill chunk) so that the forward pass's
// scratch fits a quarter of the budget (Engine::step_tokens): the rule's figures, its floor, no
// cut without a budget, and the same greedy tokens from a prompt that now runs in more chunks.
#include <gtest/gtest.h>

#include "kvl/engine.h"
#include "kvl/forward.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr int64_t kContext = 256;

std::unique_ptr<Engine> MakeEngine(int64_t budget) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = kContext;
  o.max_seqs = 1;
  o.kv_budget_bytes = budget;
  o.batch_size = 512;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

TEST(StepTokensTest, WithoutABudgetTheStepIsTheBatchUpToTheContext) {
  EXPECT_EQ(MakeEngine(0)->step_tokens(), kContext);  // -b 512, the context 256
}

TEST(StepTokensTest, ABudgetCutsTheStepUntilItsScratchFitsAQuarter) {
  const int64_t budget = 2 << 20;
  std::unique_ptr<Engine> e = MakeEngine(budget);
  const int64_t per_row = Forward::ScratchBytesPerRow(e->model().config());
  const int64_t rows = e->step_tokens();
  EXPECT_LT(rows, kContext);  // cut: 256 rows of scratch would not fit
  EXPECT_EQ(rows % 16, 0);    // whole blocks
  EXPECT_LE(rows * per_row, budget / 4);
  EXPECT_GT((rows + 16) * per_row, budget / 4);  // the most whole blocks that fit
}

TEST(StepTokensTest, ATinyBudgetKeepsTheFloor) {
  EXPECT_EQ(MakeEngine(64 << 10)->step_tokens(), 128);  // kMinBudgetStepTokens
}

std::vector<int32_t> GreedyTokens(Engine& e, const std::vector<int32_t>& prompt) {
  Request r;
  r.prompt_ids = prompt;
  r.max_new_tokens = 40;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  std::vector<int32_t> out;
  StatusOr<RequestId> id = e.Submit(r, [&out](const TokenEvent& ev) {
    EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
    if (ev.token >= 0) out.push_back(ev.token);
  });
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  e.RunUntilIdle();
  return out;
}

TEST(StepTokensTest, AChunkedPromptGivesTheSameTokens) {
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 200; ++i) prompt.push_back(3 + (i * 37) % 400);
  std::unique_ptr<Engine> whole = MakeEngine(0);
  std::unique_ptr<Engine> chunked = MakeEngine(2 << 20);
  ASSERT_LT(chunked->step_tokens(), static_cast<int64_t>(prompt.size()));  // two chunks or more
  const std::vector<int32_t> expected = GreedyTokens(*whole, prompt);
  ASSERT_EQ(expected.size(), 40u);
  EXPECT_EQ(GreedyTokens(*chunked, prompt), expected);
}

}  // namespace
}  // namespace kvl
