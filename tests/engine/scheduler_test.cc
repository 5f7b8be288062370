// The scheduler on a model-free pool: no GGUF, no forward pass, no tokenizer, no sampler. A fake
// step runner commits each plan, marks the planned tokens computed and appends a fixed token to
// every sequence that finished its step, so what is checked is only the scheduling: the order of
// work in a step, chunked prefill, admission limits, preemption, the KV lattice under pressure,
// cancellation and requests that can never fit.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "scheduler_harness.h"

namespace kvl {
namespace {

using testing_scheduler::kBlock;
using testing_scheduler::kNextToken;
using testing_scheduler::Pages;
using testing_scheduler::PoolSetup;
using testing_scheduler::SchedulerHarness;
using testing_scheduler::Tokens;

using Planned = SchedulerHarness::PlannedStep;

TEST(SchedulerTest, LongPromptIsChunkedToTheBatchBudget) {
  SchedulerHarness h(PoolSetup{});
  const RequestId a = h.Submit(Tokens(100, 20), 2);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.last_steps(), (std::vector<Planned>{{a, 8, true}}));
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.last_steps(), (std::vector<Planned>{{a, 8, false}}));
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.last_steps(), (std::vector<Planned>{{a, 4, false}}));  // the prompt's rest
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.last_steps(), (std::vector<Planned>{{a, 1, false}}));  // a decode
  h.RunUntilIdle();
  ASSERT_EQ(h.finished().count(a), 1u);
  EXPECT_EQ(h.finished().at(a).finish_reason, "length");
  EXPECT_EQ(h.finished().at(a).generated_tokens, 2);
}

TEST(SchedulerTest, DecodesFirstThenPrefillChunksThenAdmissionsInOrder) {
  SchedulerHarness h(PoolSetup{});
  const RequestId a = h.Submit(Tokens(0, 3), 10);
  ASSERT_TRUE(h.Step());  // a's prompt
  const RequestId b = h.Submit(Tokens(50, 12), 10);
  ASSERT_TRUE(h.Step());  // a decodes, b's first chunk takes the rest of the budget
  EXPECT_EQ(h.last_steps(), (std::vector<Planned>{{a, 1, false}, {b, 7, true}}));
  const RequestId c = h.Submit(Tokens(200, 3), 10);
  const RequestId d = h.Submit(Tokens(300, 3), 10);
  ASSERT_TRUE(h.Step());  // decode a, b's remaining 5 prompt tokens, then c; d waits (budget)
  EXPECT_EQ(h.last_steps(),
            (std::vector<Planned>{{a, 1, false}, {b, 5, false}, {c, 2, true}}));
  ASSERT_TRUE(h.Step());
  // Decodes of a and b first, then c's last prompt token, then d (FIFO).
  EXPECT_EQ(h.last_steps(),
            (std::vector<Planned>{{a, 1, false}, {b, 1, false}, {c, 1, false}, {d, 3, true}}));
  h.RunUntilIdle();
  EXPECT_EQ(h.finished().size(), 4u);
}

TEST(SchedulerTest, NoMoreThanMaxSeqsRunAtOnce) {
  PoolSetup s;
  s.max_seqs = 2;
  s.max_batch_tokens = 64;
  SchedulerHarness h(s);
  for (int i = 0; i < 5; ++i) h.Submit(Tokens(i * 10, 3), 4);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.last_steps().size(), 2u);
  EXPECT_EQ(h.scheduler().num_running(), 2);
  EXPECT_EQ(h.scheduler().num_waiting(), 3);
  h.RunUntilIdle();
  EXPECT_EQ(h.finished().size(), 5u);
  EXPECT_EQ(h.kv().stats().num_seqs, 0);
}

