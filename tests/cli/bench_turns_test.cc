// `kvl bench turns` end to end on stories260K: a short conversation under every configuration,
// checked through its JSON (the replies, the budget, the prefill), and the restart measurement.
// No assertion on time: the bench prints timings, the tests check what must hold on any machine.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "run_command.h"
#include "test_paths.h"

namespace kvl {
namespace {

using Result = testing::CommandResult;

Result RunKvl(const std::string& args) { return testing::RunKvl(args, /*with_stderr=*/true); }

// A directory of the test's own for the JSON and the disk tiers' files.
class BenchTurnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvl-bench-turns-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  nlohmann::json ReadJson(const std::string& name) {
    std::ifstream f(dir_ / name);
    return nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  }

  std::filesystem::path dir_;
};

const nlohmann::json* FindConfig(const nlohmann::json& j, const std::string& name) {
  for (const nlohmann::json& c : j["configs"]) {
    if (c["name"] == name) return &c;
  }
  return nullptr;
}

int64_t Sum(const nlohmann::json& config, const char* field) {
  int64_t s = 0;
  for (const nlohmann::json& t : config["turns"]) s += t[field].get<int64_t>();
  return s;
}

// Four turns; a budget of 0.75 of keep-all's peak with half of it staging streamed pages, so that
// the conversation outgrows the pool and the disk-only config can still stream its pages (a
// sequence whose pages are on disk must fit the pool plus the staging). It was 0.6 until the
// RAM tier (c-ram's ram:auto) came out of the budget: at 0.6 the pool left beside the tier held
// at most 320 tokens, and turn 4's prompt is 340.
TEST_F(BenchTurnsTest, EveryConfigRunsAndLosslessRepliesEqualKeepAll) {
  const Result r = RunKvl("bench turns -m " + testing::Stories260KPath() +
                          " --turns 4 --reply 32 --user-min 40 --user-max 60"
                          " --budget-fraction 0.75 --kv-stream-reserve 0.5 --no-calibrate -t 1"
                          " --configs a,b,c-ram,c-disk,c-disk-buffered,d --disk-dir " + dir_.string() +
                          " --json " + (dir_ / "turns.json").string() +
                          " --plot " + (dir_ / "turns.png").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("### summary"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("RSS-weights"), std::string::npos) << r.output;
  // The plot is drawn, or skipped with a note (no matplotlib): never a failure.
  EXPECT_TRUE(std::filesystem::exists(dir_ / "turns.png") ||
              r.output.find("plot skipped") != std::string::npos)
      << r.output;
  const nlohmann::json j = ReadJson("turns.json");
  ASSERT_TRUE(j.is_object()) << r.output;

  const nlohmann::json* a = FindConfig(j, "a");
  const nlohmann::json* b = FindConfig(j, "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (const char* name : {"a", "b", "c-ram", "c-disk", "c-disk-buffered", "d-balanced", "d-evict"}) {
    const nlohmann::json* c = FindConfig(j, name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ((*c)["error"], "") << name;
    ASSERT_EQ((*c)["turns"].size(), 4u) << name;
    EXPECT_GT((*c)["rss_anon_start_bytes"].get<int64_t>(), 0) << name;
    const int64_t model_file_bytes = (*c)["model_file_bytes"].get<int64_t>();
    EXPECT_GT(model_file_bytes, 0) << name;
    for (const nlohmann::json& t : (*c)["turns"]) {
      EXPECT_EQ(t["reply"].size(), 32u) << name;
      // The process's own memory, read from the kernel each turn: the heap and pool are
      // anonymous, the mapped model file pages.
      EXPECT_GT(t["rss_anon_peak_bytes"].get<int64_t>(), 0) << name;
      EXPECT_GT(t["rss_file_bytes"].get<int64_t>(), 0) << name;
      // VmRSS and VmRSS less the weights: the weights found resident (the model file's pages,
      // found by its path in smaps, and any packed copies) are most of the file, since every
      // tensor was read by then; what is left holds at least the pool's blocks in use (written,
      // so resident); VmRSS is at least its anonymous part.
      const int64_t rss = t["rss_peak_bytes"].get<int64_t>();
      const int64_t weights = t["weights_resident_bytes"].get<int64_t>();
      const int64_t rest = t["rss_minus_weights_peak_bytes"].get<int64_t>();
      EXPECT_GE(weights, model_file_bytes / 2) << name << " turn " << t["turn"];
      EXPECT_GE(rest, t["pool_bytes_peak"].get<int64_t>()) << name << " turn " << t["turn"];
      EXPECT_GE(rss, t["rss_anon_peak_bytes"].get<int64_t>()) << name << " turn " << t["turn"];
      const double agreement = t["agreement"].get<double>();
      EXPECT_TRUE(agreement >= 0 && agreement <= 1) << name;
    }
  }
  // Lossless configs: every reply token-exact against keep-all's.
  for (const char* name : {"a", "b", "c-ram", "c-disk", "c-disk-buffered"}) {
    for (const nlohmann::json& t : (*FindConfig(j, name))["turns"]) {
      EXPECT_TRUE(t["identical"].get<bool>()) << name << " turn " << t["turn"];
    }
  }
  // The budget configs stay within their budget, which is below what keep-all needed, and they
  // really paged: pages went to a tier and came back (promoted at admission or streamed).
  const int64_t b_peak = (*b)["resident_peak"].get<int64_t>();
  for (const char* name : {"c-ram", "c-disk", "c-disk-buffered"}) {
    const nlohmann::json& c = *FindConfig(j, name);
    const int64_t budget = c["budget_bytes"].get<int64_t>();
    EXPECT_GT(budget, 0) << name;
    EXPECT_LT(budget, b_peak) << name;
    EXPECT_LE(c["resident_peak"].get<int64_t>(), budget) << name;
    EXPECT_LT(c["pool_bytes"].get<int64_t>(), b_peak) << name;
    int64_t pages_in = 0;
    for (const nlohmann::json& t : c["turns"]) {
      for (const nlohmann::json& tier : t["tiers"]) pages_in += tier["pages_in"].get<int64_t>();
    }
    EXPECT_GT(pages_in, 0) << name;
    EXPECT_GT(Sum(c, "promoted_tokens") + Sum(c, "layers_streamed"), 0) << name;
    // The step's rows as the engine chose them (a budget may cut them: Engine::step_tokens),
    // and the RSS at the end, before and after the heap's free pages went back to the OS.
    const int64_t step = c["step_tokens"].get<int64_t>();
    EXPECT_GT(step, 0) << name;
    EXPECT_LE(step, (*b)["step_tokens"].get<int64_t>()) << name;
    EXPECT_GT(c["rss_minus_weights_end_trimmed_bytes"].get<int64_t>(), 0) << name;
    EXPECT_LE(c["rss_minus_weights_end_trimmed_bytes"].get<int64_t>(),
              c["rss_minus_weights_end_bytes"].get<int64_t>() + (1 << 20))
        << name;
  }
  // No reuse prefills the whole history every turn; keep-all only what is new.
  EXPECT_GT(Sum(*a, "prefilled_tokens"), Sum(*b, "prefilled_tokens"));
  EXPECT_GT(Sum(*b, "cached_tokens"), 0);
  EXPECT_EQ(Sum(*a, "cached_tokens"), 0);
  // The scratch disk tiers leave nothing behind.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_TRUE(entry.path().extension() == ".json" || entry.path().extension() == ".png")
        << entry.path();
  }
}

// The second process finds the first one's pages in the persistent disk tier, and its output is
// the same.
TEST_F(BenchTurnsTest, RestartReusesTheDiskTierInAFreshProcess) {
  const Result r = RunKvl("bench turns --restart -m " + testing::Stories260KPath() +
                          " --restart-tokens 300 --reply 16 --no-calibrate -t 1 --disk-dir " +
                          dir_.string() + " --json " + (dir_ / "restart.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ReadJson("restart.json");
  ASSERT_TRUE(j.is_object()) << r.output;
  ASSERT_EQ(j["rows"].size(), 1u);
  const nlohmann::json& disk = j["rows"][0];
  EXPECT_EQ(disk["tier"], "disk");
  EXPECT_TRUE(disk["identical"].get<bool>()) << r.output;
  EXPECT_EQ(disk["cold"]["cached_tokens"], 0);
  // Every full block of the prompt but the one the last token needs computed is found again.
  EXPECT_GE(disk["restart"]["cached_tokens"].get<int64_t>(), 300 - 2 * 16) << r.output;
  EXPECT_EQ(disk["restart"]["output"].size(), 16u);
  // The bench's persistent tier file is its own and goes at the end.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "restart.json") << entry.path();
  }
}

TEST_F(BenchTurnsTest, AMissingPlotScriptIsANoteNotAFailure) {
  const Result r = RunKvl("bench turns -m " + testing::Stories260KPath() +
                          " --turns 1 --reply 4 --configs b --no-calibrate -t 1 --plot " +
                          (dir_ / "x.png").string() + " --plot-script " +
                          (dir_ / "no-such-script.py").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("plot skipped"), std::string::npos) << r.output;
}

TEST(BenchTurnsArgsTest, UnknownConfigIsAClearError) {
  const Result r = RunKvl("bench turns -m " + testing::Stories260KPath() + " --configs b,x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown config 'x'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvl
