// Unit tests of KvManager: one behaviour each (sizing, plan/commit, prefix cache, lazy eviction,
// copy-on-write, free order, hash collisions).
#include "kvl/kv_manager.h"

#include <gtest/gtest.h>

#include <vector>

#include "kv_test_util.h"

namespace kvl {
namespace {

using testing_kv::Concat;
using testing_kv::ExpectSamePlan;
using testing_kv::Make;
using testing_kv::Options;
using testing_kv::PlanOne;
using testing_kv::Range;
using testing_kv::Step;

void ExpectSameStats(const KvStats& a, const KvStats& b) {
  EXPECT_EQ(a.blocks_used, b.blocks_used);
  EXPECT_EQ(a.blocks_free, b.blocks_free);
  EXPECT_EQ(a.blocks_cached, b.blocks_cached);
  EXPECT_EQ(a.prefix_queries, b.prefix_queries);
  EXPECT_EQ(a.prefix_query_tokens, b.prefix_query_tokens);
  EXPECT_EQ(a.prefix_hit_tokens, b.prefix_hit_tokens);
  EXPECT_EQ(a.num_seqs, b.num_seqs);
}

TEST(KvManagerTest, PoolIsSizedFromTheBudget) {
  KvManagerOptions options = Options(4, 10);
  options.budget_bytes += options.layout.block_bytes() / 2;  // half a block is not a block
  auto m = Make(options);
  EXPECT_EQ(m->num_blocks(), 10);
  const KvStats st = m->stats();
  EXPECT_EQ(st.blocks_total, 10);
  EXPECT_EQ(st.blocks_free, 10);
  EXPECT_EQ(st.kv_bytes_total, 10 * options.layout.block_bytes());
  EXPECT_EQ(options.layout.block_bytes(), 2 * 2 * 4 * 4 * 4);  // K,V x layers x tokens x dim x f32

  options.budget_bytes = options.layout.block_bytes() - 1;
  auto none = KvManager::Create(options);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);

