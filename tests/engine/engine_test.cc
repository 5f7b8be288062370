#include "kvl/engine.h"

#include <gtest/gtest.h>

#include "budget_tiers.h"
#include "test_paths.h"

namespace kvl {
namespace {

std::unique_ptr<Engine> MakeEngine(const std::string& isa = "auto", int threads = 2) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = threads;
  o.context_length = 512;
  o.isa = isa;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

GenerateRequest Greedy(int32_t n) {
  GenerateRequest r;
  r.prompt_ids = {1};
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.stop_at_eos = false;
  return r;
}

TEST(EngineTest, GreedyFromBosReproducesThe64ReferenceIds) {
  for (ops::Isa isa : ops::RunnableIsas()) {
    std::unique_ptr<Engine> e = MakeEngine(std::string(ops::IsaName(isa)));
    ASSERT_NE(e, nullptr);
    StatusOr<GenerateResult> r = e->Generate(Greedy(64));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->output_ids, testing::Stories260KGreedyReference()) << ops::IsaName(isa);
    EXPECT_EQ(r->text,
              "Once upon a time, there was a little girl named Lily. She loved to play outside in "
              "the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
              "too high.\nLily");
  }
}

TEST(EngineTest, TextPromptIsTokenizedWithBos) {
  std::unique_ptr<Engine> e = MakeEngine();
  GenerateRequest r = Greedy(4);
  r.prompt_ids.clear();
  r.prompt = "Once upon a time";
  StatusOr<GenerateResult> out = e->Generate(r);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->prompt_ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  // After "Once upon a time" the reference continues with "," (id 432).
  EXPECT_EQ(out->output_ids[0], 432);
}

TEST(EngineTest, SameSeedSameTextDifferentSeedDifferentText) {
  std::unique_ptr<Engine> e = MakeEngine();
  GenerateRequest r = Greedy(48);
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.0f;
  r.sampling.min_p = 0.0f;
  r.sampling.seed = 7;
  const std::vector<int32_t> a = e->Generate(r)->output_ids;
  const std::vector<int32_t> b = e->Generate(r)->output_ids;
  r.sampling.seed = 8;
  const std::vector<int32_t> c = e->Generate(r)->output_ids;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(EngineTest, CallbackCanStopGeneration) {
  std::unique_ptr<Engine> e = MakeEngine();
  int calls = 0;
  StatusOr<GenerateResult> r =
      e->Generate(Greedy(50), [&](int32_t, std::string_view) { return ++calls < 5; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(r->stop_reason, "callback");
  EXPECT_EQ(r->output_ids.size(), 5u);
}

TEST(EngineTest, GenerationStopsAtTheContextLength) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = 20;
  std::unique_ptr<Engine> e = std::move(Engine::Create(o).value());
  StatusOr<GenerateResult> r = e->Generate(Greedy(100));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop_reason, "context");
  EXPECT_EQ(r->output_ids.size(), 19u);
}

TEST(EngineTest, BadInputGivesClearErrors) {
  std::unique_ptr<Engine> e = MakeEngine();
  GenerateRequest r = Greedy(4);
  r.prompt_ids = {1, 9999};
  StatusOr<GenerateResult> out = e->Generate(r);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("9999"), std::string::npos) << out.status().message();

  r.prompt_ids = std::vector<int32_t>(600, 5);
  out = e->Generate(r);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("context"), std::string::npos);

  r = Greedy(4);
  r.sampling.temperature = -1;
  EXPECT_FALSE(e->Generate(r).ok());

  EngineOptions o;
  o.model_path = testing::SharedModelPath("stories260K.bin");  // not a GGUF file
  StatusOr<std::unique_ptr<Engine>> bad = Engine::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stories260K.bin"), std::string::npos);
}

}  // namespace
}  // namespace kvl

namespace kvl {
namespace {

// A cost profile handed to the engine is used as it is: nothing is read, measured or written,
// and the KV policy prices pages with it (its recompute time shows in the predictions).
TEST(EngineTest, AGivenCostProfileIsUsedAsItIsWithNothingMeasuredOrWritten) {
  const std::string path = ::testing::TempDir() + "/kvl-given-profile-" +
                           std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                           ".json";
  std::remove(path.c_str());
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = 256;
  o.kv_policy = "recompute-tokens";
  o.kv_budget_bytes = 4 * 16 * 1280;  // a few f32 pages: the two sequences preempt each other
  o.cache_type_k = o.cache_type_v = "f32";
  testing::SetTiersBesidePool(&o, {"ram:8MiB"});
  o.max_seqs = 2;
  // Without the prefix cache every page dropped at a preemption is recomputed at the resume (the
  // two requests are identical: with it, a resume finds its pages in the pool, recomputes
  // nothing, and no prediction is checked).
  o.prefix_cache = false;
  o.profile_path = path;
  MachineProfile profile;
  profile.model.layers = 5;  // stories260K
  // 123 ms per 16-token page, whatever its position: recognisable in predictions.
  profile.recompute_from_tokens.token_layer_ms = 123.0 / (16 * 5);
  profile.recompute_from_residual.call_ms = 1.0;
  profile.memory_copy_gbps = 10;
  profile.ram.read.gbps = profile.ram.write.gbps = 10;
  profile.disk_buffered.read.gbps = profile.disk_buffered.write.gbps = 1;
  o.cost_profile = profile;
  auto created = Engine::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Engine& e = **created;
  for (int i = 0; i < 2; ++i) {
    Request r;
    r.prompt_ids = {1};
    r.max_new_tokens = 60;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    ASSERT_TRUE(e.Submit(r, {}).ok());
  }
  e.RunUntilIdle();
  const EngineMetrics m = e.Metrics();
  const KvActionCounter& recompute = m.kv_actions[static_cast<size_t>(KvAction::kRecomputeTokens)];
  ASSERT_GT(recompute.pages_restored, 0);
  // 123 ms per page: the given profile priced every page. (What decode's idle arithmetic hides
  // lowers a recompute's cost, not its predicted time.)
  const double per_page = recompute.predicted_ms / static_cast<double>(recompute.pages_restored);
  EXPECT_NEAR(per_page, 123.0, 1e-6);
  FILE* f = std::fopen(path.c_str(), "r");
  EXPECT_EQ(f, nullptr) << "the engine wrote a profile it was not asked to";
  if (f != nullptr) std::fclose(f);
}

}  // namespace
}  // namespace kvl
