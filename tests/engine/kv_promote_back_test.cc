// Promotion back: a running sequence's pages that went to a tier (streamed, read in place) or to
// residual checkpoints come back into the pool once another request finishes and blocks are
// free, while the sequence goes on. Lossless: its greedy tokens and their log-probabilities equal
// those of a run with room for everything, bit for bit; a failed read leaves the page where it
// was and the output stays exact; with --no-kv-promote-back the pages stay out.
#include <gtest/gtest.h>
#include <unistd.h>

#include "fixed_prices.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "page_file_corruption.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;
// The sequence followed: it ends first by its max_tokens, so relief sends its pages out first
// (fewest steps left); the other one is cancelled midway, which frees the pool.
constexpr int32_t kFollowedTokens = 300;
// Within what one sequence can reach in the smallest case (a pool of 24 blocks and 8 staged
// pages: 512 tokens), or the engine refuses it at Submit.
constexpr int32_t kOtherTokens = 480;
constexpr int32_t kCancelAt = 200;  // tokens of the followed sequence when the other goes

EngineOptions Options(int64_t budget_pages) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;  // see long_conversation_test.cc: a 2-thread pool spins on a busy machine
  o.context_length = 1100;
  o.max_seqs = 2;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.kv_stream_reserve = 0.25;
  o.prefix_cache = false;
  o.cost_profile = testing::FixedStoriesPrices();
  return o;
}

// The followed request's tokens and, per token, its log-probability and the top 5's.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool operator==(const Output&) const = default;
};

struct Outcome {
  Output followed;
  int64_t pages_out_at_cancel = 0;  // pages outside the pool (both sequences') at the cancel
  // The most pages outside the pool at any step from kSettleSteps after the cancel until the
  // followed request finished.
  int64_t pages_out_after = -1;
  EngineMetrics metrics;
};

constexpr int kSettleSteps = 16;  // the quiet steps after relief, and a few promotions

Request Greedy(const std::string& prompt, int32_t n) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.top_logprobs = 5;
  return r;
}

int64_t PagesOut(const EngineMetrics& m) { return m.kv_pages_streamed + m.kv_pages_rebuilt; }

// Runs the followed request beside another that is cancelled once the followed one has
// kCancelAt tokens; `at_cancel` runs then (a corruption, say).
Outcome RunBesideCancelled(const EngineOptions& o, const std::function<void()>& at_cancel = {}) {
  Outcome run;
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return run;
  Engine& e = **created;
  bool followed_done = false;
  auto followed = e.Submit(Greedy(testing::StoryPrompts()[0], kFollowedTokens),
                           [&](const TokenEvent& ev) {
                             EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                             if (ev.finished) followed_done = true;
                             if (ev.token < 0) return;
                             run.followed.tokens.push_back(ev.token);
                             run.followed.logprobs.push_back(ev.logprob);
                             for (const TokenLogprob& t : ev.top_logprobs) {
                               run.followed.logprobs.push_back(t.logprob);
                             }
                           });
  EXPECT_TRUE(followed.ok());
  auto other = e.Submit(Greedy(testing::StoryPrompts()[1], kOtherTokens), {});
  EXPECT_TRUE(other.ok());
  int steps_since_cancel = -1;
  while (e.Step()) {
    if (steps_since_cancel < 0 && run.followed.tokens.size() >= size_t{kCancelAt}) {
      run.pages_out_at_cancel = PagesOut(e.Metrics());
      if (at_cancel) at_cancel();
      e.Cancel(*other);
      steps_since_cancel = 0;
    } else if (steps_since_cancel >= 0 && ++steps_since_cancel >= kSettleSteps && !followed_done) {
      run.pages_out_after = std::max(run.pages_out_after, PagesOut(e.Metrics()));
    }
  }
  run.metrics = e.Metrics();
  return run;
}

