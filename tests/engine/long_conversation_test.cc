// Bounded memory: one conversation much longer than the KV budget keeps generating, with the
// resident KV held at the budget by the action lattice on its own pages (compress, demote and
// stream back, evict). Lossless actions reproduce keep-all token for token.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>

#include "budget_tiers.h"
#include "kvl/engine.h"
#include "page_file_corruption.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kLayers = 5;
constexpr int64_t kPageBytes = 16 * 1280;
constexpr int32_t kNewTokens = 440;  // with the prompt, about 29 pages

EngineOptions Options(int64_t budget_pages, double stream_reserve = 0.25) {
  EngineOptions o;
  o.kv_stream_reserve = stream_reserve;
  o.model_path = testing::Stories260KPath();
  // One thread: the pool's workers spin while they wait, and on a busy 2-core machine a 2-thread
  // pool made this suite 13x slower (31 s against 2.3 s) with the same tokens.
  o.num_threads = 1;
  o.context_length = 512;
  o.max_seqs = 2;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.profile_path = testing::ProcessProfilePath();
  return o;
}

struct Outcome {
  std::vector<int32_t> tokens;
  EngineMetrics metrics;
};

// Runs the story prompt to kNewTokens under `o`; `after_step` (optional) sees the engine after
// every step.
Outcome RunConversation(const EngineOptions& o,
                        const std::function<void(Engine&)>& after_step = {}) {
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  Outcome out;
  if (!created.ok()) return out;
  Engine& e = **created;
  Request r;
  r.prompt = testing::StoryPrompts()[0];
  r.max_new_tokens = kNewTokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  std::string finish;
  EXPECT_TRUE(e.Submit(r, [&](const TokenEvent& ev) {
                 EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                 if (ev.token >= 0) out.tokens.push_back(ev.token);
                 if (ev.finished) finish = ev.finish_reason;
               }).ok());
  while (e.Step()) {
    if (after_step) after_step(e);
  }
  EXPECT_EQ(finish, "length");
  out.metrics = e.Metrics();
  return out;
}

const Outcome& KeepAll() {
  static const Outcome keep = RunConversation(Options(64));
  return keep;
}

int64_t Pages(const EngineMetrics& m, KvAction a) {
  return m.kv_actions[static_cast<size_t>(a)].pages;
}

// Leading tokens of `a` equal to `b`.
int64_t SameLeadingTokens(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t same = 0;
  while (same < std::min(a.size(), b.size()) && a[same] == b[same]) ++same;
  return static_cast<int64_t>(same);
}

double Agreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<double>(SameLeadingTokens(a, b)) /
         static_cast<double>(std::max<size_t>(1, a.size()));
}

// KvStats::kv_bytes_peak counts whole blocks of a pool sized from the budget, so it cannot pass
// the budget: asserting that it does not tests nothing. What does grow is the stream staging
// outside the pool (two layer buffers per streamed or rebuilt page, plus one layer of rebuilt
// rows), and the engine reports only its current size; it never shrinks, so that is its peak and
// pool peak + staging bounds what the KV held at once. Checked here: the staging stays within
// three layers of each page of the sequence (stories260K's residual checkpoint layer is as large
// as its K+V layer), never whole pages; printed: how far past the budget the two go together.
// Resident KV, measured at its peak: pool blocks in use (compressed slabs included) plus every
// buffer the pager holds outside the pool (stream staging, transfer and codec scratch), which the
// engine reserves out of the budget before it sizes the pool.
void CheckKvMemory(const EngineMetrics& m, int64_t budget, const std::string& what) {
  EXPECT_LE(m.kv_resident_bytes_peak, budget) << what;
  EXPECT_GT(m.kv_stream_staging_bytes, 0) << what;  // pages left the pool: staging was counted
  std::printf(
      "[ info ] %s: resident KV peak %lld KiB of a %lld KiB budget (pool %lld KiB, staging %lld "
      "KiB for %lld streamed pages)\n",
      what.c_str(), static_cast<long long>(m.kv_resident_bytes_peak / 1024),
      static_cast<long long>(budget / 1024), static_cast<long long>(m.kv.kv_bytes_peak / 1024),
      static_cast<long long>(m.kv_stream_staging_bytes / 1024),
      static_cast<long long>(m.kv_staging_capacity_pages));
}

TEST(LongConversationTest, KeepAllNeedsMoreThanTheSmallBudget) {
  EXPECT_EQ(KeepAll().tokens.size(), static_cast<size_t>(kNewTokens));
  EXPECT_GT(KeepAll().metrics.kv.kv_bytes_peak, 12 * kPageBytes);
  EXPECT_EQ(KeepAll().metrics.preemptions, 0);
}

