// kvl run --kv-trace and kvl bench replay, end to end through the binary: a run under pressure
// reports its prediction errors and writes a trace; the replay of it prints every policy at every
// capacity, Belady's optimal never beaten and the engine's reuse forecast within 10% of it where
// LRU is not; a hand-written trace gives the misses it must.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "run_command.h"
#include "test_paths.h"

namespace kvl {
namespace {

using Result = testing::CommandResult;

Result Kvl(const std::string& args, bool with_stderr = false) {
  return testing::RunKvl(args, with_stderr);
}

std::string Temp(const std::string& name) {
  return ::testing::TempDir() + "/kvl-replay-cli-" + std::to_string(getpid()) + "-" + name;
}

TEST(BenchReplayCliTest, RunWritesATraceThatReplays) {
  const std::string prompts = Temp("prompts.txt");
  std::ofstream(prompts) << "Once upon a time\nThe little dog\nLily wanted to\nThe cat sat on\n";
  const std::string trace = Temp("run.trace");
  Result run = Kvl("run -m " + testing::Stories260KPath() + " -f " + prompts +
                       " -np 4 -n 200 --temp 0 -t 1 -c 256 --kv-budget 4632KiB --kv-policy auto "
                       "--kv-tier ram:4MiB --no-prefix-cache --no-calibrate --kv-trace " +
                       trace,
                   /*with_stderr=*/true);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("kvl: kv prediction demote-ram"), std::string::npos) << run.output;

  Result replay = Kvl("bench replay " + trace + " -o json");
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  const nlohmann::json j = nlohmann::json::parse(replay.output);
  ASSERT_GT(j["pool_blocks"].get<int64_t>(), 0);
  std::map<int64_t, std::map<std::string, int64_t>> misses;  // capacity -> policy -> misses
  for (const nlohmann::json& r : j["results"]) {
    misses[r["capacity_pages"].get<int64_t>()][r["policy"].get<std::string>()] =
        r["misses"].get<int64_t>();
  }
  EXPECT_EQ(misses.size(), 3u);  // the pool, half and twice
  for (const auto& [capacity, by_policy] : misses) {
    ASSERT_EQ(by_policy.size(), 4u) << capacity;
    for (const auto& [policy, n] : by_policy) EXPECT_LE(by_policy.at("belady"), n) << policy;
  }
  // Four sequences decoding under full attention read every page at every step (a cyclic scan):
  // at the engine's pool size the reuse forecast stays within 10% of Belady's misses, LRU misses
  // far more (this run: about 1.5% against 4x).
  const std::map<std::string, int64_t>& at_pool = misses[j["pool_blocks"].get<int64_t>()];
  EXPECT_LE(static_cast<double>(at_pool.at("policy")),
            1.10 * static_cast<double>(at_pool.at("belady")));
  EXPECT_LT(at_pool.at("policy"), at_pool.at("lru"));
  EXPECT_GT(static_cast<double>(at_pool.at("lru")),
            1.10 * static_cast<double>(at_pool.at("belady")));
  EXPECT_EQ(j["recorded"]["capacity_pages"], j["pool_blocks"]);
  // On the blocks the engine had for listed pages (the pool less the partial pages), Belady is
  // not beaten by the forecast under the engine's pins. The engine itself is held to Belady over
  // the whole pool: that bound charges every sequence a block for a partial page at every step,
  // also at the steps its last page is exactly full, and the engine brings pages back into
  // such blocks (promotion back), so it may beat the bound there.
  const nlohmann::json& rec = j["recorded"];
  EXPECT_LE(rec["belady_full_pages_misses"].get<int64_t>(),
            rec["policy_pinned_misses"].get<int64_t>());
  EXPECT_LE(at_pool.at("belady"), rec["misses"].get<int64_t>());
  EXPECT_GT(j["recorded"]["brought_back"].get<int64_t>(), 0);

  Result table = Kvl("bench replay " + trace + " --capacity-pages 4,8 --miss-ms 2");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("| 8 | belady |"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("miss price 2 ms a page (--miss-ms)"), std::string::npos)
      << table.output;
}

// Pages 0 1 2 3 read in turn, twice, by one request each step: with room for 3, LRU misses the
// four second reads, Belady one. Priced at 1.5 ms a miss (the trace's demote-ram price).
TEST(BenchReplayCliTest, HandWrittenTraceGivesKnownMisses) {
  const std::string trace = Temp("loop.trace");
  {
    std::ofstream f(trace);
    f << "kvl-trace 1 block_tokens=16 pool_blocks=3 price_ms=0,-,-,1.5,-,-,9,0\n";
    for (int i = 0; i < 4; ++i) f << "P " << i << " " << i << " 0 -\n";
    for (int step = 0; step < 8; ++step) f << "S " << step << "\nR " << step % 4 << " 1 1\n";
  }
  Result r = Kvl("bench replay " + trace + " --capacity-pages 3 -o json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["miss_ms"], 1.5);
  std::map<std::string, int64_t> misses;
  for (const nlohmann::json& x : j["results"]) misses[x["policy"]] = x["misses"];
  EXPECT_EQ(misses["lru"], 4);
  EXPECT_EQ(misses["belady"], 1);

  Result bad = Kvl("bench replay " + trace + " --capacity-pages 0", /*with_stderr=*/true);
  EXPECT_NE(bad.exit_code, 0);
  std::ofstream(trace, std::ios::app) << "R 9 1 0\n";  // a request never named
  Result broken = Kvl("bench replay " + trace, /*with_stderr=*/true);
  EXPECT_NE(broken.exit_code, 0);
  EXPECT_NE(broken.output.find("line 22"), std::string::npos) << broken.output;
}

}  // namespace
}  // namespace kvl
