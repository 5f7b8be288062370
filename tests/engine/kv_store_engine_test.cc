// The KV store through the engine: pages found again across requests, engines (a restart) and
// processes sharing a Redis, with output identical to a run where everything stayed in the pool.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fixed_prices.h"
#include "kv/redis_test_server.h"
#include "greedy_reply.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "page_file_corruption.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;

EngineOptions Options(int64_t budget_pages = 0) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;  // see long_conversation_test.cc: a spinning pool on a busy machine
  o.context_length = 512;
  o.max_seqs = 2;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  // Priced as on a model where recomputing a page costs more than fetching it: on stories260K a
  // profile measured on a busy machine may well say recomputing a 16-token page beats a disk read
  // or a loopback round trip, and then nothing is promoted (CI once measured exactly that).
  o.cost_profile = testing::FixedStoriesPrices(/*residual_ms=*/5, /*tokens_ms=*/50);
  return o;
}

// A long prompt (about 300 tokens): story openings one after another.
std::vector<int32_t> LongPrompt(Engine& e, int salt = 0) {
  std::string text;
  for (int i = 0; i < 6; ++i) {
    for (const std::string& p : testing::StoryPrompts()) text += p + (salt ? "!" : ".") + " ";
  }
  return e.tokenizer().Encode(text, /*add_bos=*/true);
}

using Reply = testing::GreedyReply;

Reply Generate(Engine& e, const std::vector<int32_t>& prompt, int32_t n = 24) {
  return testing::GenerateGreedy(e, prompt, n);
}

const KvTierMetrics* Tier(const EngineMetrics& m, std::string_view prefix) {
  for (const KvTierMetrics& t : m.kv_tiers) {
    if (t.name.rfind(prefix, 0) == 0) return &t;
  }
  return nullptr;
}

using testing::MakeEngine;

// The reference: one engine, nothing but the pool.
Reply KeepAllReply(int salt = 0) {
  auto e = MakeEngine(Options());
  return Generate(*e, LongPrompt(*e, salt));
}

TEST(KvStoreEngineTest, ASecondEngineOnTheSameDiskTierPromotesThePrompt) {
  const std::string disk =
      ::testing::TempDir() + "/kvl-store-restart-" + std::to_string(getpid()) + ".pages";
  std::filesystem::remove(disk);
  EngineOptions o = Options();
  o.kv_tiers = {"disk:" + disk + ":16MiB"};
  Reply first;
  int64_t prompt_tokens = 0;
  {
    auto e = MakeEngine(o);
    const std::vector<int32_t> prompt = LongPrompt(*e);
    prompt_tokens = static_cast<int64_t>(prompt.size());
    first = Generate(*e, prompt);
    EXPECT_EQ(first.cached_prompt_tokens, 0);
    const EngineMetrics metrics1 = e->Metrics();  // kept: Tier points into it
    const KvTierMetrics* t = Tier(metrics1, "disk");
    ASSERT_NE(t, nullptr);
    EXPECT_GE(t->pages_in, (prompt_tokens / 16) * 6);  // written through: 5 layers + identity
  }
  EXPECT_EQ(first.tokens, KeepAllReply().tokens);
  auto e = MakeEngine(o);  // a fresh engine: only the file carries the pages over
  const Reply second = Generate(*e, LongPrompt(*e));
  EXPECT_EQ(second.tokens, first.tokens);
  // Every full page but the one holding the last token came back from the disk.
  EXPECT_EQ(second.cached_prompt_tokens, (prompt_tokens - 1) / 16 * 16);
  const EngineMetrics metrics2 = e->Metrics();  // kept: Tier points into it
  const KvTierMetrics* t = Tier(metrics2, "disk");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->hit_blocks, (prompt_tokens - 1) / 16);
  EXPECT_EQ(t->blocks_promoted, t->hit_blocks);
  std::filesystem::remove(disk);
}

TEST(KvStoreEngineTest, ADamagedDiskPageIsAMissAndTheOutputUnchanged) {
  const std::string disk =
      ::testing::TempDir() + "/kvl-store-damaged-" + std::to_string(getpid()) + ".pages";
  std::filesystem::remove(disk);
  EngineOptions o = Options();
  o.kv_tiers = {"disk:" + disk + ":16MiB"};
  {
    auto e = MakeEngine(o);
    Generate(*e, LongPrompt(*e));
  }
  testing::CorruptEvery4KiB(disk, 3000);  // bytes inside many slots flipped
  auto e = MakeEngine(o);
  const Reply again = Generate(*e, LongPrompt(*e));
  EXPECT_EQ(again.tokens, KeepAllReply().tokens);
  const EngineMetrics m = e->Metrics();
  const KvTierMetrics* t = Tier(m, "disk");
  ASSERT_NE(t, nullptr);
  // Fewer pages came back than the prompt holds: the damaged ones were computed instead.
  EXPECT_LT(again.cached_prompt_tokens, static_cast<int64_t>(LongPrompt(*e).size()) - 16);
  std::filesystem::remove(disk);
}

