// The KV manager's part of a decode step (Plan into a reused KvPlan, Commit, MatchPrefix) must not
// touch the heap once warmed up, including the steps where a block fills (its prefix identity is
// indexed) and the next one is allocated. This file also holds test_kv's allocation hooks.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "alloc_counter.h"
#include "kv_test_util.h"
#include "kvl/kv_manager.h"

KVL_ALLOC_COUNTER_HOOKS()

namespace kvl::testing_kv {
namespace {

using ::kvl::testing::AllocCounter;

constexpr int kSeqs = 4;
constexpr int32_t kBlockTokens = 16;
constexpr int kPromptTokens = 20;

// Four sequences decoding one token each per step. The first two share their first block, so the
// prefix index holds entries that later registrations must probe past.
class DecodeLoop {
 public:
  explicit DecodeLoop(int64_t max_seq_tokens) {
    KvManagerOptions options = Options(kBlockTokens, /*num_blocks=*/128);
    options.max_seq_tokens = max_seq_tokens;
    manager_ = Make(options);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < kSeqs; ++i) {
      prompts.push_back(Range(i < 2 ? 0 : 1000 * i, kPromptTokens));
      if (i == 1) prompts[1][kPromptTokens - 1] = 999;  // same first block, different tail
      steps_[i] = KvSeqStep{i, prompts.back()};
    }
    // Admitted one at a time so that sequence 1 finds sequence 0's first block in the index.
    for (int i = 0; i < kSeqs; ++i) {
      manager_->Plan(std::span(&steps_[i], 1), &plan_);
      KVL_CHECK(plan_.fits);
      manager_->Commit(plan_);
    }
    for (int i = 0; i < kSeqs; ++i) steps_[i] = KvSeqStep{i, std::span(&next_[i], 1)};
  }

  // One decode step; false when the plan did not fit. No gtest assertions (they may allocate).
  bool Step() {
    for (int i = 0; i < kSeqs; ++i) next_[i] = 50000 + 100 * i + step_count_;
    ++step_count_;
    manager_->Plan(steps_, &plan_);
    if (!plan_.fits) return false;
    manager_->Commit(plan_);
    matched_tokens_ += manager_->MatchPrefix(manager_->tokens(1));
    return true;
  }

  KvManager& manager() { return *manager_; }
  int64_t matched_tokens() const { return matched_tokens_; }

 private:
  std::unique_ptr<KvManager> manager_;
  std::array<KvSeqStep, kSeqs> steps_;
  std::array<int32_t, kSeqs> next_{};
  KvPlan plan_;
  int step_count_ = 0;
  int64_t matched_tokens_ = 0;
};

// Runs `warm_up` then 100 counted steps; returns the allocations of the counted ones.
int64_t CountDecodeAllocations(DecodeLoop& loop, int warm_up, bool* all_fit) {
  *all_fit = true;
  for (int i = 0; i < warm_up; ++i) *all_fit &= loop.Step();
  AllocCounter counter;
  for (int i = 0; i < 100; ++i) *all_fit &= loop.Step();
  return counter.Stop();
}

TEST(KvManagerAllocTest, DecodeStepsDoNotAllocateAfterWarmUp) {
  DecodeLoop loop(/*max_seq_tokens=*/256);
  // Two block boundaries per sequence, so every SeqPlan has held a freshly allocated block.
  const int warm_up = 2 * kBlockTokens;
  const KvStats before = loop.manager().stats();
  bool all_fit = false;
  const int64_t allocations = CountDecodeAllocations(loop, warm_up, &all_fit);
  EXPECT_EQ(allocations, 0);
  ASSERT_TRUE(all_fit);

  // The counted steps really filled blocks and took new ones, and the tokens are all there.
  KvManager& m = loop.manager();
  const int64_t tokens = kPromptTokens + warm_up + 100;
  EXPECT_EQ(m.stats().blocks_used - before.blocks_used, kSeqs * (m.BlocksFor(tokens) - 2));
  for (SeqId seq = 0; seq < kSeqs; ++seq) {
    ASSERT_EQ(m.num_tokens(seq), tokens);
    EXPECT_EQ(m.tokens(seq)[kPromptTokens + warm_up + 99], 50000 + 100 * seq + warm_up + 99);
  }
  EXPECT_GT(loop.matched_tokens(), 0);  // MatchPrefix walked real chains
  const Status status = m.CheckInvariants();
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(KvManagerAllocTest, WithoutMaxSeqTokensTablesGrow) {
  // The counter's other side: without the reservation the token lists reallocate as they grow.
  DecodeLoop loop(/*max_seq_tokens=*/0);
  bool all_fit = false;
  EXPECT_GT(CountDecodeAllocations(loop, 2 * kBlockTokens, &all_fit), 0);
  EXPECT_TRUE(all_fit);
}

TEST(KvManagerAllocTest, ReusedPlanEqualsFreshPlan) {
  auto m = Make(Options(4, 32));
  Step(*m, 0, Range(0, 10));
  m->Fork(0, 1);  // seq 1 shares seq 0's partial last block: its next step copies it
  const std::vector<int32_t> prompt = Range(0, 9);  // two cached blocks, then one to compute
  const std::vector<int32_t> one = {77};
  const std::vector<int32_t> many = Range(100, 7);
  const std::vector<int32_t> too_many = Range(0, 200);  // outlives the spans that view it

  KvPlan reused;
  // Each step shape after another in the same object: admission with prefix hits, COW, growth,
  // fewer sequences, and a plan that does not fit.
  const std::vector<std::vector<KvSeqStep>> shapes = {
      {{0, one}, {1, one}, {2, prompt}},
      {{1, many}},
      {{2, prompt}, {0, many}, {1, one}},
      {{0, too_many}},
      {{3, prompt}, {0, one}},
  };
  for (const std::vector<KvSeqStep>& steps : shapes) {
    const KvPlan fresh = m->Plan(steps);
    m->Plan(steps, &reused);
    ExpectSamePlan(reused, fresh);  // what it held before left no trace
  }
}

}  // namespace
}  // namespace kvl::testing_kv