  options = Options(4, 10);
  options.layout.kv_dim = 0;
  auto bad = KvManager::Create(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(KvManagerTest, BlocksForRoundsUp) {
  auto m = Make(Options(4, 8));
  EXPECT_EQ(m->BlocksFor(0), 0);
  EXPECT_EQ(m->BlocksFor(1), 1);
  EXPECT_EQ(m->BlocksFor(4), 1);
  EXPECT_EQ(m->BlocksFor(5), 2);
}

TEST(KvManagerTest, PlanDoesNotMutate) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(100, 9));
  const KvStats before = m->stats();
  const std::vector<int32_t> prompt = Concat(Range(100, 8), Range(500, 6));
  const std::vector<int32_t> more = Range(7, 5);
  const KvSeqStep steps[] = {{1, prompt}, {0, more}};
  const KvPlan first = m->Plan(steps);
  const KvPlan second = m->Plan(steps);
  ExpectSameStats(before, m->stats());
  EXPECT_EQ(m->num_tokens(0), 9);
  EXPECT_FALSE(m->Contains(1));
  ExpectSamePlan(first, second);
  EXPECT_TRUE(m->CheckInvariants().ok());
  m->Commit(first);  // still the current state
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvManagerTest, CommitAppliesExactlyThePlan) {
  auto m = Make(Options(4, 8));
  const KvPlan admit = PlanOne(*m, 3, Range(0, 10));
  ASSERT_TRUE(admit.fits);
  ASSERT_EQ(admit.seqs.size(), 1u);
  const KvPlan::SeqPlan& sp = admit.seqs[0];
  EXPECT_TRUE(sp.admit);
  EXPECT_EQ(sp.first_new_pos, 0);
  EXPECT_EQ(sp.num_cached_tokens, 0);
  EXPECT_TRUE(sp.reused.empty());
  EXPECT_EQ(sp.allocated, (std::vector<BlockId>{0, 1, 2}));  // the front of the free list
  EXPECT_EQ(admit.blocks_needed, 3);
  EXPECT_EQ(admit.blocks_free, 8);
  EXPECT_TRUE(admit.copies.empty());
  m->Commit(admit);
  EXPECT_EQ(m->block_table(3), sp.allocated);
  EXPECT_EQ(m->tokens(3), Range(0, 10));
  EXPECT_EQ(m->stats().blocks_used, 3);
  EXPECT_EQ(m->stats().kv_bytes_used, 3 * m->options().layout.block_bytes());

  // 10 -> 12 tokens stays in the last block; 12 -> 13 needs one more.
  const KvPlan fill = Step(*m, 3, Range(10, 2));
  EXPECT_FALSE(fill.seqs[0].admit);
  EXPECT_EQ(fill.seqs[0].first_new_pos, 10);
  EXPECT_TRUE(fill.seqs[0].allocated.empty());
  const KvPlan spill = Step(*m, 3, Range(12, 1));
  EXPECT_EQ(spill.seqs[0].allocated, std::vector<BlockId>{3});
  EXPECT_EQ(m->block_table(3), (std::vector<BlockId>{0, 1, 2, 3}));
  EXPECT_EQ(m->tokens(3), Range(0, 13));
}

TEST(KvManagerTest, OutOfBlocksIsAPlanResultAndChangesNothing) {
  auto m = Make(Options(4, 4));
  Step(*m, 0, Range(0, 5));  // 2 blocks
  const KvStats before = m->stats();
  const KvPlan plan = PlanOne(*m, 1, Range(100, 12));  // needs 3, 2 free
  EXPECT_FALSE(plan.fits);
  EXPECT_EQ(plan.blocks_needed, 3);
  EXPECT_EQ(plan.blocks_free, 2);
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].blocks_needed, 3);
  EXPECT_TRUE(plan.seqs[0].allocated.empty());
  ExpectSameStats(before, m->stats());
  EXPECT_TRUE(m->CheckInvariants().ok());
  EXPECT_DEATH(m->Commit(plan), "does not fit");
  // After freeing, the same request fits.
  m->Free(0);
  EXPECT_TRUE(PlanOne(*m, 1, Range(100, 12)).fits);
}

TEST(KvManagerTest, StalePlanIsRejected) {
  auto m = Make(Options(4, 8));
  const KvPlan plan = PlanOne(*m, 0, Range(0, 3));
  Step(*m, 1, Range(0, 3));
  EXPECT_DEATH(m->Commit(plan), "older state");
}

TEST(KvManagerTest, MalformedStepsAreCheckFailures) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 3));
  const std::vector<int32_t> t = Range(0, 2);
  const KvSeqStep twice[] = {{0, t}, {0, t}};
  EXPECT_DEATH((void)m->Plan(twice), "twice");
  EXPECT_DEATH((void)PlanOne(*m, 1, {}), "must add tokens");
  EXPECT_DEATH(m->Free(5), "");
  EXPECT_DEATH(m->Fork(0, 0), "");
}

TEST(KvManagerTest, PrefixHitReusesBlocksAndCountsTokens) {
  auto m = Make(Options(4, 16));
  const std::vector<int32_t> shared = Range(100, 12);
  Step(*m, 0, shared);  // 3 full blocks, registered at commit
  EXPECT_EQ(m->stats().prefix_queries, 1);
  EXPECT_EQ(m->stats().prefix_hit_tokens, 0);
  const std::vector<int32_t> prompt = Concat(shared, Range(7, 3));
  EXPECT_EQ(m->MatchPrefix(prompt), 12);
  const KvPlan plan = Step(*m, 1, prompt);
  const KvPlan::SeqPlan& sp = plan.seqs[0];
  EXPECT_EQ(sp.reused, m->block_table(0));
  EXPECT_EQ(sp.num_cached_tokens, 12);
  EXPECT_EQ(sp.first_new_pos, 12);
  EXPECT_EQ(sp.allocated.size(), 1u);
  EXPECT_EQ(plan.blocks_reused_free, 0);  // still held by seq 0
  EXPECT_EQ(m->stats().blocks_used, 4);
  EXPECT_EQ(m->stats().prefix_queries, 2);
  EXPECT_EQ(m->stats().prefix_query_tokens, 12 + 15);
  EXPECT_EQ(m->stats().prefix_hit_tokens, 12);
  EXPECT_EQ(m->tokens(1), prompt);
  EXPECT_EQ(m->MatchPrefix(Concat(Range(101, 12), Range(7, 3))), 0);
}