// Pages streamed from a tier are staged a layer at a time (double-buffered) at every step: about
// 2 / num_layers of a page each, 40% on stories260K's 5 layers, and a page kept as checkpoints
// stages its checkpoints and the K/V rebuilt from them, a whole page's bytes on this MHA model.
// The budget holds the pool and that staging together, so a tiny 5-layer model needs a larger
// budget and reserve to stream its history than a real one would.
TEST(LongConversationTest, StreamingDemotedPagesIsLosslessWithinTheBudget) {
  const std::string disk =
      ::testing::TempDir() + "/kvl-long-" + std::to_string(getpid()) + ".pages";
  struct Case {
    std::string policy;
    std::vector<std::string> tiers;
    KvAction expected;
    int64_t budget_pages;
    double stream_reserve;
  };
  for (const Case& c : std::vector<Case>{
           {"demote", {"ram:64MiB"}, KvAction::kDemoteRam, 24, 0.5},
           {"demote-disk", {"disk:" + disk + ":64MiB:scratch"}, KvAction::kDemoteDisk, 24, 0.5},
           // Blocks also hold residual checkpoints here (twice the bytes of a K/V page).
           {"recompute-residual", {"ram:64MiB"}, KvAction::kRecomputeResidual, 40, 0.75},
           {"auto", {"ram:64MiB"}, KvAction::kDemoteRam, 40, 0.75},
       }) {
    EngineOptions o = Options(c.budget_pages, c.stream_reserve);
    o.kv_policy = c.policy;
    testing::SetTiersBesidePool(&o, c.tiers);
    const Outcome out = RunConversation(o);
    EXPECT_EQ(out.tokens, KeepAll().tokens) << c.policy;
    CheckKvMemory(out.metrics, o.kv_budget_bytes, c.policy);
    // The history outgrew the pool: most of it lived in the tier.
    EXPECT_GT(KeepAll().metrics.kv.kv_bytes_peak, 2 * out.metrics.kv.kv_bytes_total) << c.policy;
    EXPECT_GT(Pages(out.metrics, c.expected), 15) << c.policy;
    if (c.expected == KvAction::kRecomputeResidual) {
      EXPECT_GT(out.metrics.kv_layers_rebuilt, 0) << c.policy;
    } else {
      EXPECT_GT(out.metrics.kv_layers_streamed, 0) << c.policy;
    }
    EXPECT_EQ(out.metrics.preemptions, 0) << c.policy;
    EXPECT_EQ(Pages(out.metrics, KvAction::kEvict) + Pages(out.metrics, KvAction::kCompressInt8) +
                  Pages(out.metrics, KvAction::kCompressInt4),
              0)
        << c.policy;
  }
}

TEST(LongConversationTest, LossyActionsKeepGeneratingWithinTheBudget) {
  // Until the pool first fills, the output is keep-all's by construction, so agreement is only
  // counted from the step that first acted on a page. Measured (scalar, AVX2 and AVX-512 alike):
  // the first page is acted on after 125 tokens; keep-all's tokens then go on for 106 more with
  // int8, 56 with int4 and 53 with eviction. The bounds are half that.
  struct Case {
    std::string policy;
    KvAction expected;
    int64_t min_agreeing;  // greedy tokens still equal to keep-all's after the first lossy page
  };
  for (const Case& c : std::vector<Case>{
           {"compress", KvAction::kCompressInt8, 50},
           {"compress-int4", KvAction::kCompressInt4, 25},
           {"evict", KvAction::kEvict, 25},
       }) {
    // 10 pages: 8 for the pool, the rest for the pager's transfer and codec scratch.
    EngineOptions o = Options(10);
    o.kv_policy = c.policy;
    int64_t lossy_from = -1;  // tokens generated when the first page was acted on
    const Outcome out = RunConversation(o, [&](Engine& e) {
      if (lossy_from < 0 && Pages(e.Metrics(), c.expected) > 0) {
        lossy_from = e.Metrics().tokens_generated;
      }
    });
    EXPECT_EQ(out.tokens.size(), static_cast<size_t>(kNewTokens)) << c.policy;
    EXPECT_GT(Pages(out.metrics, c.expected), 5) << c.policy;
    EXPECT_EQ(out.metrics.preemptions, 0) << c.policy;
    CheckKvMemory(out.metrics, o.kv_budget_bytes, c.policy);
    ASSERT_GT(lossy_from, 0) << c.policy;
    const int64_t agreeing = SameLeadingTokens(out.tokens, KeepAll().tokens) - lossy_from;
    EXPECT_GE(agreeing, c.min_agreeing) << c.policy;
    std::printf(
        "[ info ] %s: %lld pages; the first after %lld tokens, then %lld more tokens "
        "agree with keep-all before the first difference\n",
        c.policy.c_str(), static_cast<long long>(Pages(out.metrics, c.expected)),
        static_cast<long long>(lossy_from), static_cast<long long>(agreeing));
  }
}

// A streamed page whose disk bytes were corrupted fails its checksum while attention streams it:
// that step's output is thrown away and the sequence recomputed from its tokens, so the text does
// not change.
TEST(LongConversationTest, CorruptStreamedPageIsCaughtAndTheOutputUnchanged) {
  const std::string disk =
      ::testing::TempDir() + "/kvl-long-corrupt-" + std::to_string(getpid()) + ".pages";
  EngineOptions o = Options(24, 0.5);
  o.kv_policy = "demote-disk";
  o.kv_tiers = {"disk:" + disk + ":64MiB:scratch"};
  bool corrupted = false;
  const Outcome out = RunConversation(o, [&](Engine& e) {
    if (!corrupted && e.Metrics().kv_pages_streamed >= 4) {
      testing::CorruptEvery4KiB(disk, 1000);
      corrupted = true;
    }
  });
  EXPECT_TRUE(corrupted);
  EXPECT_GT(out.metrics.kv_checksum_failures, 0);
  EXPECT_GT(out.metrics.preemptions, 0);  // the step was thrown away and the KV recomputed
  EXPECT_EQ(out.tokens, KeepAll().tokens);
}

// A multi-turn conversation: each turn's prompt is the whole history plus a new user line, longer
// than the pool after the first turns. Prefill pages through the pool too (its chunks shrink to
// fit), and with streamed demotion every turn's reply equals keep-all's.
std::vector<std::vector<int32_t>> Conversation(const EngineOptions& o, EngineMetrics* metrics) {
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return {};
  Engine& e = **created;
  const std::vector<std::string> turns = {"Once upon a time", " The little dog", " Lily wanted to",
                                          " The sun was shining"};
  std::vector<int32_t> history;
  std::vector<std::vector<int32_t>> replies;
  for (const std::string& turn : turns) {
    const std::vector<int32_t> user = e.tokenizer().Encode(turn, history.empty());
    history.insert(history.end(), user.begin(), user.end());
    Request r;
    r.prompt_ids = history;
    r.max_new_tokens = 100;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    std::vector<int32_t> reply;
    EXPECT_TRUE(e.Submit(r, [&](const TokenEvent& ev) {
                   EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                   if (ev.token >= 0) reply.push_back(ev.token);
                 }).ok());
    e.RunUntilIdle();
    history.insert(history.end(), reply.begin(), reply.end());
    replies.push_back(reply);
  }
  *metrics = e.Metrics();
  EXPECT_GT(history.size(), 400u);
  return replies;
}

TEST(LongConversationTest, MultiTurnHistoryLongerThanThePoolStaysExact) {
  EngineMetrics keep_metrics, paged_metrics;
  const auto keep = Conversation(Options(64), &keep_metrics);
  EngineOptions o = Options(24, 0.5);
  o.kv_policy = "demote";
  testing::SetTiersBesidePool(&o, {"ram:64MiB"});
  o.prefix_cache = true;
  const auto paged = Conversation(o, &paged_metrics);
  EXPECT_EQ(paged, keep);
  EXPECT_GT(keep_metrics.kv.kv_bytes_peak, 2 * paged_metrics.kv.kv_bytes_total);
  CheckKvMemory(paged_metrics, o.kv_budget_bytes, "multi-turn demote");
}

// The same conversation with a direct-I/O disk tier as the only place beside the pool (RAM holds
// only the budget): from the turn whose history the pool cannot hold, the admission finds the
// history's pages in the KV store on disk and streams them where they lie (each layer read while
// the one before computes) instead of promoting them all into the pool first; every reply still
// equals keep-all's.
TEST(LongConversationTest, MultiTurnHistoryOnDiskIsStreamedWhereItLiesAndStaysExact) {
  EngineMetrics keep_metrics, paged_metrics;
  const auto keep = Conversation(Options(64), &keep_metrics);
  const std::string disk =
      ::testing::TempDir() + "/kvl-long-stream-" + std::to_string(getpid()) + ".pages";
  EngineOptions o = Options(24, 0.5);
  o.kv_policy = "demote-disk";
  o.kv_tiers = {"disk:" + disk + ":64MiB:direct:scratch"};
  o.prefix_cache = true;
  const auto paged = Conversation(o, &paged_metrics);
  EXPECT_EQ(paged, keep);
  CheckKvMemory(paged_metrics, o.kv_budget_bytes, "multi-turn, disk only");
  ASSERT_EQ(paged_metrics.kv_tiers.size(), 1u);
  const KvTierMetrics& tier = paged_metrics.kv_tiers[0];
  EXPECT_GT(tier.blocks_in_place, 0) << "no admission streamed its history from the disk";
  EXPECT_GT(paged_metrics.kv_layers_streamed, 0);
  std::printf("[ info ] disk only: %lld blocks found on disk, %lld streamed where they lie, %lld "
              "promoted\n",
              static_cast<long long>(tier.hit_blocks), static_cast<long long>(tier.blocks_in_place),
              static_cast<long long>(tier.blocks_promoted));
}

// -ctk / -ctv f16 and bf16: pages take half the bytes (twice the blocks in one budget), greedy
// output stays close to f32, and streaming demoted half pages is as lossless as with f32.
TEST(LongConversationTest, HalfCacheTypesHalveThePagesAndStreamLosslessly) {
  for (const std::string type : {"f16", "bf16"}) {
    EngineOptions keep = Options(64);
    keep.cache_type_k = keep.cache_type_v = type;
    const Outcome all = RunConversation(keep);
    EXPECT_EQ(all.metrics.kv.blocks_total, 128) << type;  // 64 f32 pages' bytes
    EXPECT_EQ(all.tokens.size(), static_cast<size_t>(kNewTokens)) << type;
    const double agreement = Agreement(all.tokens, KeepAll().tokens);
    std::printf(
        "[ info ] -ctk/-ctv %s: %.3f of the tokens agree with f32 before the first "
        "difference\n",
        type.c_str(), agreement);
    EXPECT_GE(agreement, 0.5) << type;  // f16 1.000, bf16 0.945 (scalar, AVX2, AVX-512)

    EngineOptions paged = Options(12, 0.5);  // 24 half-precision pages' bytes
    paged.cache_type_k = paged.cache_type_v = type;
    paged.kv_policy = "demote";
    testing::SetTiersBesidePool(&paged, {"ram:64MiB"});
    const Outcome out = RunConversation(paged);
    EXPECT_EQ(out.tokens, all.tokens) << type;
    CheckKvMemory(out.metrics, paged.kv_budget_bytes, "demote, " + type);
    EXPECT_GT(Pages(out.metrics, KvAction::kDemoteRam), 15) << type;
  }
  EngineOptions mixed = Options(64);
  mixed.cache_type_k = "f16";  // keys f16, values f32 (as llama.cpp's -ctk alone)
  EXPECT_EQ(RunConversation(mixed).tokens.size(), static_cast<size_t>(kNewTokens));
  EngineOptions bad = Options(64);
  bad.cache_type_k = "q4_1";
  EXPECT_EQ(Engine::Create(bad).status().code(), StatusCode::kInvalidArgument);
}

// -ctk / -ctv q8_0 and q4_0: rows quantized as they are stored (34 and 18 bytes per 32 values
// against 128), greedy output close to f32, and q8_0 / q4_0 pages streamed through the RAM tier
// come back byte for byte: the same tokens as keeping them.
TEST(LongConversationTest, QuantizedCacheTypesShrinkThePagesAndStreamLosslessly) {
  // Budgets in f32 pages' bytes, half of them the stream reserve, so small that most of the
  // history lives in the tier (a q4_0 page is 18/34 of a q8_0 one).
  struct Case {
    std::string type;
    int64_t budget_pages;
  };
  for (const auto& [type, budget_pages] : {Case{"q8_0", 6}, Case{"q4_0", 3}}) {
    EngineOptions keep = Options(64);
    keep.cache_type_k = keep.cache_type_v = type;
    const Outcome all = RunConversation(keep);
    EXPECT_GT(all.metrics.kv.blocks_total, 64 * 128 / 36) << type;
    EXPECT_EQ(all.tokens.size(), static_cast<size_t>(kNewTokens)) << type;
    const double agreement = Agreement(all.tokens, KeepAll().tokens);
    std::printf(
        "[ info ] -ctk/-ctv %s: %.3f of the tokens agree with f32 before the first "
        "difference\n",
        type.c_str(), agreement);

    EngineOptions paged = Options(budget_pages, 0.6);
    paged.cache_type_k = paged.cache_type_v = type;
    paged.kv_policy = "demote";
    testing::SetTiersBesidePool(&paged, {"ram:64MiB"});
    const Outcome out = RunConversation(paged);
    EXPECT_EQ(out.tokens, all.tokens) << type;
    CheckKvMemory(out.metrics, paged.kv_budget_bytes, "demote, " + type);
    std::printf("[ info ] %s: %lld pages demoted\n", type.c_str(),
                static_cast<long long>(Pages(out.metrics, KvAction::kDemoteRam)));
    EXPECT_GT(Pages(out.metrics, KvAction::kDemoteRam), 10) << type;
  }
}

}  // namespace
}  // namespace kvl
