// Speculative decoding's KV side (issue 26): a step's draft tokens are unverified; a block
// holding any of them gets no identity (prefix index, content id) until TruncateTail says how
// many were verified, and the rejected tail's blocks go back to the pool.
#include <gtest/gtest.h>

#include <vector>

#include "kv_test_util.h"
#include "kvl/kv_manager.h"

namespace kvl {
namespace {

using testing_kv::Concat;
using testing_kv::Make;
using testing_kv::Options;
using testing_kv::Range;
using testing_kv::Step;

// Plans and commits `tokens` for `seq`, the last `unverified` of them a draft.
void StepWithDraft(KvManager& m, SeqId seq, const std::vector<int32_t>& tokens,
                   int64_t unverified) {
  const KvSeqStep step{seq, tokens, 0, unverified};
  const KvPlan plan = m.Plan(std::span(&step, 1));
  ASSERT_TRUE(plan.fits);
  m.Commit(plan);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
}

TEST(KvManagerSpecTest, DraftBlocksHaveNoIdentityUntilVerified) {
  auto m = Make(Options(4, 16));
  Step(*m, 0, Range(0, 6));  // blocks of 4: one full, one with 2 tokens
  // The last token (6) and a draft of 7 (7..13): blocks 1, 2 and 3 would be full.
  StepWithDraft(*m, 0, Range(6, 8), 7);
  EXPECT_EQ(m->num_tokens(0), 14);
  EXPECT_EQ(m->block_table(0).size(), 4u);
  // Only the block before the draft is findable; the blocks with draft tokens have no id.
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 4);
  EXPECT_FALSE(m->ContentOf(0, 1).valid());
  EXPECT_FALSE(m->ContentOf(0, 2).valid());
  // Three draft tokens verified: 10 tokens kept, block 1 (4..7) full and verified.
  m->TruncateTail(0, 10);
  EXPECT_EQ(m->tokens(0), Range(0, 10));
  EXPECT_EQ(m->block_table(0).size(), 3u);  // blocks 0, 1, and 2 holding 8..9
  EXPECT_EQ(m->stats().blocks_used, 3);     // the rejected tail's block went back
  EXPECT_TRUE(m->ContentOf(0, 1).valid());
  EXPECT_FALSE(m->ContentOf(0, 2).valid());
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 8);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  // The sequence goes on from its verified tokens, with other tokens than the draft's.
  Step(*m, 0, Range(50, 3));
  EXPECT_EQ(m->tokens(0), Concat(Range(0, 10), Range(50, 3)));
  EXPECT_EQ(m->MatchPrefix(Concat(Range(0, 10), Range(50, 3))), 12);
  // Nothing of the rejected draft is findable: 10..13 were never verified.
  EXPECT_EQ(m->MatchPrefix(Range(0, 14)), 8);
}

TEST(KvManagerSpecTest, ARejectedDraftLeavesThePoolAsItWas) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 4));
  const KvStats before = m->stats();
  StepWithDraft(*m, 0, Range(4, 9), 8);  // the last token, then 8 draft tokens
  EXPECT_EQ(m->stats().blocks_used, 4);
  m->TruncateTail(0, 5);  // none accepted: the last token's row stays
  EXPECT_EQ(m->stats().blocks_used, before.blocks_used + 1);
  EXPECT_EQ(m->tokens(0), Range(0, 5));
  EXPECT_EQ(m->MatchPrefix(Range(0, 9)), 4);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

TEST(KvManagerSpecTest, TruncateTailNeverCutsVerifiedTokens) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 9));
  EXPECT_DEATH(m->TruncateTail(0, 7), "unverified");
}

}  // namespace
}  // namespace kvl
