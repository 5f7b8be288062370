// Continuous batching, prefix sharing and preemption must never change what a sequence generates:
// the same greedy tokens alone, batched, with the prefix cache on or off, and when a tiny KV budget
// forces preemption and recompute.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

const std::vector<std::string>& Prompts() { return testing::StoryPrompts(); }

std::unique_ptr<Engine> MakeEngine(int32_t max_seqs, bool prefix_cache, int64_t budget = 0,
                                   int32_t block_tokens = 16, int64_t batch = 512,
                                   const std::string& cache_type = "f32") {
  EngineOptions o;
  o.cache_type_k = o.cache_type_v = cache_type;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.context_length = 256;
  o.max_seqs = max_seqs;
  o.prefix_cache = prefix_cache;
  o.kv_budget_bytes = budget;
  o.block_tokens = block_tokens;
  o.batch_size = batch;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

Request Greedy(const std::string& prompt, int32_t n = 40) {
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

// Submits every prompt at once and returns each one's generated ids.
std::vector<std::vector<int32_t>> RunAll(Engine& e, const std::vector<std::string>& prompts) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    StatusOr<RequestId> id = e.Submit(Greedy(prompts[i]), [&out, i](const TokenEvent& ev) {
      EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
      if (ev.token >= 0) out[i].push_back(ev.token);
    });
    EXPECT_TRUE(id.ok());
  }
  e.RunUntilIdle();
  return out;
}

std::vector<std::vector<int32_t>> RunOneAtATime(const std::vector<std::string>& prompts,
                                               const std::string& cache_type = "f32") {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& p : prompts) {
    std::unique_ptr<Engine> e = MakeEngine(1, false, 0, 16, 512, cache_type);
    out.push_back(RunAll(*e, {p})[0]);
  }
  return out;
}

TEST(BatchingTest, EightPromptsGiveTheSameTokensAloneAndBatched) {
  const auto alone = RunOneAtATime(Prompts());
  for (const auto& ids : alone) ASSERT_EQ(ids.size(), 40u);

  std::unique_ptr<Engine> batched = MakeEngine(8, false);
  EXPECT_EQ(RunAll(*batched, Prompts()), alone);
  EXPECT_GT(batched->Metrics().mean_batch_seqs, 4.0);  // really ran together

  std::unique_ptr<Engine> cached = MakeEngine(8, true);
  EXPECT_EQ(RunAll(*cached, Prompts()), alone);
  EXPECT_EQ(RunAll(*cached, Prompts()), alone);  // second round: prompts hit the prefix cache

  // Chunked prefill: 5 tokens per step mixes prompt chunks with decodes.
  std::unique_ptr<Engine> chunked = MakeEngine(8, true, 0, 4, 5);
  EXPECT_EQ(RunAll(*chunked, Prompts()), alone);
}

// The quantized cache types keep batch invariance: a row is quantized alone when it is stored, and
// read through the f32 kernels' summation order, so neither batching, nor chunked prefill, nor a
// block split elsewhere changes a sequence's tokens. With a 4-token block, stories260K's 8-wide
// heads sit inside q8_0 / q4_0 blocks of 32 at every offset.
TEST(BatchingTest, QuantizedCacheTypesGiveTheSameTokensAloneAndBatched) {
  for (const std::string type : {"q8_0", "q4_0"}) {
    const auto alone = RunOneAtATime(Prompts(), type);
    for (const auto& ids : alone) ASSERT_EQ(ids.size(), 40u) << type;
    std::unique_ptr<Engine> batched = MakeEngine(8, false, 0, 16, 512, type);
    EXPECT_EQ(RunAll(*batched, Prompts()), alone) << type;
    EXPECT_GT(batched->Metrics().mean_batch_seqs, 4.0) << type;
    std::unique_ptr<Engine> chunked = MakeEngine(8, true, 0, 4, 5, type);
    EXPECT_EQ(RunAll(*chunked, Prompts()), alone) << type;
    EXPECT_EQ(RunAll(*chunked, Prompts()), alone) << type;  // prefix hits on quantized blocks
  }
}

TEST(BatchingTest, TinyBudgetPreemptsAndResumesWithIdenticalOutput) {
  const auto alone = RunOneAtATime(Prompts());
  // stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token; 8 blocks of 16 tokens hold
  // about 2.5 of the 8 sequences (48 tokens each).
  const int64_t block_bytes = 16 * 1280;
  for (bool prefix : {false, true}) {
    std::unique_ptr<Engine> e = MakeEngine(8, prefix, 8 * block_bytes);
    EXPECT_EQ(RunAll(*e, Prompts()), alone) << "prefix cache " << prefix;
    const EngineMetrics m = e->Metrics();
    EXPECT_GT(m.preemptions, 0);
    EXPECT_EQ(m.kv.blocks_total, 8);
    EXPECT_EQ(m.kv.blocks_used, 0) << "prefix cache " << prefix;  // all finished: all returned
    EXPECT_EQ(m.requests_finished, 8);
  }
}

TEST(BatchingTest, SharedPrefixIsReusedNotRecomputed) {
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball.";
  std::unique_ptr<Engine> e = MakeEngine(4, true);
  std::map<int, TokenEvent> finished;
  std::vector<std::vector<int32_t>> ids(2);
  for (int i = 0; i < 2; ++i) {
    const std::string prompt = shared + (i == 0 ? " She wanted" : " Her mom said");
    ASSERT_TRUE(e->Submit(Greedy(prompt, 10), [&, i](const TokenEvent& ev) {
                   if (ev.token >= 0) ids[i].push_back(ev.token);
                   if (ev.finished) finished[i] = ev;
                 }).ok());
    e->RunUntilIdle();  // one after the other: the second finds the first's blocks
  }
  EXPECT_EQ(finished[0].cached_prompt_tokens, 0);
  EXPECT_GE(finished[1].cached_prompt_tokens, 16);
  EXPECT_EQ(finished[1].cached_prompt_tokens % 16, 0);
  EXPECT_GT(e->Metrics().kv.prefix_hit_tokens, 0);

  // The reused blocks give exactly what a cold engine computes.
  std::unique_ptr<Engine> cold = MakeEngine(1, false);
  std::vector<int32_t> cold_ids;
  ASSERT_TRUE(cold->Submit(Greedy(shared + " Her mom said", 10), [&](const TokenEvent& ev) {
                    if (ev.token >= 0) cold_ids.push_back(ev.token);
                  }).ok());
  cold->RunUntilIdle();
  EXPECT_EQ(cold_ids, ids[1]);
}

// Requests submitted together on an opening the pool does not hold compute it once: the first
// admitted computes it, the others wait a step and find it cached (each computed its own copy
// before), and every one generates what it generates alone.
TEST(BatchingTest, RequestsSubmittedTogetherComputeTheirSharedOpeningOnce) {
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball.";
  const std::vector<std::string> prompts = {shared + " She wanted", shared + " Her mom said",
                                            shared + " The dog", "Tom and Sue went to the beach."};
  const auto alone = RunOneAtATime(prompts);
  std::unique_ptr<Engine> e = MakeEngine(4, true);
  std::vector<std::vector<int32_t>> ids(prompts.size());
  std::vector<TokenEvent> finished(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(e->Submit(Greedy(prompts[i], 10), [&, i](const TokenEvent& ev) {
                   if (ev.token >= 0) ids[i].push_back(ev.token);
                   if (ev.finished) finished[i] = ev;
                 }).ok());
  }
  e->RunUntilIdle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(ids[i], std::vector<int32_t>(alone[i].begin(), alone[i].begin() + 10)) << i;
  }
  // The opening's whole pages (its tokens are those of the prompts up to where they part, BOS
  // first, 32 or more).
  const auto opening = static_cast<int64_t>(e->tokenizer().Encode(shared, true).size()) / 16 * 16;
  ASSERT_GE(opening, 32);
  EXPECT_EQ(finished[0].cached_prompt_tokens, 0);
  for (size_t i : {1u, 2u}) EXPECT_EQ(finished[i].cached_prompt_tokens, opening) << i;
  EXPECT_EQ(finished[3].cached_prompt_tokens, 0);  // shares nothing with the others
}

TEST(BatchingTest, StopsCancellationAndErrors) {
  std::unique_ptr<Engine> e = MakeEngine(4, true);
  // A stop string is never emitted.
  Request r = Greedy("Once upon a time", 60);
  r.stop_strings = {"Lily"};
  std::string text, reason;
  ASSERT_TRUE(e->Submit(r, [&](const TokenEvent& ev) {
                 text += ev.text;
                 if (ev.finished) reason = ev.finish_reason;
               }).ok());
  e->RunUntilIdle();
  EXPECT_EQ(reason, "stop");
  EXPECT_EQ(text, ", there was a little girl named ");

  // Stop ids end generation at that token, which is not emitted.
  r = Greedy("Once upon a time", 60);
  r.stop_ids = {13};  // "\n" in the reference continuation
  std::vector<int32_t> ids;
  ASSERT_TRUE(e->Submit(r, [&](const TokenEvent& ev) {
                 if (ev.token >= 0) ids.push_back(ev.token);
                 if (ev.finished) reason = ev.finish_reason;
               }).ok());
  e->RunUntilIdle();
  EXPECT_EQ(reason, "stop");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 13), 0);

  // Cancel before the loop runs: no token, reason "cancelled".
  int tokens = 0;
  StatusOr<RequestId> id = e->Submit(Greedy("The cat"), [&](const TokenEvent& ev) {
    if (ev.token >= 0) ++tokens;
    if (ev.finished) reason = ev.finish_reason;
  });
  ASSERT_TRUE(id.ok());
  e->Cancel(*id);
  e->RunUntilIdle();
  EXPECT_EQ(reason, "cancelled");
  EXPECT_EQ(tokens, 0);

  // Bad requests are refused at Submit.
  Request bad;
  bad.prompt_ids = {1, 100000};
  EXPECT_EQ(e->Submit(bad, {}).status().code(), StatusCode::kInvalidArgument);
  bad.prompt_ids = std::vector<int32_t>(300, 5);
  EXPECT_EQ(e->Submit(bad, {}).status().code(), StatusCode::kOutOfRange);
  bad.prompt_ids = {1};
  bad.sampling.top_p = 2;
  EXPECT_EQ(e->Submit(bad, {}).status().code(), StatusCode::kInvalidArgument);
}

// Where no page of a running sequence may leave the pool, a request the pool cannot hold is
// refused at Submit, naming the budget, the prompt and max_tokens: never run to a late error.
TEST(BatchingTest, BudgetTooSmallForOneSequenceIsRefusedAtSubmit) {
  std::unique_ptr<Engine> e = MakeEngine(2, false, 1 * 16 * 1280);  // one block of 16 tokens
  const StatusOr<RequestId> refused = e->Submit(Greedy("Once upon a time", 40), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = refused.status().message();
  EXPECT_NE(message.find("--kv-budget"), std::string::npos) << message;
  EXPECT_NE(message.find("max_tokens (40)"), std::string::npos) << message;
  EXPECT_NE(message.find("at most 11 tokens"), std::string::npos) << message;  // 16 - 5
  // What fits runs.
  TokenEvent last;
  ASSERT_TRUE(e->Submit(Greedy("Once upon a time", 11), [&](const TokenEvent& ev) {
                 if (ev.finished) last = ev;
               }).ok());
  e->RunUntilIdle();
  EXPECT_EQ(last.finish_reason, "length") << last.error.ToString();
  EXPECT_EQ(last.generated_tokens, 11);
}

TEST(BatchingTest, SubmissionFromManyThreadsWithBackgroundLoop) {
  const auto alone = RunOneAtATime({Prompts()[0], Prompts()[1]});
  std::unique_ptr<Engine> e = MakeEngine(8, true);
  e->Start();
  std::atomic<int> done{0};
  std::vector<std::vector<int32_t>> out(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      ASSERT_TRUE(e->Submit(Greedy(Prompts()[i % 2]), [&, i](const TokenEvent& ev) {
                     if (ev.token >= 0) out[i].push_back(ev.token);
                     if (ev.finished) ++done;
                   }).ok());
    });
  }
  for (std::thread& t : clients) t.join();
  for (int wait = 0; wait < 2000 && done.load() < 8; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  e->Stop();
  ASSERT_EQ(done.load(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], alone[i % 2]) << i;
  const EngineMetrics m = e->Metrics();
  EXPECT_EQ(m.requests_submitted, 8);
  EXPECT_EQ(m.requests_finished, 8);
  EXPECT_GT(m.ttft_mean_ms, 0);
  EXPECT_GT(m.itl_mean_ms, 0);
  EXPECT_EQ(m.kv.blocks_used, 0);  // everything freed; full blocks stay cached
  EXPECT_GT(m.kv.blocks_cached, 0);
}

TEST(ByteSizeTest, ParsesUnits) {
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ll << 20);
  EXPECT_EQ(*ParseByteSize("1GiB"), 1ll << 30);
  EXPECT_EQ(*ParseByteSize("300m"), 300ll << 20);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_FALSE(ParseByteSize("lots").ok());
  EXPECT_FALSE(ParseByteSize("5 parsecs").ok());
}

}  // namespace
}  // namespace kvl
