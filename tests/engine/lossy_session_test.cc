// A chat's next turn under a lossy policy: the finished turn's KV (with its evicted or compressed
// pages) stays as a parked session, and the next request, which resubmits the whole history,
// continues it instead of prefilling that history again. Lossless sequences are never parked,
// and a parked session gives its slot and blocks back to any other request that needs them.
#include <gtest/gtest.h>
#include <unistd.h>

#include "greedy_reply.h"
#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;
constexpr int32_t kReplyTokens = 32;

EngineOptions Options(const std::string& policy, int64_t budget_pages, int32_t max_seqs = 2) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;  // see long_conversation_test.cc: a spinning pool on a busy machine
  o.context_length = 512;
  o.max_seqs = max_seqs;
  o.kv_policy = policy;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.profile_path = testing::ProcessProfilePath();
  return o;
}

using testing::MakeEngine;

using Reply = testing::GreedyReply;

Reply Generate(Engine& e, const std::vector<int32_t>& prompt, int32_t n = kReplyTokens) {
  return testing::GenerateGreedy(e, prompt, n);
}

// A first turn of about 240 tokens: story openings one after another.
std::vector<int32_t> FirstTurn(Engine& e, const std::string& salt = ".") {
  std::string text;
  for (int i = 0; i < 4; ++i) {
    for (const std::string& p : testing::StoryPrompts()) text += p + salt + " ";
  }
  return e.tokenizer().Encode(text, /*add_bos=*/true);
}

// The history a chat client resubmits: the previous prompt, the reply, then the user's words.
std::vector<int32_t> NextTurn(Engine& e, const std::vector<int32_t>& prompt, const Reply& reply) {
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), reply.tokens.begin(), reply.tokens.end());
  const std::vector<int32_t> user = e.tokenizer().Encode(" The next day, they went out.", false);
  next.insert(next.end(), user.begin(), user.end());
  return next;
}

int64_t EvictedPages(const EngineMetrics& m) {
  return m.kv_actions[static_cast<size_t>(KvAction::kEvict)].pages;
}

TEST(LossySessionTest, ANextTurnContinuesTheEvictedHistoryInsteadOfPrefillingIt) {
  // 10 pages: 8 for the pool (128 tokens) and the pager's scratch; the turns hold 270-300 tokens.
  auto e = MakeEngine(Options("evict", 10));
  const std::vector<int32_t> first = FirstTurn(*e);
  const Reply one = Generate(*e, first);
  ASSERT_EQ(one.tokens.size(), static_cast<size_t>(kReplyTokens));
  EXPECT_EQ(one.cached_prompt_tokens, 0);
  const int64_t evicted = EvictedPages(e->Metrics());
  ASSERT_GT(evicted, 5);  // the turn really went lossy
  const int64_t prefilled_before = e->Metrics().tokens_prefilled;

  const std::vector<int32_t> second = NextTurn(*e, first, one);
  const Reply two = Generate(*e, second);
  EXPECT_EQ(two.tokens.size(), static_cast<size_t>(kReplyTokens));
  // Everything the first turn computed (its prompt and every reply token but the last, which
  // was sampled and never run) is continued; only the rest of the history is computed.
  const int64_t continued = static_cast<int64_t>(first.size()) + kReplyTokens - 1;
  EXPECT_EQ(two.cached_prompt_tokens, continued);
  const EngineMetrics m = e->Metrics();
  EXPECT_EQ(m.tokens_prefilled - prefilled_before,
            static_cast<int64_t>(second.size()) - continued);
  // The pool stayed at its budget: the continued turn evicted more of the history.
  EXPECT_GT(EvictedPages(m), evicted);
}

TEST(LossySessionTest, AHistoryThatPartsFromTheSessionContinuesItUpToThePageWhereTheyPart) {
  // A chat client re-tokenizes the reply's text, or the user edits it: the session is cut back
  // to the whole pages before the first differing token, and the rest is computed.
  auto e = MakeEngine(Options("evict", 10));
  const std::vector<int32_t> first = FirstTurn(*e);
  Reply one = Generate(*e, first);
  ASSERT_GT(EvictedPages(e->Metrics()), 5);
  const size_t parts_at = first.size() + 10;  // the 11th reply token differs
  one.tokens[10] = one.tokens[10] == 1 ? 2 : 1;
  const std::vector<int32_t> second = NextTurn(*e, first, one);
  const int64_t prefilled_before = e->Metrics().tokens_prefilled;
  const Reply two = Generate(*e, second);
  EXPECT_EQ(two.tokens.size(), static_cast<size_t>(kReplyTokens));
  const auto continued = static_cast<int64_t>(parts_at / 16 * 16);
  EXPECT_EQ(two.cached_prompt_tokens, continued);
  EXPECT_EQ(e->Metrics().tokens_prefilled - prefilled_before,
            static_cast<int64_t>(second.size()) - continued);
  // And the cut session goes on as any other: a third turn continues it again, whole.
  const std::vector<int32_t> third = NextTurn(*e, second, two);
  const Reply three = Generate(*e, third);
  EXPECT_EQ(three.cached_prompt_tokens, static_cast<int64_t>(second.size()) + kReplyTokens - 1);
}

TEST(LossySessionTest, ALosslessTurnIsFoundThroughThePrefixCacheNotParked) {
  // A pool that holds the whole conversation: nothing is lossy, and the next turn gets the full
  // pages of its history from the prefix cache, never the partial last one.
  auto e = MakeEngine(Options("auto", 0));
  const std::vector<int32_t> first = FirstTurn(*e);
  const Reply one = Generate(*e, first);
  const Reply two = Generate(*e, NextTurn(*e, first, one));
  const int64_t computed = static_cast<int64_t>(first.size()) + kReplyTokens - 1;
  EXPECT_EQ(two.cached_prompt_tokens, computed / 16 * 16);
  EXPECT_NE(two.cached_prompt_tokens, computed);
}

TEST(LossySessionTest, AnotherRequestTakesTheParkedSessionsSlotAndPool) {
  // One slot: the parked session must give it back, and its blocks, to an unrelated request,
  // whose output is then what it is in an engine that never saw the first conversation.
  const EngineOptions o = Options("evict", 10, /*max_seqs=*/1);
  auto e = MakeEngine(o);
  const Reply one = Generate(*e, FirstTurn(*e));
  ASSERT_GT(EvictedPages(e->Metrics()), 5);
  const Reply other = Generate(*e, FirstTurn(*e, "!"));
  EXPECT_TRUE(other.ok);
  EXPECT_EQ(other.cached_prompt_tokens, 0);
  auto fresh = MakeEngine(o);
  const Reply alone = Generate(*fresh, FirstTurn(*fresh, "!"));
  EXPECT_EQ(other.tokens, alone.tokens);
}

TEST(LossySessionTest, AContinuedSessionIsDeterministic) {
  // The same two turns in two engines give the same tokens: continuing a session reads the
  // parked pages as they are, nothing depends on what else the engine did.
  std::vector<std::vector<int32_t>> replies;
  for (int run = 0; run < 2; ++run) {
    auto e = MakeEngine(Options("evict", 10));
    const std::vector<int32_t> first = FirstTurn(*e);
    const Reply one = Generate(*e, first);
    const Reply two = Generate(*e, NextTurn(*e, first, one));
    std::vector<int32_t> both = one.tokens;
    both.insert(both.end(), two.tokens.begin(), two.tokens.end());
    replies.push_back(both);
  }
  EXPECT_EQ(replies[0], replies[1]);
}

}  // namespace
}  // namespace kvl
