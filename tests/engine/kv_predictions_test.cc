// The cost model's predictions checked, and the page-access trace, on a real run: eight
// sequences under a budget that holds about three, pages demoted to a RAM tier and promoted back.
// Every page brought back records its (predicted, measured) pair; the reported percentiles are
// finite, ordered, and the same as those of the pairs the trace recorded; the trace holds the
// run's reads, departures and returns, and replays.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <map>

#include "engine/prediction_error.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "kvl/kv_price_feedback.h"
#include "kvl/kv_trace.h"
#include "kvl/kv_trace_replay.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;

EngineOptions PressureOptions(const std::string& trace_path) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.context_length = 256;
  // One token a step: the trace's steps-left forecast is exact then, and the two engines of the
  // feedback test make the same decisions (speculation's draft lengths follow measured times).
  o.spec = "off";
  o.max_seqs = 8;
  o.kv_budget_bytes = 40 * kPageBytes;  // about three of the eight sequences
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.kv_policy = "demote";
  testing::SetTiersBesidePool(&o, {"ram:64MiB"});
  o.kv_trace_path = trace_path;
  o.kv_trace_opener = OpenKvTraceFile;
  // Without the prefix cache there is no KV store: demoted pages are promoted back into the pool
  // at resume (with it, the RAM tier's pages are read in place and never come back).
  o.prefix_cache = false;
  o.profile_path = testing::ProcessProfilePath();
  return o;
}

EngineMetrics RunStories(Engine& e, int32_t n) {
  for (const std::string& prompt : testing::StoryPrompts()) {
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    EXPECT_TRUE(e.Submit(r, [](const TokenEvent& ev) {
                   EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                 }).ok());
  }
  e.RunUntilIdle();
  return e.Metrics();
}

void ExpectSane(const KvPredictionError& e, const std::string& what) {
  EXPECT_TRUE(std::isfinite(e.median_pct) && std::isfinite(e.p90_pct)) << what;
  EXPECT_GE(e.median_pct, 0) << what;
  EXPECT_LE(e.median_pct, e.p90_pct) << what;
  EXPECT_GT(e.median_ratio, 0) << what;
}

// The runtime writes no trace of its own (the trace library is not part of it): a path with no
// recorder to open it is refused at creation, naming the flag, rather than silently ignored.
TEST(KvPredictionsTest, ATracePathWithNoRecorderIsRefused) {
  const std::string trace_path =
      ::testing::TempDir() + "/kvl-no-recorder-" + std::to_string(getpid()) + ".trace";
  EngineOptions o = PressureOptions(trace_path);
  o.kv_trace_opener = nullptr;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--kv-trace"), std::string::npos) << e.status().ToString();
  EXPECT_NE(access(trace_path.c_str(), F_OK), 0);  // no file was created
}

TEST(KvPredictionsTest, RestoredPagesReportTheirPredictionErrorAndTheTraceAgrees) {
  const std::string trace_path =
      ::testing::TempDir() + "/kvl-predictions-" + std::to_string(getpid()) + ".trace";
  EngineMetrics m;
  {
    StatusOr<std::unique_ptr<Engine>> e = Engine::Create(PressureOptions(trace_path));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    m = RunStories(**e, 200);
  }  // the engine closes the trace
  ASSERT_GT(m.preemptions, 0);
  const KvActionCounter& ram = m.kv_actions[static_cast<size_t>(KvAction::kDemoteRam)];
  ASSERT_GT(ram.pages_restored, 0);
  ASSERT_LT(ram.pages_restored, static_cast<int64_t>(PredictionWindow::kCapacity));
  // Every restored page measured (a restore takes microseconds at least), none beyond the window.
  EXPECT_EQ(ram.error.samples, ram.pages_restored);
  ExpectSane(ram.error, "demote-ram");
  for (const KvActionCounter& c : m.kv_actions) {
    EXPECT_LE(c.error.samples, c.pages_restored);
    if (c.error.samples > 0) ExpectSane(c.error, "an action");
  }
  for (const KvTierMetrics& t : m.kv_tiers) {
    EXPECT_EQ(t.promote_error.samples, t.blocks_promoted) << t.name;
    if (t.promote_error.samples > 0) ExpectSane(t.promote_error, t.name);
  }

  StatusOr<KvTrace> trace = ReadKvTrace(trace_path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->header.block_tokens, 16);
  EXPECT_GT(trace->header.pool_blocks, 0);
  EXPECT_GT(trace->header.price_ms[static_cast<size_t>(KvAction::kDemoteRam)], 0);
  // The pairs the trace recorded (B lines) are the ones the metrics summarized: the same count
  // and, to the trace's 6 significant digits, the same percentiles.
  std::vector<PredictionPair> pairs;
  int64_t steps = 0, reads = 0, preempted = 0, back = 0;
  for (const KvTraceEvent& ev : trace->events) {
    steps += ev.kind == KvTraceEvent::Kind::kStep;
    reads += ev.kind == KvTraceEvent::Kind::kRead;
    preempted += ev.kind == KvTraceEvent::Kind::kLeave && ev.cause == KvTraceCause::kPreempt;
    if (ev.kind != KvTraceEvent::Kind::kBack) continue;
    ++back;
    if (ev.action == static_cast<int>(KvAction::kDemoteRam)) {
      pairs.push_back({ev.predicted_ms, ev.measured_ms});
    }
  }
  EXPECT_GE(steps, m.steps);
  EXPECT_GT(reads, 0);
  // Every read says how many steps its request may still take (what the reuse forecast knows):
  // at most the tokens asked for, and none after a request's last step (EOS is ignored here).
  std::map<int64_t, int64_t> last_steps_left;
  for (const KvTraceEvent& ev : trace->events) {
    if (ev.kind != KvTraceEvent::Kind::kRead) continue;
    EXPECT_GE(ev.steps_left, 0);
    EXPECT_LT(ev.steps_left, 200);
    last_steps_left[ev.request] = ev.steps_left;
  }
  EXPECT_EQ(last_steps_left.size(), testing::StoryPrompts().size());
  for (const auto& [request, left] : last_steps_left) EXPECT_EQ(left, 0) << request;
  EXPECT_GT(preempted, 0);
  int64_t restored = 0;
  for (int a = 0; a < kNumKvActions; ++a) {
    if (a != static_cast<int>(KvAction::kRecomputeTokens)) {
      restored += m.kv_actions[static_cast<size_t>(a)].pages_restored;
    }
  }
  EXPECT_EQ(back, restored);  // every page promoted back, by preemption's restore or the store
  const KvPredictionError from_trace = SummarizePredictions(pairs);
  EXPECT_EQ(from_trace.samples, ram.error.samples);
  EXPECT_NEAR(from_trace.median_pct, ram.error.median_pct, 1e-3 * (1 + ram.error.median_pct));
  EXPECT_NEAR(from_trace.p90_pct, ram.error.p90_pct, 1e-3 * (1 + ram.error.p90_pct));

  // The trace replays: every read accounted for, Belady at most any other policy, and the
  // engine's own decisions brought back exactly the pages the B lines name.
  const std::vector<KvTraceAccess> accesses = KvTraceAccesses(*trace);
  KvReplayOptions o;
  o.capacity_pages = trace->header.pool_blocks;
  o.miss_ms = 1;
  const KvReplayResult opt = ReplayKvTrace(*trace, accesses, KvReplayPolicy::kBelady, o);
  EXPECT_EQ(opt.accesses, static_cast<int64_t>(accesses.size()));
  for (KvReplayPolicy p :
       {KvReplayPolicy::kPolicy, KvReplayPolicy::kLru, KvReplayPolicy::kLfu}) {
    const KvReplayResult r = ReplayKvTrace(*trace, accesses, p, o);
    EXPECT_LE(opt.misses, r.misses) << r.policy;
    EXPECT_EQ(r.cold, opt.cold);
  }
  const KvRecordedResult recorded = ReplayRecordedDecisions(*trace, 1);
  EXPECT_EQ(recorded.brought_back, back);
  EXPECT_EQ(recorded.replay.cold, opt.cold);
  EXPECT_EQ(recorded.lost_reads, 0);  // demotion is lossless
  // Running sequences' pages demoted to the RAM tier are read from outside the pool at every step.
  EXPECT_GT(recorded.streamed_reads, 0);
  EXPECT_EQ(recorded.replay.misses,
            recorded.brought_back + recorded.streamed_reads + recorded.recomputed);
}

// A profile that prices the RAM tier far too fast (as one measured on a quiet machine and used on
// a busy one would, only more so): the engine's own measurements correct it. With the feedback
// the predictions the engine checks come out much closer to what restores take than without.
TEST(KvPredictionsTest, MeasuredBringBackTimesCorrectAMispricedProfile) {
  auto make = [](bool feedback) {
    EngineOptions o = PressureOptions("");
    MachineProfile optimistic;
    optimistic.model.layers = 5;
    optimistic.recompute_from_tokens.token_layer_ms = 1.0;  // never the cheaper way back
    optimistic.memory_copy_gbps = 1000;                     // a RAM read at 1 TB/s
    optimistic.ram.read.gbps = optimistic.ram.write.gbps = 1000;
    o.cost_profile = optimistic;
    o.kv_feedback = feedback;
    StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(e).value();
  };
  std::unique_ptr<Engine> without = make(false), with = make(true);
  // A page's prediction is made when it leaves, so the first round's pages all leave before
  // anything came back: the corrections reach the pages of the rounds after it. The two engines
  // take turns, round by round, so that a core taken by something else (a test beside this one)
  // slows the restores of both alike: the ratios compared are measured over the same moments.
  EngineMetrics fixed_metrics, corrected_metrics;
  for (int round = 0; round < 4; ++round) {
    fixed_metrics = RunStories(*without, 200);
    corrected_metrics = RunStories(*with, 200);
  }
  auto demote_ram = [](const EngineMetrics& m) {
    return m.kv_actions[static_cast<size_t>(KvAction::kDemoteRam)].error;
  };
  const KvPredictionError fixed = demote_ram(fixed_metrics);
  const KvPredictionError corrected = demote_ram(corrected_metrics);
  ASSERT_GT(fixed.samples, 0);
  ASSERT_EQ(corrected.samples, fixed.samples);  // the same decisions, only priced differently
  // 20 KiB at 1 TB/s is 0.02 us; a restore takes microseconds: the fixed profile is off by far
  // more than the largest correction (4x), so the corrected one is still optimistic, by less.
  EXPECT_GT(fixed.median_ratio, 2 * BringBackFeedback::kMaxScale);
  EXPECT_LT(corrected.median_ratio, fixed.median_ratio / 2)
      << "fixed " << fixed.median_ratio << ", corrected " << corrected.median_ratio;
}

// Without --kv-trace nothing is written and the step loop only tests a pointer; a trace path
// that cannot be created fails Create with the flag named.
TEST(KvPredictionsTest, UnwritableTraceFailsCreate) {
  EngineOptions o = PressureOptions("/nonexistent-dir/kvl.trace");
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--kv-trace"), std::string::npos) << e.status().ToString();
}

}  // namespace
}  // namespace kvl
