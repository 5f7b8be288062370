// kv_quality chosen per request (Request::kv_quality): a lossless request and an aggressive one
// in the same batch, under a budget too small for both. The aggressive request's pages are
// compressed or evicted; the lossless one's never are, and its greedy tokens equal those it
// generates alone with room for everything. The same batch with neither request asking proves
// the budget would have taken the lossless request's pages too.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>

#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;
constexpr int32_t kNewTokens = 160;

EngineOptions Options(const std::string& quality, int64_t budget_pages) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;  // see long_conversation_test.cc: a spinning pool on a busy machine
  o.context_length = 512;
  o.max_seqs = 2;
  o.kv_quality = quality;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.prefix_cache = false;  // the two prompts share nothing; no parked sessions either
  o.profile_path = testing::ProcessProfilePath();
  return o;
}

struct Reply {
  std::vector<int32_t> tokens;
  int64_t lossy_pages = -1;  // -1: never finished
  int64_t cached_prompt_tokens = -1;
};

// About 100 tokens of story openings; `first` picks which one leads, so the two differ.
std::string Prompt(size_t first) {
  const std::vector<std::string>& stories = testing::StoryPrompts();
  std::string text;
  for (size_t i = 0; i < stories.size(); ++i) text += stories[(first + i) % stories.size()] + " ";
  return text;
}

StatusOr<RequestId> Submit(Engine& e, const std::string& prompt,
                           std::optional<KvQuality> quality, Reply* out) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = kNewTokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.kv_quality = quality;
  return e.Submit(r, [out](const TokenEvent& ev) {
    EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
    if (ev.token >= 0) out->tokens.push_back(ev.token);
    if (ev.finished) {
      out->lossy_pages = ev.kv_lossy_pages;
      out->cached_prompt_tokens = ev.cached_prompt_tokens;
    }
  });
}

// The pages a finished request held as it stopped that are compressed or gone.
int64_t LossyPagesAtEnd(const EngineMetrics& m, RequestId id) {
  for (const KvSequencePageMap& map : m.kv_sequences_ended) {
    if (map.request != id) continue;
    return std::count_if(map.pages.begin(), map.pages.end(), [](KvPageLocation l) {
      return l == KvPageLocation::kCompressed || l == KvPageLocation::kEvicted;
    });
  }
  ADD_FAILURE() << "no page map for request " << id;
  return -1;
}

struct Batch {
  Reply lossless, aggressive;
  int64_t lossless_lossy_at_end = -1, aggressive_lossy_at_end = -1;
};

// The two prompts run together on a budget that holds about half of them.
Batch RunBatch(std::optional<KvQuality> first, std::optional<KvQuality> second) {
  Batch b;
  std::unique_ptr<Engine> e = std::move(Engine::Create(Options("aggressive", 18)).value());
  const StatusOr<RequestId> a = Submit(*e, Prompt(0), first, &b.lossless);
  const StatusOr<RequestId> c = Submit(*e, Prompt(1), second, &b.aggressive);
  EXPECT_TRUE(a.ok() && c.ok());
  e->RunUntilIdle();
  const EngineMetrics m = e->Metrics();
  b.lossless_lossy_at_end = LossyPagesAtEnd(m, *a);
  b.aggressive_lossy_at_end = LossyPagesAtEnd(m, *c);
  return b;
}

TEST(KvQualityRequestTest, ALosslessRequestBesideAnAggressiveOneKeepsEveryPageExact) {
  // Alone, with room for everything: the reference.
  Reply alone;
  {
    std::unique_ptr<Engine> e = std::move(Engine::Create(Options("lossless", 0)).value());
    ASSERT_TRUE(Submit(*e, Prompt(0), std::nullopt, &alone).ok());
    e->RunUntilIdle();
  }
  ASSERT_EQ(alone.tokens.size(), static_cast<size_t>(kNewTokens));
  EXPECT_EQ(alone.lossy_pages, 0);

  // Control: neither asks, so both take the engine's aggressive quality and the budget takes
  // pages of both (else the test below could not fail).
  const Batch control = RunBatch(std::nullopt, std::nullopt);
  ASSERT_GT(control.lossless.lossy_pages, 0);
  ASSERT_GT(control.aggressive.lossy_pages, 0);

  const Batch mixed = RunBatch(KvQuality::kLossless, KvQuality::kAggressive);
  ASSERT_EQ(mixed.lossless.tokens.size(), static_cast<size_t>(kNewTokens));
  ASSERT_EQ(mixed.aggressive.tokens.size(), static_cast<size_t>(kNewTokens));
  EXPECT_EQ(mixed.lossless.lossy_pages, 0);
  EXPECT_EQ(mixed.lossless_lossy_at_end, 0);
  EXPECT_EQ(mixed.lossless.tokens, alone.tokens);  // bit-exact: same greedy tokens
  // The aggressive request paid for the memory instead.
  EXPECT_GT(mixed.aggressive.lossy_pages, 0);
  EXPECT_GT(mixed.aggressive_lossy_at_end, 0);
}

// A page two requests share through the prefix cache never leaves the pool while both hold it,
// so the strictest holder's quality wins: the lossless request that computed the prefix keeps
// every page exact although the aggressive one reading the same pages lets its own be compressed.
TEST(KvQualityRequestTest, PagesSharedWithAnAggressiveRequestStayExactForTheLosslessOne) {
  const std::string shared = Prompt(0);
  Reply alone;
  {
    std::unique_ptr<Engine> e = std::move(Engine::Create(Options("lossless", 0)).value());
    ASSERT_TRUE(Submit(*e, shared + " Tom", std::nullopt, &alone).ok());
    e->RunUntilIdle();
  }
  ASSERT_EQ(alone.tokens.size(), static_cast<size_t>(kNewTokens));

  EngineOptions o = Options("aggressive", 18);
  o.prefix_cache = true;
  std::unique_ptr<Engine> e = std::move(Engine::Create(o).value());
  Reply lossless, aggressive;
  ASSERT_TRUE(Submit(*e, shared + " Tom", KvQuality::kLossless, &lossless).ok());
  // Its prompt computed (a first token out), its full pages are in the prefix index.
  while (lossless.tokens.empty() && e->Step()) {
  }
  ASSERT_FALSE(lossless.tokens.empty());
  ASSERT_TRUE(Submit(*e, shared + " Sue", KvQuality::kAggressive, &aggressive).ok());
  e->RunUntilIdle();
  ASSERT_EQ(aggressive.tokens.size(), static_cast<size_t>(kNewTokens));
  EXPECT_GE(aggressive.cached_prompt_tokens, 32);  // the two really shared pages
  EXPECT_GT(aggressive.lossy_pages, 0);            // and the budget took the aggressive one's
  EXPECT_EQ(lossless.lossy_pages, 0);
  EXPECT_EQ(lossless.tokens, alone.tokens);
}

TEST(KvQualityRequestTest, ALosslessEngineRefusesALossyRequestNamingWhy) {
  std::unique_ptr<Engine> e = std::move(Engine::Create(Options("lossless", 0)).value());
  Reply unused;
  const StatusOr<RequestId> id = Submit(*e, Prompt(0), KvQuality::kBalanced, &unused);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("kv_quality 'balanced'"), std::string::npos)
      << id.status().message();
  EXPECT_NE(id.status().message().find("--kv-quality"), std::string::npos);
  // Lossless, asked or not, is what it serves.
  EXPECT_TRUE(Submit(*e, Prompt(0), KvQuality::kLossless, &unused).ok());
  e->RunUntilIdle();
}

}  // namespace
}  // namespace kvl