TEST(KvManagerTest, LastTokenIsNeverMatched) {
  auto m = Make(Options(4, 16));
  Step(*m, 0, Range(0, 9));                   // blocks [0..3] and [4..7] are full
  EXPECT_EQ(m->MatchPrefix(Range(0, 8)), 4);  // at most 7 tokens, rounded down to one block
  EXPECT_EQ(m->MatchPrefix(Range(0, 9)), 8);
  EXPECT_EQ(m->MatchPrefix(Range(0, 1)), 0);
  const KvPlan plan = Step(*m, 1, Range(0, 8));
  EXPECT_EQ(plan.seqs[0].num_cached_tokens, 4);
  EXPECT_EQ(plan.seqs[0].first_new_pos, 4);
}

TEST(KvManagerTest, PrefixCacheOffFindsNothing) {
  auto m = Make(Options(4, 16, /*prefix_cache=*/false));
  Step(*m, 0, Range(0, 9));
  EXPECT_EQ(m->MatchPrefix(Range(0, 9)), 0);
  m->Free(0);
  EXPECT_EQ(m->stats().blocks_cached, 0);
  EXPECT_EQ(Step(*m, 1, Range(0, 9)).seqs[0].num_cached_tokens, 0);
  EXPECT_EQ(m->stats().prefix_queries, 0);
}

TEST(KvManagerTest, LazyEvictionTakesUncachedFirstThenLeastRecentlyFreed) {
  auto m = Make(Options(4, 6));
  const std::vector<int32_t> a = Range(100, 9), b = Range(200, 9), c = Range(300, 9);
  Step(*m, 0, a);  // blocks 0 1 2 (2 is partial)
  Step(*m, 1, b);  // blocks 3 4 5
  m->Free(0);
  m->Free(1);
  EXPECT_TRUE(m->CheckInvariants().ok());
  // Freed full blocks stay findable.
  EXPECT_EQ(m->stats().blocks_free, 6);
  EXPECT_EQ(m->stats().blocks_cached, 4);
  EXPECT_EQ(m->MatchPrefix(a), 8);
  EXPECT_EQ(m->MatchPrefix(b), 8);
  // Free list: [5 2 | 1 0 4 3]: partial (uncached) blocks first, then cached ones in the order
  // they were freed, each sequence tail first.
  const KvPlan plan = Step(*m, 2, c);
  EXPECT_EQ(plan.seqs[0].allocated, (std::vector<BlockId>{5, 2, 1}));
  EXPECT_EQ(m->MatchPrefix(a), 4);  // a's second block was evicted when block 1 was reused
  EXPECT_EQ(m->MatchPrefix(b), 8);
  EXPECT_EQ(m->stats().blocks_cached, 3);

  // Readmitting `a` revives block 0 from the free list. It is at the front of the free list
  // now, and must not also be handed out as a fresh block.
  const KvPlan again = PlanOne(*m, 0, a);
  ASSERT_TRUE(again.fits);
  EXPECT_EQ(again.seqs[0].reused, std::vector<BlockId>{0});
  EXPECT_EQ(again.blocks_reused_free, 1);
  EXPECT_EQ(again.blocks_needed, 2);
  EXPECT_EQ(again.seqs[0].allocated, (std::vector<BlockId>{4, 3}));
  m->Commit(again);
  EXPECT_TRUE(m->CheckInvariants().ok());
  EXPECT_EQ(m->stats().blocks_free, 0);
  EXPECT_EQ(m->stats().blocks_cached, 0);
  EXPECT_EQ(m->MatchPrefix(b), 0);
}

// Idle cached blocks leave in the reuse forecast's order, not least recently freed first: an
// opening that request after request found again outstays a one-off prompt freed after it. With
// the old order (kLeastRecentlyFreed) the opening, freed first, is the one evicted, and the next
// request with it misses.
TEST(KvManagerTest, ForecastKeepsTheBlockAboutToBeReusedWhereLeastRecentlyFreedEvictsIt) {
  const std::vector<int32_t> opening = Range(100, 5), one_off = Range(200, 5);
  const std::vector<int32_t> big = Range(300, 17);  // 5 blocks: 4 uncached free + 1 cached
  for (KvIdleBlockOrder order : {KvIdleBlockOrder::kForecast, KvIdleBlockOrder::kLeastRecentlyFreed}) {
    SCOPED_TRACE(order == KvIdleBlockOrder::kForecast ? "forecast" : "least recently freed");
    KvManagerOptions options = Options(4, 6);
    options.idle_block_order = order;
    auto m = Make(options);
    // Three requests with the opening: the second and third find its block cached.
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(Step(*m, 0, opening).seqs[0].num_cached_tokens, i == 0 ? 0 : 4);
      m->Free(0);
    }
    Step(*m, 1, one_off);
    m->Free(1);
    EXPECT_EQ(m->stats().blocks_cached, 2);
    const BlockId opening_block = PlanOne(*m, 2, opening).seqs[0].reused.at(0);
    const BlockId one_off_block = PlanOne(*m, 2, one_off).seqs[0].reused.at(0);
    const KvPlan plan = Step(*m, 2, big);
    const BlockId evicted = plan.seqs[0].allocated.back();
    if (order == KvIdleBlockOrder::kForecast) {
      EXPECT_EQ(evicted, one_off_block);
      EXPECT_EQ(m->MatchPrefix(opening), 4);
      EXPECT_EQ(m->MatchPrefix(one_off), 0);
    } else {
      EXPECT_EQ(evicted, opening_block);
      EXPECT_EQ(m->MatchPrefix(opening), 0);
      EXPECT_EQ(m->MatchPrefix(one_off), 4);
    }
    // A single allocation (a page brought back, a compressed-page slab) takes the same block a
    // plan would: the remaining cached one, in either order.
    EXPECT_EQ(m->next_free_block(),
              order == KvIdleBlockOrder::kForecast ? opening_block : one_off_block);
  }
}

// A preempted sequence's blocks (Free with resumes) are read again at its resume: they outlive a
// finished request's, though freed before them. Least recently freed first gives them up first.
TEST(KvManagerTest, AResumingSequencesBlocksOutliveAFinishedOnes) {
  const std::vector<int32_t> preempted = Range(100, 9), finished = Range(200, 9);
  for (KvIdleBlockOrder order : {KvIdleBlockOrder::kForecast, KvIdleBlockOrder::kLeastRecentlyFreed}) {
    SCOPED_TRACE(order == KvIdleBlockOrder::kForecast ? "forecast" : "least recently freed");
    KvManagerOptions options = Options(4, 6);
    options.idle_block_order = order;
    auto m = Make(options);
    Step(*m, 0, preempted);  // 2 full blocks and a partial one each
    Step(*m, 1, finished);
    m->Free(0, /*resumes=*/true);
    m->Free(1);
    EXPECT_TRUE(m->CheckInvariants().ok());
    EXPECT_EQ(m->stats().blocks_cached, 4);
    // 4 blocks: the 2 partial (uncached) ones, then 2 of the 4 cached.
    Step(*m, 2, Range(300, 13));
    const bool forecast = order == KvIdleBlockOrder::kForecast;
    EXPECT_EQ(m->MatchPrefix(preempted), forecast ? 8 : 0);
    EXPECT_EQ(m->MatchPrefix(finished), forecast ? 0 : 8);
    // Its resume (once the request that took the blocks is done) finds its whole prefix.
    m->Free(2);
    EXPECT_EQ(Step(*m, 0, preempted).seqs[0].num_cached_tokens, forecast ? 8 : 0);
  }
}

