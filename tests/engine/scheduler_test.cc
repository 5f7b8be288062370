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

#include "engine/scheduler.h"
#include "kvl/kv_tier.h"

namespace kvl {
namespace {

constexpr int32_t kBlock = 4;
constexpr int32_t kNextToken = 7;

std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

int64_t Pages(const EngineMetrics& m, KvAction action) {
  return m.kv_actions[static_cast<size_t>(action)].pages;
}

struct PoolSetup {
  int64_t num_blocks = 32;
  int64_t max_batch_tokens = 8;
  int32_t max_seqs = 4;
  std::string policy = "auto";
  std::string quality = "lossless";
  bool ram_tier = false;
  bool ram_zstd = false;  // compressed: pages streamed from it are staged, not read in place
  int64_t recent_tokens = 0;
  int64_t sink_tokens = 0;
  int64_t staged_pages = 16;  // pages streamed from the tier at once
};

// The test's prices: RAM reads at 10 GB/s, a page recomputed from its tokens in 1 ms.
class FixedPrices final : public KvPriceSource {
 public:
  Status PagePrices(const Query&, PageCostProfile* prices) override {
    prices->ram_gbps = 10;
    prices->recompute_tokens_ms = 1;
    return Status::Ok();
  }
  StatusOr<double> MeasureRemoteReadMs(const TierSpec&, int64_t, int64_t) override {
    return UnimplementedError("no remote tier here");
  }
};

class SchedulerHarness {
 public:
  explicit SchedulerHarness(const PoolSetup& s) {
    KvMemoryOptions o;
    o.block_tokens = kBlock;
    o.num_layers = 2;
    o.kv_dim = 4;
    o.dim = 64;  // wider than K+V: no residual checkpoints in the blocks
    o.context_length = 1024;
    o.max_seqs = s.max_seqs;
    o.pool_blocks = s.num_blocks;
    o.staged_pages = s.staged_pages;
    o.policy = ParseKvPolicy(s.policy).value();
    o.quality = ParseKvQuality(s.quality).value();
    if (s.ram_tier) {
      TierSpec ram;
      ram.kind = TierKind::kRam;
      ram.capacity_bytes = 64 << 20;
      ram.compress = s.ram_zstd;
      o.tiers.push_back(ram);
    }
    o.sink_tokens = s.sink_tokens;
    o.recent_tokens = s.recent_tokens;
    FixedPrices prices;
    memory_ = std::move(KvMemory::Create(o, &prices).value());
    scheduler_ = std::make_unique<Scheduler>(SchedulerOptions{s.max_batch_tokens, s.max_seqs},
                                             *memory_, metrics_);
  }

  // A request for `prompt` that generates `max_new` tokens; its events are kept by id.
  RequestId Submit(std::vector<int32_t> prompt, int32_t max_new) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id_++;
    seq->tokens = std::move(prompt);
    seq->tokens.reserve(1024);
    seq->num_prompt = static_cast<int64_t>(seq->tokens.size());
    seq->request.max_new_tokens = max_new;
    const RequestId id = seq->id;
    seq->on_event = [this](const TokenEvent& e) {
      if (e.finished) finished_[e.request] = e;
    };
    scheduler_->Enqueue(std::move(seq));
    return id;
  }

  // Plans a step and carries it out the way StepRunner does, minus the model. False when idle.
  bool Step() {
    scheduler_->ReleaseFinished();
    if (!scheduler_->Schedule(&plan_)) return false;
    last_steps_.clear();
    for (size_t i = 0; i < plan_.seqs.size(); ++i) {
      last_steps_.push_back({plan_.seqs[i]->id, static_cast<int64_t>(plan_.steps[i].tokens.size()),
                             plan_.kv.seqs[i].admit});
    }
    // The KV side of StepRunner::FillBatch, through the real door: blocks, admissions, store
    // pages read in place, restores and settling are KvMemory::Apply's.
    kv_seqs_.clear();
    for (Sequence* seq : plan_.seqs) kv_seqs_.push_back({&seq->kv_pages, seq->id, -1});
    memory_->Apply(plan_.kv, kv_seqs_, &applied_);
    restored_pages_ += static_cast<int64_t>(applied_.brought_back.size());
    for (size_t i = 0; i < plan_.seqs.size(); ++i) {
      Sequence& seq = *plan_.seqs[i];
      const KvPlan::SeqPlan& sp = plan_.kv.seqs[i];
      const int64_t n = static_cast<int64_t>(plan_.steps[i].tokens.size());
      if (sp.admit) in_place_pages_ += sp.in_place_blocks;
      seq.num_computed = sp.admit ? n : seq.num_computed + n;
      if (seq.num_computed != static_cast<int64_t>(seq.tokens.size())) continue;
      if (seq.num_generated == seq.request.max_new_tokens) {
        scheduler_->Finish(seq, FinishReason::kLength);
        continue;
      }
      seq.tokens.push_back(kNextToken);
      ++seq.num_generated;
    }
    scheduler_->ReleaseFinished();
    return true;
  }

  void RunUntilIdle(int max_steps = 10000) {
    for (int i = 0; i < max_steps && Step(); ++i) {
    }
  }

  struct PlannedStep {
    RequestId id;
    int64_t tokens;
    bool admit;
    bool operator==(const PlannedStep&) const = default;
  };
  const std::vector<PlannedStep>& last_steps() const { return last_steps_; }
  const std::map<RequestId, TokenEvent>& finished() const { return finished_; }
  int64_t restored_pages() const { return restored_pages_; }
  int64_t in_place_pages() const { return in_place_pages_; }
  Scheduler& scheduler() { return *scheduler_; }
  const KvManager& kv() { return memory_->manager(); }
  EngineMetrics metrics() const {
    EngineMetrics m;
    metrics_.Snapshot(&m);
    return m;
  }

 private:
  std::unique_ptr<KvMemory> memory_;
  MetricsRecorder metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  StepPlan plan_;
  std::vector<KvStepSeq> kv_seqs_;
  KvApplied applied_;
  RequestId next_id_ = 1;
  int64_t restored_pages_ = 0;
  int64_t in_place_pages_ = 0;
  std::vector<PlannedStep> last_steps_;
  std::map<RequestId, TokenEvent> finished_;
};

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

}  // namespace
}  // namespace kvl