TEST(SchedulerTest, ShortPoolPreemptsTheNewestSequenceWhichResumesAndFinishes) {
  // 8 blocks of 4 tokens; two sequences of 6 prompt tokens generating 12 each need 5 blocks
  // apiece: they cannot both finish without one of them leaving the pool.
  PoolSetup s;
  s.num_blocks = 8;
  s.max_batch_tokens = 16;
  s.policy = "recompute-tokens";
  SchedulerHarness h(s);
  const RequestId a = h.Submit(Tokens(0, 6), 12);
  const RequestId b = h.Submit(Tokens(100, 6), 12);
  bool b_preempted = false;
  for (int i = 0; i < 200 && h.Step(); ++i) {
    if (h.scheduler().num_waiting() == 1 && h.scheduler().num_running() == 1) {
      b_preempted = true;
      // The newest admission went back to the waiting queue; the oldest keeps running alone.
      EXPECT_EQ(h.last_steps().front().id, a);
    }
  }
  EXPECT_TRUE(b_preempted);
  EXPECT_GE(h.metrics().preemptions, 1);
  // Its full pages were dropped, to be recomputed from their tokens at resume.
  EXPECT_GT(Pages(h.metrics(), KvAction::kRecomputeTokens), 0);
  for (RequestId id : {a, b}) {
    ASSERT_EQ(h.finished().count(id), 1u);
    EXPECT_EQ(h.finished().at(id).finish_reason, "length");
    EXPECT_EQ(h.finished().at(id).generated_tokens, 12);
  }
  EXPECT_EQ(h.kv().stats().blocks_used, 0);
}

TEST(SchedulerTest, PreemptedPagesDemotedToRamComeBackInsteadOfBeingComputed) {
  PoolSetup s;
  s.num_blocks = 8;
  s.max_batch_tokens = 16;
  s.policy = "demote";
  s.ram_tier = true;
  s.sink_tokens = 1024;  // running pages never move: only preemption demotes here
  SchedulerHarness h(s);
  h.Submit(Tokens(0, 6), 12);
  const RequestId b = h.Submit(Tokens(100, 9), 12);
  h.RunUntilIdle();
  const EngineMetrics m = h.metrics();
  EXPECT_GE(m.preemptions, 1);
  const KvActionCounter& demoted = m.kv_actions[static_cast<size_t>(KvAction::kDemoteRam)];
  EXPECT_GT(demoted.pages, 0);
  // At resume the scheduler plans those pages as brought back, not computed: promoted from the
  // tier, or (the KV store files them in the RAM tier) read where they lie.
  EXPECT_GT(h.restored_pages() + h.in_place_pages(), 0);
  EXPECT_EQ(h.finished().at(b).generated_tokens, 12);
  EXPECT_EQ(h.finished().size(), 2u);
}

TEST(SchedulerTest, RunningSequenceOutgrowingThePoolPagesInsteadOfFailing) {
  // One sequence of 40 tokens in a pool of 6 blocks (24 tokens): with a RAM tier its cold pages
  // are streamed from the tier while it runs; no preemption, no error.
  PoolSetup s;
  s.num_blocks = 6;
  s.policy = "demote";
  s.ram_tier = true;
  s.recent_tokens = 4;
  SchedulerHarness h(s);
  const RequestId a = h.Submit(Tokens(0, 8), 32);
  h.RunUntilIdle();
  ASSERT_EQ(h.finished().count(a), 1u);
  EXPECT_EQ(h.finished().at(a).finish_reason, "length");
  EXPECT_EQ(h.finished().at(a).generated_tokens, 32);
  const EngineMetrics m = h.metrics();
  EXPECT_EQ(m.preemptions, 0);
  EXPECT_GE(Pages(m, KvAction::kDemoteRam), 4);
}

TEST(SchedulerTest, StreamingStopsWhereTheReservedStagingIsFullAndStderrSaysSo) {
  PoolSetup s;
  s.num_blocks = 6;
  s.policy = "demote";
  s.ram_tier = true;
  s.ram_zstd = true;
  s.recent_tokens = 4;
  s.staged_pages = 2;
  SchedulerHarness h(s);
  ::testing::internal::CaptureStderr();
  const RequestId a = h.Submit(Tokens(0, 8), 32);
  h.RunUntilIdle();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(h.finished().count(a), 1u);
  const TokenEvent& e = h.finished().at(a);
  // As far as the pool and the staging go: 6 blocks of 4 tokens and 2 staged pages.
  EXPECT_EQ(e.finish_reason, "kv_pressure") << e.error.ToString();
  EXPECT_EQ(e.generated_tokens, 33 - 8);
  EXPECT_EQ(Pages(h.metrics(), KvAction::kDemoteRam), 2);
  EXPECT_NE(log.find("--kv-stream-reserve"), std::string::npos) << log;
}