// A request whose prefix hit takes a finished request's whole chain is a conversation's next
// turn, and its blocks are judged by the conversations' history: a chat whose every turn so far
// came back (its earlier blocks revived at each turn) keeps even its newest reply's blocks (idle
// for the first time, no record of their own) over one-off requests' blocks, of which none was
// ever read again, though the last one-off was freed after the chat. Least recently freed first
// gives up the chat's reply once the one-offs freed before the chat are gone.
TEST(KvManagerTest, AConversationsNewestBlocksOutliveOneOffs) {
  for (KvIdleBlockOrder order : {KvIdleBlockOrder::kForecast, KvIdleBlockOrder::kLeastRecentlyFreed}) {
    SCOPED_TRACE(order == KvIdleBlockOrder::kForecast ? "forecast" : "least recently freed");
    KvManagerOptions options = Options(4, 24);
    options.idle_block_order = order;
    auto m = Make(options);
    std::vector<int32_t> chat;
    int32_t next_token = 1000;
    std::vector<int32_t> one_off;
    for (int turn = 0; turn < 4; ++turn) {
      // The user's line and the reply: 8 new tokens, 2 blocks; the next token is being decoded.
      chat = Concat(chat, Range(next_token, 8));
      next_token += 8;
      const KvPlan plan = Step(*m, 0, Concat(chat, {7}));
      EXPECT_EQ(plan.seqs[0].num_cached_tokens, static_cast<int64_t>(chat.size()) - 8);
      m->Free(0);
      // A one-off request after each turn, never read again: two steps (the chat's pause)
      // between turns, one after the last.
      one_off = Range(next_token, 9);
      next_token += 9;
      Step(*m, 1, one_off);
      if (turn < 3) Step(*m, 1, {7});
      m->Free(1);
    }
    // 32 chat tokens (8 blocks) and 4 one-offs (2 full blocks each) cached: 16 of 24 blocks.
    EXPECT_EQ(m->stats().blocks_cached, 16);
    // A request of 15 blocks: the 8 uncached ones, then 7 cached.
    Step(*m, 2, Range(5000, 57));
    const bool forecast = order == KvIdleBlockOrder::kForecast;
    EXPECT_EQ(m->MatchPrefix(Concat(chat, {7})), forecast ? 32 : 28);
    EXPECT_EQ(m->MatchPrefix(one_off), forecast ? 0 : 8);
  }
}

// A block whose parent's block was given new contents can never be found again (a prefix walk
// starts at the first block): it leaves before any block that can, even one whose record says
// it is less likely to be read again.
TEST(KvManagerTest, AnUnreachableBlockLeavesFirst) {
  auto m = Make(Options(4, 6));
  const std::vector<int32_t> x = Range(100, 9);  // blocks p, c and a partial one
  for (int i = 0; i < 3; ++i) {  // c found again twice: a record of reuse
    Step(*m, 0, x);
    m->Free(0);
  }
  const std::vector<int32_t> one_off = Range(200, 5);  // block z and a partial one
  Step(*m, 1, one_off);
  m->Free(1);
  // Another request with p's tokens revives p, then loses its identity (a page of it came back
  // damaged): p is freed without a prefix, the first block taken.
  Step(*m, 2, Concat(Range(100, 4), Range(300, 5)));
  m->DropIdentity(2, 0);
  m->Free(2);
  EXPECT_EQ(m->MatchPrefix(x), 0);
  EXPECT_EQ(m->stats().blocks_cached, 2);  // c and z
  // The 4 uncached blocks, p among them: c's parent now holds other tokens.
  Step(*m, 3, Range(400, 13));
  // One more block: c, though it was read again twice and z never was.
  Step(*m, 4, Range(500, 3));
  EXPECT_EQ(m->MatchPrefix(one_off), 4);
  EXPECT_EQ(m->stats().blocks_cached, 1);
}

