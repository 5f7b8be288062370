// The per-token step allocates nothing (STYLE.md rule 4): 100 decode steps of a batch of 4 on
// stories260K after warm-up, the whole engine step (scheduling, KV plan and commit, forward,
// sampling, detokenizing, stop filtering, events, metrics) counted by a replaced operator new.
// The one allowance: a token's text longer than std::string's inline buffer (15 bytes) would
// allocate in the event; stories260K's pieces are all shorter, so here the count must be zero.
#include <gtest/gtest.h>

#include "alloc_counter.h"
#include "kvl/engine.h"
#include "test_paths.h"

KVL_ALLOC_COUNTER_HOOKS()

namespace kvl {
namespace {

TEST(EngineAllocTest, SteadyDecodeOfFourSequencesDoesNotAllocate) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.max_seqs = 4;
  o.context_length = 512;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;

  int64_t tokens = 0;
  int64_t finished = 0;
  const EventCallback on_event = [&](const TokenEvent& ev) {
    if (ev.token >= 0) ++tokens;
    if (ev.finished) ++finished;
  };
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = testing::StoryPrompts()[static_cast<size_t>(i)];
    r.max_new_tokens = 400;
    r.ignore_eos = true;
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;  // greedy and sampled alike
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = static_cast<uint64_t>(i);
    ASSERT_TRUE(e.Submit(std::move(r), on_event).ok());
  }
  // Warm-up: the prompts, and enough decode steps for every sequence to cross a block boundary
  // (the plan's per-sequence vectors reach their working size).
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(e.Step());
  const int64_t tokens_before = tokens;

  testing::AllocCounter counter;
  for (int i = 0; i < 100; ++i) e.Step();
  const int64_t allocations = counter.Stop();

  // At least a token a step each (speculative decoding, on by default, may verify more).
  EXPECT_GE(tokens - tokens_before, 400) << "100 steps of 4 decoding sequences";
  EXPECT_EQ(finished, 0);
  EXPECT_EQ(allocations, 0) << "heap allocations in 100 steady decode steps";
}

}  // namespace
}  // namespace kvl
