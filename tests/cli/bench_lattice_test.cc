// `kvl bench lattice` at a tiny setting on stories260K (the CI smoke test): the JSON has every
// workload, every (budget, policy) cell with its figures and auto's verdict per budget; keep-all
// agrees with itself exactly (the engine is deterministic); the lossless policies' replies equal
// keep-all's; pages brought back carry measured time; each verdict's closing note says why where
// auto is not within 5% or not strictly best; bad lists are errors naming the flag; the plot
// script draws the JSON. No assertion on time.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

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

TEST_F(BenchLatticeTest, EveryCellIsMeasuredAndKeepAllAgreesWithItself) {
  const std::string json_path = (dir_ / "lattice.json").string();
  const Result r = RunKvl("bench lattice -m " + testing::Stories260KPath() +
                          " --policies auto,keep,demote,evict --budgets 0.25,0.5 --chats 2"
                          " --turns 2 --user-min 16 --user-max 20 --reply 8 --docs 2"
                          " --doc-tokens 48 --questions 2 --question-tokens 8 --long-seqs 2"
                          " --long-tokens 40 --kv-recent 16 --no-calibrate -t 1 --json " +
                          json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["bench"], "lattice");
  ASSERT_EQ(j["workloads"].size(), 3u);
  const char* names[] = {"chats", "rag", "long"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& w = j["workloads"][i];
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(w["name"], names[i]);
    EXPECT_GT(w["keep_all_peak_bytes"].get<int64_t>(), 0);
    const int64_t requests = w["requests"].get<int64_t>();
    EXPECT_EQ(requests, i == 0 ? 4 : i == 1 ? 4 : 2);  // 2 chats x 2 turns, 2 docs x 2, 2
    for (const char* run : {"reference", "repeat"}) {
      const nlohmann::json& c = w[run];
      EXPECT_EQ(c["error"], "") << run;
      EXPECT_DOUBLE_EQ(c["agreement"].get<double>(), 1.0) << run;
      EXPECT_EQ(c["identical"].get<int64_t>(), requests) << run;
      EXPECT_DOUBLE_EQ(c["kld"].get<double>(), 0.0) << run;
      EXPECT_EQ(c["generated_tokens"], w["generated_tokens"]) << run;
      EXPECT_GT(c["tok_s"].get<double>(), 0) << run;
    }
    ASSERT_EQ(w["cells"].size(), 8u);  // 2 budgets x 4 policies
    for (const nlohmann::json& c : w["cells"]) {
      SCOPED_TRACE(c.dump());
      EXPECT_LT(c["budget_bytes"].get<int64_t>(), w["keep_all_peak_bytes"].get<int64_t>());
      for (const char* field : {"tok_s", "ttft_p50_ms", "ttft_p99_ms", "agreement", "kld",
                                "identical", "preemptions", "actions", "error"}) {
        EXPECT_TRUE(c.contains(field)) << field;
      }
      if (c["error"] != "") continue;
      EXPECT_GE(c["ttft_p99_ms"].get<double>(), c["ttft_p50_ms"].get<double>());
      // Pages brought back took measured time; none brought back, none.
      int64_t restored = 0;
      for (const auto& [action, pages] : c["actions_restored"].items()) {
        EXPECT_TRUE(c["actions"].contains(action)) << action;
        restored += pages.get<int64_t>();
      }
      if (restored > 0) {
        EXPECT_GT(c["bring_back_ms"].get<double>(), 0);
      } else {
        EXPECT_EQ(c["bring_back_ms"].get<double>(), 0);
      }
      // Lossless policies give keep-all's replies, token for token, at any budget.
      if (c["policy"] == "keep" || c["policy"] == "demote") {
        EXPECT_EQ(c["identical"].get<int64_t>(), requests);
      }
    }
    // At half of keep-all's peak every lossless fixed policy holds these workloads.
    for (const nlohmann::json& c : w["cells"]) {
      if (c["budget_fraction"] == 0.5 && (c["policy"] == "keep" || c["policy"] == "demote")) {
        EXPECT_EQ(c["error"], "") << c.dump();
      }
    }
    ASSERT_EQ(w["auto_verdicts"].size(), 2u);
    // The closing note says why wherever auto is not within 5% of the best policy of its
    // quality or not strictly best, and is empty where it is both.
    for (const nlohmann::json& v : w["auto_verdicts"]) {
      SCOPED_TRACE(v.dump());
      const std::string note = v["note"].get<std::string>();
      if (v["auto_tok_s"].get<double>() == 0) {  // at 1/4 this pool is a block or two
        EXPECT_EQ(note, "auto did not complete");
        continue;
      }
      const bool within = v["within_5pct"].get<bool>();
      const bool best = v["strictly_best"].get<bool>();
      EXPECT_EQ(note.empty(), within && best);
      // A fixed policy that made auto's choices page for page leaves auto no strict win.
      if (!v["same_choices_as"].empty()) {
        EXPECT_FALSE(best);
      }
      EXPECT_EQ(note.find("not strictly best: ") != std::string::npos, !best);
      EXPECT_EQ(note.find("more than 5% slower than " + v["best_policy"].get<std::string>()) !=
                    std::string::npos,
                !within);
    }
  }

  const std::string python = testing::PythonWithMatplotlib();
  if (python.empty()) GTEST_SKIP() << "plot not checked: no python3 with matplotlib (python3-matplotlib)";
  const std::filesystem::path png = dir_ / "lattice.png";
  const Result plot = RunShell(python + " " + KVL_SOURCE_DIR + "/scripts/plots.py lattice " +
                               png.string() + " " + json_path);
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
}

TEST(BenchLatticeArgsTest, BadListsAreErrorsNamingTheFlag) {
  const std::string base = "bench lattice -m " + testing::Stories260KPath();
  Result r = RunKvl(base + " --policies auto,fastest");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--policies: unknown 'fastest'"), std::string::npos) << r.output;
  r = RunKvl(base + " --workloads chats,chats");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--workloads: 'chats' is given twice"), std::string::npos) << r.output;
  r = RunKvl(base + " --budgets 0.25,1.5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--budgets: each must be in (0, 1], got 1.5"), std::string::npos)
      << r.output;
  r = RunKvl(base + " --chats 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--chats must be in [1, 256], got 0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvl
