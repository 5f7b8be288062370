// `kvl bench lattice --quick` on stories260K (the CI smoke test of the whole bench): the JSON has
// every workload and every (budget, policy) cell with the names the checks read; keep-all
// agrees with itself exactly (the engine is deterministic) and the lossless policies' replies are
// keep-all's; each cell's budget is its fraction of the working set; the RSS bound is what its
// figures say; auto's verdict per workload is its budgets' worst; Redis cells are skipped with a
// reason where no link starts; bad flags are errors naming the flag; the plot script draws the
// JSON. The workloads' scripts share what they claim to share (the working set counts a shared
// prefix once) and the chats' order is skewed. No assertion on time.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cli/bench/engine_drive.h"
#include "cli/bench/lattice_redis_link.h"
#include "cli/bench/lattice_workloads.h"
#include "kvl/kv_tier.h"
#include "run_command.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace kvl {
namespace {

using Result = testing::CommandResult;

Result RunShell(const std::string& command) { return testing::RunShell(command + " 2>&1"); }
Result RunKvl(const std::string& args) { return testing::RunKvl(args, /*with_stderr=*/true); }

class BenchLatticeTest : public testing::ScratchDirTest {
 protected:
  BenchLatticeTest() : ScratchDirTest("kvl-bench-lattice-test") {}
};

bool IsLosslessPolicy(const std::string& p) {
  return p == "keep" || p == "demote-disk" || p == "recompute-residual" || p == "recompute-tokens";
}

TEST_F(BenchLatticeTest, QuickRunHasEveryNameAndLosslessRepliesEqualKeepAll) {
  const std::string json_path = (dir_ / "lattice.json").string();
  const std::string tier = (dir_ / "cells.tier").string();
  const Result r = RunKvl("bench lattice -m " + testing::Stories260KPath() +
                          " --quick --policies auto,recompute-tokens,demote-disk,demote-redis,compress,evict"
                          " --budgets 0.25,0.5 --kv-tier disk:" + tier + ":16MiB"
                          " --redis-script /nonexistent/redis-netns.sh"
                          " --no-calibrate -t 1 --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["bench"], "lattice");
  EXPECT_TRUE(j["quality_meaningful"].get<bool>());  // stories260K is trained
  EXPECT_FALSE(j["redis"]["started"].get<bool>());
  EXPECT_FALSE(j["redis"]["skip_reason"].get<std::string>().empty());
  // Each cell's scratch tier is removed with its engine.
  EXPECT_FALSE(std::filesystem::exists(tier));
  ASSERT_EQ(j["workloads"].size(), 4u);
  const char* names[] = {"chats", "rag", "agent", "long"};
  int64_t pages_demoted = 0;
  for (size_t i = 0; i < 4; ++i) {
    const nlohmann::json& w = j["workloads"][i];
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(w["name"], names[i]);
    const int64_t requests = w["requests"].get<int64_t>();
    const int64_t working_set = w["working_set_bytes"].get<int64_t>();
    EXPECT_EQ(working_set, w["working_set_tokens"].get<int64_t>() * j["kv_bytes_per_token"].get<int64_t>());
    EXPECT_GT(working_set, 0);
    EXPECT_EQ(w["disk_tier"], "disk:" + tier + ":16MiB:scratch");
    for (const char* run : {"reference", "repeat"}) {
      const nlohmann::json& c = w[run];
      SCOPED_TRACE(run);
      EXPECT_EQ(c["error"], "");
      EXPECT_TRUE(c["replies_identical"].get<bool>());
      EXPECT_EQ(c["identical_replies"].get<int64_t>(), requests);
      EXPECT_DOUBLE_EQ(c["top1"].get<double>(), 1.0);
      EXPECT_DOUBLE_EQ(c["kld_mean"].get<double>(), 0.0);
      EXPECT_EQ(c["generated_tokens"], w["generated_tokens"]);
      // Keep-all's pool holds the whole working set.
      EXPECT_GE(c["budget_bytes"].get<int64_t>(), working_set);
    }
    ASSERT_EQ(w["cells"].size(), 12u);  // 2 budgets x 6 policies
    for (const nlohmann::json& c : w["cells"]) {
      SCOPED_TRACE(c.dump());
      for (const char* field :
           {"workload", "policy", "quality", "budget_bytes", "rss_minus_weights_peak_bytes",
            "fixed_bytes", "tok_s", "cpu_tok_s", "kld_mean", "top1", "replies_identical",
            "action_pages", "rss_bound_holds"}) {
        EXPECT_TRUE(c.contains(field)) << field;
      }
      EXPECT_EQ(c["workload"], names[i]);
      const std::string policy = c["policy"].get<std::string>();
      const double fraction = c["budget_fraction"].get<double>();
      EXPECT_EQ(c["budget_bytes"].get<int64_t>(),
                static_cast<int64_t>(static_cast<double>(working_set) * fraction));
      if (policy == "demote-redis") {
        // No script at that path: skipped, saying why, never run.
        EXPECT_NE(c["skipped"].get<std::string>().find("redis"), std::string::npos);
        EXPECT_NE(c["error"].get<std::string>().find("skipped"), std::string::npos);
        continue;
      }
      EXPECT_EQ(c["quality"], policy == "auto" ? "balanced"
                              : IsLosslessPolicy(policy) ? "lossless"
                                                         : "aggressive");
      if (c["error"] != "") continue;
      // The process's memory was read: the fixed part is within the peak, and the bound is what
      // the figures say.
      const int64_t peak = c["rss_minus_weights_peak_bytes"].get<int64_t>();
      const int64_t fixed = c["fixed_bytes"].get<int64_t>();
      EXPECT_GT(fixed, 0);
      EXPECT_GE(peak, fixed);
      EXPECT_EQ(c["rss_bound_holds"].get<bool>(),
                static_cast<double>(peak - fixed) <=
                    static_cast<double>(c["budget_bytes"].get<int64_t>()) * 1.05);
      EXPECT_GT(c["tok_s"].get<double>(), 0);
      EXPECT_GT(c["cpu_tok_s"].get<double>(), 0);
      EXPECT_EQ(c["generated_tokens"], w["generated_tokens"]);
      // Lossless policies give keep-all's replies, token for token, at any budget.
      if (IsLosslessPolicy(policy)) {
        EXPECT_TRUE(c["replies_identical"].get<bool>());
        EXPECT_EQ(c["identical_replies"].get<int64_t>(), requests);
        EXPECT_DOUBLE_EQ(c["kld_mean"].get<double>(), 0.0);
      }
      EXPECT_EQ(c["replies_identical"].get<bool>(), c["identical_replies"].get<int64_t>() == requests);
      if (policy == "demote-disk" && c["action_pages"].contains("demote-disk")) {
        pages_demoted += c["action_pages"]["demote-disk"].get<int64_t>();
      }
    }
    // At half the working set the disk tier holds what the pool cannot: demote-disk completes.
    for (const nlohmann::json& c : w["cells"]) {
      if (c["budget_fraction"] == 0.5 && c["policy"] == "demote-disk") {
        EXPECT_EQ(c["error"], "") << c.dump();
      }
    }
    // auto's verdict: its worst budget's, every budget's beside it.
    const nlohmann::json& v = w["auto_verdict"];
    ASSERT_TRUE(v.contains("best_fixed_policy"));
    ASSERT_TRUE(v.contains("ratio"));
    ASSERT_EQ(v["by_budget"].size(), 2u);
    double worst = 1e300;
    for (const nlohmann::json& b : v["by_budget"]) {
      SCOPED_TRACE(b.dump());
      if (b["auto_tok_s"].get<double>() > 0 && !b["best_fixed_policy"].get<std::string>().empty()) {
        EXPECT_NEAR(b["ratio"].get<double>(),
                    b["auto_tok_s"].get<double>() / b["best_tok_s"].get<double>(), 1e-9);
        EXPECT_EQ(b["within_3pct"].get<bool>(), b["ratio"].get<double>() >= 0.97);
      }
      const bool judged = b["auto_tok_s"].get<double>() <= 0 ||
                          !b["best_fixed_policy"].get<std::string>().empty();
      if (judged) worst = std::min(worst, b["ratio"].get<double>());
    }
    if (worst < 1e300) {
      EXPECT_DOUBLE_EQ(v["ratio"].get<double>(), worst);
    }
  }
  // Budgets below the working set are short: some workload's pages went to disk.
  EXPECT_GT(pages_demoted, 0);

  const std::string python = testing::PythonWithMatplotlib();
  if (python.empty()) GTEST_SKIP() << "plot not checked: no python3 with matplotlib (python3-matplotlib)";
  const std::filesystem::path png = dir_ / "lattice.png";
  const Result plot = RunShell(python + " " + KVL_SOURCE_DIR + "/scripts/plots.py lattice " +
                               png.string() + " " + json_path);
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
}

// On a `kvl synth` file (random weights) the quality figures are marked meaningless.
TEST_F(BenchLatticeTest, RandomWeightsMarkQualityMeaningless) {
  const std::string model = (dir_ / "synth.gguf").string();
  ASSERT_EQ(RunKvl("synth --shape test-llama3 --type f32 -o " + model).exit_code, 0);
  const std::string json_path = (dir_ / "synth.json").string();
  const Result r = RunKvl("bench lattice -m " + model +
                          " --quick --workloads long --policies auto --budgets 0.5"
                          " --no-calibrate -t 1 --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("MEANINGLESS"), std::string::npos) << r.output;
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j["quality_meaningful"].get<bool>());
  EXPECT_FALSE(j["workloads"][0]["cells"][0]["quality_meaningful"].get<bool>());
}

// The scripts: a shared prefix counts once in the working set, the chats arrive skewed, no round
// holds two requests of one stream.
TEST(LatticeWorkloadsTest, ScriptsShareWhatTheyClaimAndChatsAreSkewed) {
  StatusOr<cli::BenchModel> m = cli::LoadBenchModel(testing::Stories260KPath());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  cli::BenchLatticeArgs args;
  const int64_t max_context = m->model->config().context_length;
  StatusOr<cli::LatticeWorkload> rag =
      cli::MakeLatticeWorkload("rag", args, *m->tokenizer, 16, max_context);
  ASSERT_TRUE(rag.ok()) << rag.status().ToString();
  int64_t all_tokens = 0;
  for (const auto& round : rag->rounds) {
    EXPECT_LE(static_cast<int32_t>(round.size()), args.concurrency);
    for (const auto& req : round) {
      all_tokens += static_cast<int64_t>(req.append.size()) + req.max_new_tokens;
    }
  }
  EXPECT_EQ(rag->requests, args.rag_requests);
  // The system prompt (more than --system-tokens, with BOS) is held once, not once per request.
  EXPECT_LE(rag->working_set_tokens, all_tokens - (rag->requests - 1) * args.system_tokens);
  // Each request's question and answer are its own.
  EXPECT_GE(rag->working_set_tokens,
            rag->requests * (args.question_tokens + args.reply_tokens));

  StatusOr<cli::LatticeWorkload> chats =
      cli::MakeLatticeWorkload("chats", args, *m->tokenizer, 16, max_context);
  ASSERT_TRUE(chats.ok()) << chats.status().ToString();
  std::map<int32_t, int> turns;
  for (const auto& round : chats->rounds) {
    std::map<int32_t, int> in_round;
    for (const auto& req : round) {
      ++turns[req.stream];
      EXPECT_EQ(++in_round[req.stream], 1) << "a round holds two turns of chat " << req.stream;
    }
  }
  EXPECT_EQ(static_cast<int32_t>(turns.size()), args.chats);  // every chat has a turn
  int most = 0, once = 0;
  for (const auto& [chat, n] : turns) {
    most = std::max(most, n);
    once += n == 1 ? 1 : 0;
  }
  EXPECT_GE(most, 4 * 1);  // a chat that returns often...
  EXPECT_GE(once, args.chats / 4);  // ...beside many visited once
  // The Zipf draws: deterministic per seed, rank 0 far likelier than the last rank.
  const std::vector<int32_t> a = cli::ZipfDraws(16, 1.1, 4000, 5);
  EXPECT_EQ(a, cli::ZipfDraws(16, 1.1, 4000, 5));
  const int64_t first = std::count(a.begin(), a.end(), 0);
  const int64_t last = std::count(a.begin(), a.end(), 15);
  // 1 / (1/16^1.1) = 21x in expectation; 10x leaves room for the draw's noise.
  EXPECT_GT(first, 10 * std::max<int64_t>(last, 1));

  // A size the model cannot hold is an error naming what to lower.
  args.agent_steps = 1000;
  StatusOr<cli::LatticeWorkload> agent =
      cli::MakeLatticeWorkload("agent", args, *m->tokenizer, 16, max_context);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("--agent-steps"), std::string::npos);
}

// Each cell stores its Redis pages under a key namespace of its own: no cell finds the pages of
// the one before. The script's short form (redis:HOST:PORT) is read as the URL form.
TEST(LatticeRedisLinkTest, EachCellGetsItsOwnNamespace) {
  const std::string pid = std::to_string(::getpid());
  cli::RedisLink link;
  link.tier_spec = "redis://10.0.0.2:6379";
  EXPECT_EQ(cli::CellRedisTierSpec(link, 3), "redis://10.0.0.2:6379/kvl-lattice-" + pid + "-3");
  link.tier_spec = "redis://[fd00::2]:7000/ns?ttl=60";
  EXPECT_EQ(cli::CellRedisTierSpec(link, 4), "redis://[fd00::2]:7000/ns-lattice-" + pid + "-4?ttl=60");
  link.tier_spec = "redis:10.0.0.2:6380";
  EXPECT_EQ(cli::CellRedisTierSpec(link, 5), "redis://10.0.0.2:6380/kvl-lattice-" + pid + "-5");
  for (int cell : {3, 4, 5}) {
    EXPECT_TRUE(ParseTierSpec(cli::CellRedisTierSpec(link, cell)).ok()) << cell;
  }
}

TEST(BenchLatticeArgsTest, BadFlagsAreErrorsNamingTheFlag) {
  const std::string base = "bench lattice -m " + testing::Stories260KPath();
  const std::pair<const char*, const char*> cases[] = {
      {" --policies auto,fastest", "--policies: unknown 'fastest'"},
      {" --workloads chats,chats", "--workloads: 'chats' is given twice"},
      {" --budgets 0.25,1.5", "--budgets: each must be in (0, 1], got 1.5"},
      {" --chats 0", "--chats must be in [1, 1024], got 0"},
      {" --kv-tier ram:1GiB", "--kv-tier: the bench takes a disk tier"},
      {" --redis-rate 5gbit", "--redis-rate: unknown '5gbit'"},
      {" --auto-quality best", "--auto-quality: unknown 'best'"},
      {" --zipf -1", "--zipf must be in [0, 8], got -1"},
  };
  for (const auto& [flags, message] : cases) {
    const Result r = RunKvl(base + flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace kvl