// next_free_block() (what Reattach and AcquireRawBlock take) and a plan agree on the forecast's
// choice among idle cached blocks.
TEST(KvManagerTest, SingleAllocationsTakeTheForecastsChoiceToo) {
  const std::vector<int32_t> opening = Range(100, 5), one_off = Range(200, 5);
  auto m = Make(Options(4, 4));
  for (int i = 0; i < 3; ++i) {
    Step(*m, 0, opening);
    m->Free(0);
  }
  Step(*m, 1, one_off);
  m->Free(1);
  const BlockId one_off_block = PlanOne(*m, 2, one_off).seqs[0].reused.at(0);
  // Two uncached free blocks go first, then the one-off's block, not the opening's.
  EXPECT_EQ(PlanOne(*m, 2, Range(300, 9)).seqs[0].allocated.back(), one_off_block);
  const BlockId first = m->AcquireRawBlock();
  const BlockId second = m->AcquireRawBlock();
  EXPECT_EQ(m->stats().blocks_cached, 2);
  EXPECT_EQ(m->next_free_block(), one_off_block);
  EXPECT_EQ(m->AcquireRawBlock(), one_off_block);
  EXPECT_EQ(m->MatchPrefix(opening), 4);
  EXPECT_TRUE(m->CheckInvariants().ok());
  m->ReleaseRawBlock(first);
  m->ReleaseRawBlock(second);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvManagerTest, RevivedBlocksCountAgainstTheFreeList) {
  auto m = Make(Options(4, 3));
  const std::vector<int32_t> a = Range(100, 9);
  Step(*m, 0, a);
  m->Free(0);
  // 13 tokens: 2 cached blocks revived + 2 fresh > 3 free blocks.
  const KvPlan too_big = PlanOne(*m, 1, Concat(a, Range(7, 4)));
  EXPECT_FALSE(too_big.fits);
  EXPECT_EQ(too_big.blocks_reused_free, 2);
  EXPECT_EQ(too_big.blocks_needed, 2);
  EXPECT_EQ(too_big.blocks_free, 3);
  // 11 tokens: 2 revived + 1 fresh fits exactly.
  const KvPlan exact = Step(*m, 1, Concat(a, Range(7, 2)));
  EXPECT_EQ(exact.seqs[0].reused, (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(exact.seqs[0].allocated, std::vector<BlockId>{2});
  EXPECT_EQ(m->stats().blocks_free, 0);
}

TEST(KvManagerTest, TwoAdmissionsShareARevivedBlockInOnePlan) {
  auto m = Make(Options(4, 4));
  const std::vector<int32_t> a = Range(100, 5);
  Step(*m, 0, a);
  m->Free(0);
  const std::vector<int32_t> x = Concat(Range(100, 4), {1, 2}), y = Concat(Range(100, 4), {3});
  const KvSeqStep steps[] = {{1, x}, {2, y}};
  const KvPlan plan = m->Plan(steps);
  ASSERT_TRUE(plan.fits);
  EXPECT_EQ(plan.blocks_reused_free, 1);
  EXPECT_EQ(plan.seqs[0].reused, std::vector<BlockId>{0});
  EXPECT_EQ(plan.seqs[1].reused, std::vector<BlockId>{0});
  EXPECT_EQ(plan.seqs[0].allocated.size() + plan.seqs[1].allocated.size(), 2u);
  m->Commit(plan);
  EXPECT_TRUE(m->CheckInvariants().ok());
  EXPECT_EQ(m->stats().blocks_used, 3);
  EXPECT_EQ(m->stats().prefix_hit_tokens, 8);
}

TEST(KvManagerTest, ForkThenAppendCopiesTheSharedPartialBlock) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 6));  // block 0 full, block 1 holds 2 tokens
  m->Fork(0, 1);
  EXPECT_TRUE(m->CheckInvariants().ok());
  EXPECT_EQ(m->block_table(1), m->block_table(0));
  EXPECT_EQ(m->tokens(1), m->tokens(0));
  EXPECT_EQ(m->stats().blocks_used, 2);

  const KvPlan plan = Step(*m, 1, {42});
  const KvPlan::SeqPlan& sp = plan.seqs[0];
  EXPECT_EQ(sp.cow_src, 1);
  EXPECT_NE(sp.cow_dst, kNoBlock);
  EXPECT_TRUE(sp.allocated.empty());
  EXPECT_EQ(sp.blocks_needed, 1);
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.copies[0].src, 1);
  EXPECT_EQ(plan.copies[0].dst, sp.cow_dst);
  // The tables diverge only in the written block; the full block stays shared.
  EXPECT_EQ(m->block_table(0), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(m->block_table(1), (std::vector<BlockId>{0, sp.cow_dst}));
  EXPECT_EQ(m->stats().blocks_used, 3);
  EXPECT_EQ(m->tokens(0), Range(0, 6));
  EXPECT_EQ(m->tokens(1), Concat(Range(0, 6), {42}));
  // The parent is alone in block 1 now: it writes in place.
  const KvPlan parent = Step(*m, 0, {43});
  EXPECT_EQ(parent.seqs[0].cow_src, kNoBlock);
  EXPECT_TRUE(parent.copies.empty());
}

TEST(KvManagerTest, ForkedSequencesAppendingTogetherCopyOnce) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 6));
  m->Fork(0, 1);
  m->Fork(0, 2);
  const std::vector<int32_t> t0 = {7}, t1 = {8}, t2 = {9};
  const KvSeqStep steps[] = {{0, t0}, {1, t1}, {2, t2}};
  const KvPlan plan = m->Plan(steps);
  ASSERT_TRUE(plan.fits);
  // Three holders: two copies; the last one keeps the original block.
  EXPECT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(plan.seqs[2].cow_src, kNoBlock);
  m->Commit(plan);
  EXPECT_TRUE(m->CheckInvariants().ok());
  EXPECT_EQ(m->block_table(2)[1], 1);
  EXPECT_EQ(m->stats().blocks_used, 4);
}

TEST(KvManagerTest, ForkAtABlockBoundaryNeedsNoCopy) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 8));
  m->Fork(0, 1);
  const KvPlan plan = Step(*m, 1, {5});
  EXPECT_TRUE(plan.copies.empty());
  EXPECT_EQ(plan.seqs[0].allocated.size(), 1u);
  EXPECT_EQ(m->stats().blocks_used, 3);
}

TEST(KvManagerTest, FreeReleasesTailBeforePrefix) {
  auto m = Make(Options(4, 6));
  const std::vector<int32_t> a = Range(100, 13);  // blocks 0 1 2 full, 3 partial
  Step(*m, 0, a);
  Step(*m, 1, Range(500, 5));  // blocks 4 5
  m->Free(0);
  // Free list [3 | 2 1 0]: the partial block first, then the tail before the prefix.
  const KvPlan plan = Step(*m, 2, Range(900, 8));
  EXPECT_EQ(plan.seqs[0].allocated, (std::vector<BlockId>{3, 2}));
  EXPECT_EQ(m->MatchPrefix(a), 8);
  EXPECT_EQ(m->stats().blocks_cached, 2);
}

// A hash that depends only on the sum of the block's token ids: [1, 2] and [2, 1] collide, and
// so do the chains that start with them.
uint64_t SumHash(uint64_t /*parent_hash*/, std::span<const int32_t> tokens) {
  uint64_t sum = 0;
  for (int32_t t : tokens) sum += static_cast<uint32_t>(t);
  return sum;
}

uint64_t ConstantHash(uint64_t, std::span<const int32_t>) { return 7; }

TEST(KvManagerTest, HashCollisionsNeverGiveFalseHits) {
  KvManagerOptions options = Options(2, 16);
  options.block_hash_for_testing = &SumHash;
  auto m = Make(options);
  Step(*m, 0, {1, 2, 9});        // [1 2] is indexed
  Step(*m, 1, {2, 1, 5, 6, 9});  // [2 1] collides (stays unindexed); [5 6] is indexed
  // The block tokens differ: no hit on [2 1].
  EXPECT_EQ(m->MatchPrefix(std::vector<int32_t>{2, 1, 5, 6, 7}), 0);
  // [1 2] matches; [5 6] has the same hash and parent hash as the query's second block but
  // follows [2 1], not [1 2]: no hit.
  EXPECT_EQ(m->MatchPrefix(std::vector<int32_t>{1, 2, 5, 6, 7}), 2);
  const KvPlan plan = Step(*m, 2, {1, 2, 5, 6, 7});
  EXPECT_EQ(plan.seqs[0].reused, std::vector<BlockId>{m->block_table(0).front()});
  EXPECT_EQ(plan.seqs[0].num_cached_tokens, 2);

  KvManagerOptions constant = Options(2, 16);
  constant.block_hash_for_testing = &ConstantHash;
  auto c = Make(constant);
  Step(*c, 0, {1, 2, 3, 4, 5});
  EXPECT_EQ(c->MatchPrefix(std::vector<int32_t>{1, 2, 3, 4, 5}), 2);
  EXPECT_EQ(c->MatchPrefix(std::vector<int32_t>{3, 4, 1, 2, 5}), 0);
  EXPECT_EQ(c->MatchPrefix(std::vector<int32_t>{1, 2, 1, 2, 5}), 2);
}

TEST(KvManagerTest, DuplicatePrefixesChainThroughTheIndexedCopy) {
  auto m = Make(Options(4, 16));
  const std::vector<int32_t> p = Range(100, 4);
  // Both sequences compute block [100..103] in the same step: only the first is indexed.
  const std::vector<int32_t> a = Concat(p, {1}), b = Concat(p, {2});
  const KvSeqStep steps[] = {{0, a}, {1, b}};
  const KvPlan plan = m->Plan(steps);
  m->Commit(plan);
  // b's next full block must still be findable behind the indexed copy of the first block.
  Step(*m, 1, Range(3, 3));
  const std::vector<int32_t> follow_up = Concat(Concat(Concat(p, {2}), Range(3, 3)), {77});
  EXPECT_EQ(m->MatchPrefix(follow_up), 8);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvManagerTest, TruncateLetsTheLaterBlocksGoAndTheSequenceGoesOnFromThere) {
  auto m = Make(Options(4, 8));
  Step(*m, 0, Range(0, 14));  // blocks of 4: three full, one with 2 tokens
  ASSERT_EQ(m->block_table(0).size(), 4u);
  const std::vector<BlockId> kept(m->block_table(0).begin(), m->block_table(0).begin() + 2);
  m->Truncate(0, 8);
  EXPECT_EQ(m->block_table(0), kept);
  EXPECT_EQ(m->tokens(0), Range(0, 8));
  EXPECT_EQ(m->stats().blocks_used, 2);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  // The full block let go stays findable (its tokens are what the index says); the sequence
  // then grows from token 8 with other tokens.
  EXPECT_EQ(m->MatchPrefix(Range(0, 13)), 12);
  const KvPlan grow = Step(*m, 0, Range(50, 5));
  EXPECT_EQ(grow.seqs[0].first_new_pos, 8);
  EXPECT_EQ(m->tokens(0), Concat(Range(0, 8), Range(50, 5)));
  EXPECT_EQ(m->block_table(0).size(), 4u);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

}  // namespace
}  // namespace kvl
