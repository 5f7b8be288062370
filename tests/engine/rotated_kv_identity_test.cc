// A KV page carries its cache type in its identity: pages a q4_0r engine wrote to a persistent
// disk tier come back to the next q4_0r engine (the file does carry them), but an engine with
// q4_0 caches (the same bytes per page, another meaning: rows not rotated) finds none of them and
// answers as a q4_0 engine with nothing but its pool. On the project's trained model
// (kvl-doc-12m, head_dim 64; stories260K's head_dim 8 cannot be rotated).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "fixed_prices.h"
#include "greedy_reply.h"
#include "kvl/engine.h"

namespace kvl {
namespace {

std::string DocModelPath() { return std::string(KVL_TESTS_DIR) + "/../models/kvl-doc-12m.gguf"; }

EngineOptions Options(const std::string& type, const std::string& disk) {
  EngineOptions o;
  o.model_path = DocModelPath();
  o.num_threads = 1;  // see long_conversation_test.cc: a spinning pool on a busy machine
  o.context_length = 512;
  o.max_seqs = 2;
  o.cache_type_k = o.cache_type_v = type;
  if (!disk.empty()) o.kv_tiers = {"disk:" + disk + ":16MiB"};
  // Fixed prices (fixed_prices.h), at this model's depth.
  MachineProfile prices = testing::FixedStoriesPrices(/*residual_ms=*/5, /*tokens_ms=*/50);
  prices.model.layers = 6;
  o.cost_profile = prices;
  return o;
}

std::vector<int32_t> Prompt(Engine& e) {
  std::string text;
  for (int i = 0; i < 4; ++i) {
    text += "The package manager keeps a list of every file it installed, so that removing a "
            "package removes its files and nothing else. ";
  }
  return e.tokenizer().Encode(text, /*add_bos=*/true);
}

TEST(RotatedKvIdentityTest, PagesOfARotatedCacheAreNeverReadAsAnotherType) {
  const std::string disk =
      ::testing::TempDir() + "/kvl-rotated-identity-" + std::to_string(getpid()) + ".pages";
  std::filesystem::remove(disk);
  int64_t prompt_tokens = 0;
  testing::GreedyReply written;
  {
    auto e = testing::MakeEngine(Options("q4_0r", disk));
    ASSERT_NE(e, nullptr);
    const std::vector<int32_t> prompt = Prompt(*e);
    prompt_tokens = static_cast<int64_t>(prompt.size());
    ASSERT_GT(prompt_tokens, 64);
    written = testing::GenerateGreedy(*e, prompt, 8);
    EXPECT_EQ(written.cached_prompt_tokens, 0);
  }
  {
    // The same type: the file carries the pages over to a fresh engine.
    auto e = testing::MakeEngine(Options("q4_0r", disk));
    ASSERT_NE(e, nullptr);
    const testing::GreedyReply again = testing::GenerateGreedy(*e, Prompt(*e), 8);
    EXPECT_EQ(again.cached_prompt_tokens, (prompt_tokens - 1) / 16 * 16);
    EXPECT_EQ(again.tokens, written.tokens);
  }
  testing::GreedyReply pool_only;
  {
    auto e = testing::MakeEngine(Options("q4_0", ""));
    ASSERT_NE(e, nullptr);
    pool_only = testing::GenerateGreedy(*e, Prompt(*e), 8);
  }
  // q4_0: pages of the same size, not rotated. Nothing of the file is read as its own.
  auto e = testing::MakeEngine(Options("q4_0", disk));
  ASSERT_NE(e, nullptr);
  const testing::GreedyReply other = testing::GenerateGreedy(*e, Prompt(*e), 8);
  EXPECT_EQ(other.cached_prompt_tokens, 0);
  EXPECT_EQ(other.tokens, pool_only.tokens);
  std::filesystem::remove(disk);
}

}  // namespace
}  // namespace kvl