TEST(KvStoreEngineTest, PagesTheSmallPoolEvictedComeBackFromTheRamTier) {
  // A pool of 24 pages holds one long prompt (about 19 pages) at a time: the second prompt
  // evicts the first one's cached pages, which go to the RAM tier, and the first prompt asked
  // again finds them there.
  EngineOptions o = Options(24);
  testing::SetTiersBesidePool(&o, {"ram:8MiB"});
  auto e = MakeEngine(o);
  const std::vector<int32_t> a = LongPrompt(*e, 0);
  const std::vector<int32_t> b = LongPrompt(*e, 1);
  const Reply a1 = Generate(*e, a);
  Generate(*e, b);
  const Reply a2 = Generate(*e, a);
  EXPECT_EQ(a2.tokens, a1.tokens);
  EXPECT_EQ(a1.tokens, KeepAllReply(0).tokens);
  const EngineMetrics metrics3 = e->Metrics();  // kept: Tier points into it
  const KvTierMetrics* t = Tier(metrics3, "ram");
  ASSERT_NE(t, nullptr);
  // Every full page of `a` but the last: from the RAM tier, or still in the pool.
  const int64_t pages = (static_cast<int64_t>(a.size()) - 1) / 16;
  EXPECT_GT(t->hit_blocks, pages / 2);
  // Read where the RAM tier holds them (no copy), or promoted into the pool.
  EXPECT_EQ(t->blocks_promoted + t->blocks_in_place, t->hit_blocks);
  EXPECT_GT(t->blocks_in_place, 0);
  EXPECT_EQ(a2.cached_prompt_tokens, pages * 16);
}

// Each turn resubmits the whole history: with a pool smaller than the conversation and a RAM
// tier, the pages of earlier turns are found in the store (or the pool) and read in place, and
// every reply equals the keep-all one.
std::vector<std::vector<int32_t>> Turns(const EngineOptions& o, EngineMetrics* metrics) {
  auto e = MakeEngine(o);
  std::vector<int32_t> history;
  std::vector<std::vector<int32_t>> replies;
  for (int turn = 0; turn < 5; ++turn) {
    const std::vector<int32_t> user =
        e->tokenizer().Encode(testing::StoryPrompts()[static_cast<size_t>(turn)] + ".", turn == 0);
    history.insert(history.end(), user.begin(), user.end());
    const Reply reply = Generate(*e, history, 60);
    history.insert(history.end(), reply.tokens.begin(), reply.tokens.end());
    replies.push_back(reply.tokens);
  }
  *metrics = e->Metrics();
  return replies;
}

TEST(KvStoreEngineTest, AConversationLargerThanThePoolMatchesKeepAll) {
  EngineMetrics keep_metrics;
  const auto keep = Turns(Options(), &keep_metrics);
  EngineOptions o = Options(10);  // 10 pages; the conversation ends near 22
  o.kv_policy = "auto";
  o.kv_quality = "lossless";
  testing::SetTiersBesidePool(&o, {"ram:16MiB"});
  EngineMetrics m;
  EXPECT_EQ(Turns(o, &m), keep);
  EXPECT_LE(m.kv_resident_bytes_peak, 10 * kPageBytes);
  const KvTierMetrics* t = Tier(m, "ram");
  ASSERT_NE(t, nullptr);
  EXPECT_GT(t->hit_blocks, 0);
  EXPECT_GT(m.kv.prefix_hit_tokens + t->hit_tokens, 100);
}

TEST(KvStoreEngineTest, TwoEnginesShareARedisTierAndSurviveItsDeath) {
  RedisServerProcess redis;
  if (RedisServerProcess::FindBinary().empty()) GTEST_SKIP() << "redis-server is not installed";
  const int port = FreeLoopbackPort();
  ASSERT_TRUE(redis.Start(port));
  EngineOptions o = Options();
  o.kv_tiers = {"redis://127.0.0.1:" + std::to_string(port) + "/kvl-engine-test"};
  const Reply keep = KeepAllReply();
  {
    auto first = MakeEngine(o);
    EXPECT_EQ(Generate(*first, LongPrompt(*first)).tokens, keep.tokens);
  }
  auto second = MakeEngine(o);  // as a second process would: nothing shared but Redis
  const std::vector<int32_t> prompt = LongPrompt(*second);
  const Reply hit = Generate(*second, prompt);
  EXPECT_EQ(hit.tokens, keep.tokens);
  EXPECT_EQ(hit.cached_prompt_tokens, (static_cast<int64_t>(prompt.size()) - 1) / 16 * 16);
  // Redis goes away: requests still succeed (misses, recomputed), the output is unchanged.
  redis.Kill();
  const Reply during = Generate(*second, LongPrompt(*second, 1));
  EXPECT_EQ(during.tokens, KeepAllReply(1).tokens);
  // It comes back: the tier reconnects and the next request's pages are stored again.
  ASSERT_TRUE(redis.Start(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));  // past the longest backoff
  const Reply after = Generate(*second, LongPrompt(*second, 1));
  EXPECT_EQ(after.tokens, during.tokens);
  const EngineMetrics metrics4 = second->Metrics();  // kept: Tier points into it
  const KvTierMetrics* t = Tier(metrics4, "redis");
  ASSERT_NE(t, nullptr);
  EXPECT_GT(t->errors, 0);
  RawRedis raw(port);
  ASSERT_TRUE(raw.ok());
  EXPECT_GT(raw.Keys("kvl-engine-test:*").size(), 0u);
}

}  // namespace
}  // namespace kvl