const Output& RoomForEverything() {
  static const Output expected = [] {
    EngineOptions o = Options(0);
    o.kv_budget_bytes = 0;
    const Outcome run = RunBesideCancelled(o);
    EXPECT_EQ(run.metrics.preemptions, 0);
    EXPECT_EQ(PagesOut(run.metrics) + run.metrics.kv_pages_promoted_back, 0);
    return run.followed;
  }();
  return expected;
}

struct Case {
  std::string policy;
  std::string tier;
  // A quarter of them staging, the rest a pool of 24 blocks: both sequences outgrow it before
  // the cancel (13 + 13 pages); the followed one alone (19 pages at most) fits. A block that
  // keeps residual checkpoints is larger (every layer's: twice; every other layer's: 1.6x).
  int64_t budget_pages = 32;
  int64_t checkpoint_every = 1;
};

EngineOptions Paged(const Case& c) {
  EngineOptions o = Options(c.budget_pages);
  o.kv_policy = c.policy;
  testing::SetTiersBesidePool(&o, {c.tier});
  o.kv_checkpoint_every = c.checkpoint_every;
  return o;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"demote", "ram:64MiB"},                  // read in place
      {"demote", "ram:64MiB:zstd"},             // streamed layer by layer
      {"recompute-residual", "ram:64MiB", 64},  // rebuilt from checkpoints
      // ... of every other layer: the layers between are run over the earlier pages
      {"recompute-residual", "ram:64MiB", 52, 2},
  };
  return cases;
}

std::string Name(const Case& c) {
  return c.policy + " " + c.tier + " every " + std::to_string(c.checkpoint_every);
}

TEST(KvPromoteBackTest, PagesComeBackWhenBlocksFreeUpAndTheOutputIsBitIdentical) {
  for (const Case& c : Cases()) {
    const std::string name = Name(c);
    const Outcome run = RunBesideCancelled(Paged(c));
    ASSERT_EQ(run.followed.tokens.size(), size_t{kFollowedTokens}) << name;
    EXPECT_EQ(run.followed, RoomForEverything()) << name;
    EXPECT_GT(run.pages_out_at_cancel, 0) << name;  // the pressure really sent pages out
    EXPECT_EQ(run.pages_out_after, 0) << name;       // ... and they all came back
    EXPECT_GT(run.metrics.kv_pages_promoted_back, 0) << name;
    EXPECT_EQ(run.metrics.preemptions, 0) << name;
    EXPECT_EQ(run.metrics.kv_checksum_failures, 0) << name;
  }
}

TEST(KvPromoteBackTest, SwitchedOffThePagesStayOutAndTheOutputIsTheSame) {
  for (const Case& c : Cases()) {
    const std::string name = Name(c);
    EngineOptions o = Paged(c);
    o.kv_promote_back = false;
    const Outcome run = RunBesideCancelled(o);
    EXPECT_EQ(run.followed, RoomForEverything()) << name;
    EXPECT_GT(run.pages_out_at_cancel, 0) << name;
    EXPECT_GT(run.pages_out_after, 0) << name;  // still out, long after the pool had room
    EXPECT_EQ(run.metrics.kv_pages_promoted_back, 0) << name;
  }
}

// The disk file is corrupted as the other request goes: the pages there fail their checksum
// when promoted (they stay in the tier) and when streamed (the step is thrown away and the
// sequence recomputed), never giving wrong bytes.
TEST(KvPromoteBackTest, ACorruptTierPageNeverChangesTheOutput) {
  const std::string disk =
      ::testing::TempDir() + "/kvl-promote-corrupt-" + std::to_string(getpid()) + ".pages";
  const Outcome run = RunBesideCancelled(Paged({"demote-disk", "disk:" + disk + ":64MiB:scratch"}),
                          [&] { EXPECT_GT(testing::CorruptEvery4KiB(disk, 2000), 0); });
  EXPECT_GT(run.pages_out_at_cancel, 0);
  EXPECT_GT(run.metrics.kv_checksum_failures, 0);
  EXPECT_EQ(run.followed, RoomForEverything());
}

}  // namespace
}  // namespace kvl