TEST(SchedulerTest, PagesReadInPlaceFromRamNeedNoStagingAndTheSequenceGoesOn) {
  // The same sequence with an uncompressed RAM tier: attention reads its pages where they lie,
  // so the two staged pages do not limit it and it runs to its length.
  PoolSetup s;
  s.num_blocks = 6;
  s.policy = "demote";
  s.ram_tier = true;
  s.recent_tokens = 4;
  s.staged_pages = 2;
  SchedulerHarness h(s);
  const RequestId a = h.Submit(Tokens(0, 8), 32);
  h.RunUntilIdle();
  ASSERT_EQ(h.finished().count(a), 1u);
  EXPECT_EQ(h.finished().at(a).finish_reason, "length") << h.finished().at(a).error.ToString();
  EXPECT_GT(Pages(h.metrics(), KvAction::kDemoteRam), 2);
}

// (Engine::Submit refuses such a request up front; the harness submits past it.) A sequence that
// outgrows the pool ends where it got to with its tokens, finish reason "kv_pressure" (not
// max_tokens' "length"), and stderr says how to go on.
TEST(SchedulerTest, WithoutAnyWayToPageALoneSequenceThatOutgrowsThePoolEndsAtKvPressure) {
  PoolSetup s;
  s.num_blocks = 4;
  SchedulerHarness h(s);
  ::testing::internal::CaptureStderr();
  const RequestId a = h.Submit(Tokens(0, 8), 32);
  h.RunUntilIdle();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(h.finished().count(a), 1u);
  const TokenEvent& e = h.finished().at(a);
  EXPECT_EQ(e.finish_reason, "kv_pressure") << e.error.ToString();
  EXPECT_GT(e.generated_tokens, 0);
  EXPECT_LT(e.generated_tokens, 32);
  EXPECT_NE(log.find("--kv-budget"), std::string::npos) << log;
  EXPECT_NE(log.find("--kv-tier"), std::string::npos) << log;
}

TEST(SchedulerTest, PromptLargerThanThePoolFailsWithoutBlockingOthers) {
  PoolSetup s;
  s.num_blocks = 4;
  s.max_batch_tokens = 64;
  SchedulerHarness h(s);
  const RequestId big = h.Submit(Tokens(0, 30), 2);
  const RequestId small = h.Submit(Tokens(100, 3), 2);
  h.RunUntilIdle();
  EXPECT_EQ(h.finished().at(big).finish_reason, "error");
  EXPECT_NE(h.finished().at(big).error.message().find("a prompt of 30 tokens"), std::string::npos);
  EXPECT_EQ(h.finished().at(small).finish_reason, "length");
}

TEST(SchedulerTest, CancelFinishesRunningAndWaitingRequestsAndFreesTheirKv) {
  PoolSetup s;
  s.max_seqs = 1;
  SchedulerHarness h(s);
  const RequestId a = h.Submit(Tokens(0, 5), 100);
  const RequestId b = h.Submit(Tokens(50, 5), 100);
  ASSERT_TRUE(h.Step());
  EXPECT_GT(h.kv().stats().blocks_used, 0);
  h.scheduler().Cancel({a, b});
  EXPECT_EQ(h.finished().at(a).finish_reason, "cancelled");
  EXPECT_EQ(h.finished().at(b).finish_reason, "cancelled");
  EXPECT_FALSE(h.Step());
  EXPECT_EQ(h.kv().stats().blocks_used, 0);
  EXPECT_TRUE(h.scheduler().idle());
}

// A cancellation or a stop waiting for the step loop (SchedulerOptions::interrupt) ends a
// Schedule call in its first pass with nothing planned; once it is taken, planning goes on.
TEST(SchedulerTest, AnInterruptEndsPlanningAtOnceAndTheNextCallPlansAsBefore) {
  std::atomic<bool> interrupt{true};
  PoolSetup s;
  s.interrupt = &interrupt;
  SchedulerHarness h(s);
  const RequestId a = h.Submit(Tokens(0, 8), 4);
  EXPECT_FALSE(h.Step());
  EXPECT_EQ(h.scheduler().last_schedule_passes(), 1);
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  EXPECT_EQ(h.scheduler().num_running(), 0);
  interrupt = false;
  h.RunUntilIdle();
  ASSERT_EQ(h.finished().count(a), 1u);
  EXPECT_EQ(h.finished().at(a).finish_reason, "length");
  EXPECT_EQ(h.finished().at(a).generated_tokens, 4);
}

}  // namespace
}  // namespace kvl
