// `kvl bench frontier` end to end on stories260K with a tiny sweep: every point of the sweep in
// the JSON, with positive times, a winner that is the fastest measured way, the model's
// prediction beside it, the rebuilt K/V bit-exact, no tier file left behind; and the plot script
// turns the JSON into a PNG. No assertion on time: which way wins is the machine's business.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "run_command.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace kvl {
namespace {

using Result = testing::CommandResult;

// A shell command line, its stderr joined to the output.
Result RunShell(const std::string& command) { return testing::RunShell(command + " 2>&1"); }

Result RunKvl(const std::string& args) { return testing::RunKvl(args, /*with_stderr=*/true); }

class BenchFrontierTest : public testing::ScratchDirTest {
 protected:
  BenchFrontierTest() : ScratchDirTest("kvl-bench-frontier-test") {}
};

constexpr const char* kWays[] = {"recompute-residual", "recompute-tokens", "transfer"};

TEST_F(BenchFrontierTest, EveryPointIsMeasuredAndTheWinnerIsTheFastest) {
  const std::string json_path = (dir_ / "frontier.json").string();
  const Result r = RunKvl("bench frontier -m " + testing::Stories260KPath() +
                          " -t 1 -r 3 --page-tokens 64,16 --depths 5,1 --position 32"
                          " --tiers ram,disk:" + dir_.string() +
                          " --no-calibrate --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("### crossovers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("### prediction error"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("past the model's context"), std::string::npos) << r.output;

  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["bench"], "frontier");
  // The sweep comes out sorted, whatever order it was given in.
  EXPECT_EQ(j["page_tokens"], nlohmann::json({16, 64}));
  EXPECT_EQ(j["depths"], nlohmann::json({1, 5}));
  EXPECT_TRUE(j["rebuilt_bit_exact"].get<bool>()) << r.output;
  const double idle = j["decode"]["idle_fraction"].get<double>();
  EXPECT_TRUE(idle >= 0 && idle <= 1) << idle;
  // The load the points were measured under: the CPU share others took meanwhile (Linux's /proc
  // is readable here), named in the table too.
  ASSERT_TRUE(j["others_cpu_share"].is_number()) << j["others_cpu_share"].dump();
  const double others = j["others_cpu_share"].get<double>();
  EXPECT_TRUE(others >= 0 && others <= 1) << others;
  EXPECT_NE(r.output.find("of the CPU while this measured"), std::string::npos) << r.output;

  // 2 tiers x 2 phases x 2 page sizes x 2 depths, each exactly once.
  std::set<std::tuple<std::string, std::string, int64_t, int64_t>> seen;
  for (const nlohmann::json& p : j["points"]) {
    seen.insert({p["tier"].get<std::string>(), p["phase"].get<std::string>(),
                 p["page_tokens"].get<int64_t>(), p["depth"].get<int64_t>()});
    std::string fastest;
    double best = 0;
    for (const char* way : kWays) {
      const double measured = p["measured_ms"][way].get<double>();
      const double predicted = p["predicted_ms"][way].get<double>();
      EXPECT_GT(measured, 0) << way << " " << p.dump();
      EXPECT_GT(predicted, 0) << way << " " << p.dump();
      if (fastest.empty() || measured < best) {
        fastest = way;
        best = measured;
      }
    }
    EXPECT_EQ(p["winner"], fastest) << p.dump();
    EXPECT_GT(p["rebuild_ms"].get<double>(), 0) << p.dump();
  }
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_EQ(j["points"].size(), 16u);
  for (const std::string tier : {"ram", "disk"}) {
    for (const std::string phase : {"prefill", "decode"}) {
      for (int64_t t : {16, 64}) {
        for (int64_t d : {1, 5}) EXPECT_EQ(seen.count({tier, phase, t, d}), 1u) << tier << phase << t << d;
      }
    }
  }
  // A crossover names two different ways and a crossing inside its interval.
  for (const nlohmann::json& c : j["crossovers"]) {
    EXPECT_NE(c["from"], c["to"]) << c.dump();
    const double at = c["at"].get<double>();
    EXPECT_GE(at, c["between"][0].get<double>() - 1e-9) << c.dump();
    EXPECT_LE(at, c["between"][1].get<double>() + 1e-9) << c.dump();
  }
  // The disk tier's scratch file goes with it.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "frontier.json") << entry.path();
  }

  // The figure: scripts/plots.py with the first python3 that has matplotlib.
  const std::string python = testing::PythonWithMatplotlib();
  if (python.empty()) GTEST_SKIP() << "plot not checked: no python3 with matplotlib (python3-matplotlib)";
  const std::filesystem::path png = dir_ / "frontier.png";
  const Result plot = RunShell(python + " " + KVL_SOURCE_DIR + "/scripts/plots.py frontier " +
                               png.string() + " " + json_path);
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  std::ifstream image(png, std::ios::binary);
  char magic[8] = {};
  image.read(magic, sizeof(magic));
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
}

// Pages past the model's context (stories260K: 2048 tokens) are timed, and said to be.
TEST(BenchFrontierArgsTest, PagesPastTheContextAreNamed) {
  const Result r = RunKvl("bench frontier -m " + testing::Stories260KPath() +
                          " -t 1 -r 1 --page-tokens 2000 --depths 1 --position 100 --tiers ram"
                          " --no-calibrate");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pages of more than 1948 tokens after --position 100 run past the "
                          "model's context of 2048 tokens"),
            std::string::npos)
      << r.output;
}

TEST(BenchFrontierArgsTest, BadSweepsAreClearErrors) {
  const std::string model = " -m " + testing::Stories260KPath();
  Result r = RunKvl("bench frontier" + model + " --depths 9 --no-calibrate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("the model has 5 layers"), std::string::npos) << r.output;
  r = RunKvl("bench frontier" + model + " --tiers floppy");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("use ram, disk[:DIR] or redis://"), std::string::npos) << r.output;
  r = RunKvl("bench frontier" + model + " --page-tokens 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--page-tokens must be in"), std::string::npos) << r.output;
  r = RunKvl("bench frontier" + model + " --tiers disk:/no/such/dir --no-calibrate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("is not a directory"), std::string::npos) << r.output;
  // An unreachable Redis fails before anything is measured (nothing listens on port 1).
  r = RunKvl("bench frontier" + model + " --tiers ram,redis://127.0.0.1:1 --no-calibrate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("127.0.0.1:1 is unavailable"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("measuring"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvl
