// The KV action lattice on many sequences under a budget that holds about three of eight: the
// pages of running sequences are demoted and streamed (demote policies), and preempted sequences'
// pages are demoted to a RAM or disk tier (promoted back at resume), checkpointed as residuals, or
// dropped and recomputed from their tokens. Every one of these is lossless: the greedy output
// equals keep-all, bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "budget_tiers.h"
#include "kvl/engine.h"
#include "page_file_corruption.h"
#include "test_paths.h"

namespace kvl {
namespace {

const std::vector<std::string>& Prompts() { return testing::StoryPrompts(); }

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;

EngineOptions Options(int32_t max_seqs, int64_t budget_pages) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.context_length = 256;
  o.max_seqs = max_seqs;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.prefix_cache = false;  // so resumed pages come from the tiers, not the prefix cache
  // One profile per test process: ctest runs these tests in parallel.
  o.profile_path = testing::ProcessProfilePath();
  return o;
}

std::vector<std::vector<int32_t>> RunAll(Engine& e, int32_t n = 200) {
  std::vector<std::vector<int32_t>> out(Prompts().size());
  for (size_t i = 0; i < Prompts().size(); ++i) {
    Request r;
    r.prompt = Prompts()[i];
    r.max_new_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    EXPECT_TRUE(e.Submit(r, [&out, i](const TokenEvent& ev) {
                   EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                   if (ev.token >= 0) out[i].push_back(ev.token);
                 }).ok());
  }
  e.RunUntilIdle();
  return out;
}

const std::vector<std::vector<int32_t>>& KeepAll() {
  static const std::vector<std::vector<int32_t>> expected = [] {
    EngineOptions o = Options(8, 0);
    o.kv_budget_bytes = 0;  // room for everything: nothing is ever preempted
    std::unique_ptr<Engine> e = std::move(Engine::Create(o).value());
    auto out = RunAll(*e);
    EXPECT_EQ(e->Metrics().preemptions, 0);
    return out;
  }();
  return expected;
}

int64_t Pages(const EngineMetrics& m, KvAction a) { return m.kv_actions[static_cast<size_t>(a)].pages; }
int64_t Restored(const EngineMetrics& m, KvAction a) {
  return m.kv_actions[static_cast<size_t>(a)].pages_restored;
}

// A budget of 40 pages holds about 3 of the 8 sequences (205+ tokens = 13+ pages each): the
// scheduler preempts constantly, and every lossless action must reproduce keep-all for 200 tokens.
TEST(KvActionsTest, EveryLosslessPolicyMatchesKeepAllUnderPressure) {
  const std::string disk = ::testing::TempDir() + "/kvl-actions.pages";
  struct Case {
    std::string policy;
    std::vector<std::string> tiers;
    KvAction expected;
  };
  const std::vector<Case> cases = {
      {"demote", {"ram:64MiB"}, KvAction::kDemoteRam},
      {"demote-disk", {"disk:" + disk + ":64MiB:scratch"}, KvAction::kDemoteDisk},
      {"recompute-tokens", {}, KvAction::kRecomputeTokens},
      {"recompute-residual", {"ram:64MiB"}, KvAction::kRecomputeResidual},
      {"auto", {"ram:64MiB", "disk:" + disk + ":64MiB:scratch"}, KvAction::kKeep},
  };
  for (const Case& c : cases) {
    EngineOptions o = Options(8, 40);
    o.kv_policy = c.policy;
    testing::SetTiersBesidePool(&o, c.tiers);
    StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(RunAll(**e), KeepAll()) << c.policy;
    const EngineMetrics m = (*e)->Metrics();
    EXPECT_GT(m.preemptions, 0) << c.policy;
    EXPECT_EQ(m.kv.blocks_used, 0) << c.policy;  // every request finished: all blocks returned
    if (c.expected != KvAction::kKeep) {
      EXPECT_GT(Pages(m, c.expected), 0) << c.policy;
      EXPECT_GT(Restored(m, c.expected), 0) << c.policy;
    } else {
      // auto: the cost model chose something lossless for every page, and it all came back.
      const int64_t chosen = Pages(m, KvAction::kDemoteRam) + Pages(m, KvAction::kDemoteDisk) +
                             Pages(m, KvAction::kRecomputeTokens);
      EXPECT_GT(chosen, 0);
      EXPECT_EQ(Pages(m, KvAction::kEvict) + Pages(m, KvAction::kCompressInt8), 0);
    }
    EXPECT_EQ(m.kv_checksum_failures, 0);
  }
}

// A corrupted disk page is caught by its checksum and recomputed: the output does not change.
TEST(KvActionsTest, CorruptDiskPageIsRecomputedAndOutputUnchanged) {
  const std::string disk = ::testing::TempDir() + "/kvl-corrupt.pages";
  EngineOptions o = Options(8, 40);
  o.kv_policy = "demote-disk";
  o.kv_tiers = {"disk:" + disk + ":64MiB:scratch"};
  std::unique_ptr<Engine> e = std::move(Engine::Create(o).value());
  std::vector<std::vector<int32_t>> out(Prompts().size());
  for (size_t i = 0; i < Prompts().size(); ++i) {
    Request r;
    r.prompt = Prompts()[i];
    r.max_new_tokens = 200;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    ASSERT_TRUE(e->Submit(r, [&out, i](const TokenEvent& ev) {
                   if (ev.token >= 0) out[i].push_back(ev.token);
                 }).ok());
  }
  // Step until pages sit on disk, then flip a byte in every 4 KiB of the page file.
  int corruptions = 0;
  while (e->Step()) {
    if (corruptions < 3 && Pages(e->Metrics(), KvAction::kDemoteDisk) > 0) {
      testing::CorruptEvery4KiB(disk, 2000);
      ++corruptions;
    }
  }
  EXPECT_GT(corruptions, 0);
  EXPECT_EQ(out, KeepAll());
  EXPECT_GT(e->Metrics().kv_checksum_failures, 0);
}

TEST(KvActionsTest, BadPolicyAndTierFlagsAreClearErrors) {
  EngineOptions o = Options(2, 40);
  o.kv_policy = "demote";  // no RAM tier
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.kv_policy = "shred";
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.kv_policy = "demote-disk";  // no disk tier
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.kv_policy = "auto";
  o.kv_tiers = {"tape:1GiB"};
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl
