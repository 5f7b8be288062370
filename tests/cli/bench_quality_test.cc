// `kvl bench quality` end to end on stories260K: every representation in the JSON with the bytes
// its format takes, f32 against itself exactly 0, and the orderings the formats imply (more bits,
// less divergence) with margins; a missing text file is an error that names it; the plot script
// turns the JSON into a PNG.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "run_command.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace kvl {
namespace {

using Result = testing::CommandResult;

Result RunShell(const std::string& command) { return testing::RunShell(command + " 2>&1"); }
Result RunKvl(const std::string& args) { return testing::RunKvl(args, /*with_stderr=*/true); }

class BenchQualityTest : public testing::ScratchDirTest {
 protected:
  BenchQualityTest() : ScratchDirTest("kvl-bench-quality-test") {}
};

TEST_F(BenchQualityTest, EveryRepresentationMeasuredAndOrderedByItsBits) {
  const std::string json_path = (dir_ / "quality.json").string();
  const Result r = RunKvl("bench quality -m " + testing::Stories260KPath() + " -t 1 --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| compress int4"), std::string::npos) << r.output;

  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["bench"], "quality");
  std::map<std::string, nlohmann::json> by_name;
  for (const nlohmann::json& c : j["configs"]) by_name[c["name"].get<std::string>()] = c;
  for (const char* name : {"f32", "f16", "bf16", "q8_0", "q8_0 K, f16 V", "q4_0", "compress int8",
                           "compress int4"}) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_GT(by_name[name]["positions"].get<int64_t>(), 100) << name;  // the whole text, teacher-forced
  }
  auto kld = [&](const char* name) { return by_name[name]["mean_kld"].get<double>(); };
  auto bytes = [&](const char* name) { return by_name[name]["bytes_per_token"].get<double>(); };

  // stories260K: 5 layers x (K + V) x 32 values.
  EXPECT_EQ(bytes("f32"), 5 * 2 * 32 * 4);
  EXPECT_EQ(bytes("f16"), bytes("f32") / 2);
  EXPECT_EQ(bytes("q8_0"), 5 * 2 * 34);  // a block of 32 int8 and one f16 scale per row
  EXPECT_LT(bytes("compress int4"), bytes("compress int8"));
  EXPECT_LT(bytes("compress int8"), bytes("f16"));

  // The reference against itself is exact.
  EXPECT_EQ(kld("f32"), 0.0);
  EXPECT_EQ(by_name["f32"]["top1"].get<double>(), 1.0);
  // Every lossy representation diverges, and fewer bits diverge more (by well over the noise of
  // a deterministic run: measured 2.6e-6 f16, 8.4e-5 int8, 3.4e-3 int4, 2.2e-3 q8_0, 1.2 q4_0).
  for (const char* name : {"f16", "bf16", "q8_0", "q4_0", "compress int8", "compress int4"}) {
    EXPECT_GT(kld(name), 0.0) << name;
  }
  EXPECT_GT(kld("bf16"), 5 * kld("f16"));        // 8 mantissa bits against 11
  EXPECT_GT(kld("compress int4"), 5 * kld("compress int8"));
  EXPECT_GT(kld("q4_0"), 5 * kld("q8_0"));
  EXPECT_LT(kld("compress int8"), 0.01);          // what the lattice's balanced quality allows
  EXPECT_LT(by_name["q4_0"]["top1"].get<double>(), by_name["f16"]["top1"].get<double>());

  // The figure.
  const std::string python = testing::PythonWithMatplotlib();
  if (python.empty()) GTEST_SKIP() << "plot not checked: no python3 with matplotlib (python3-matplotlib)";
  const std::filesystem::path png = dir_ / "quality.png";
  const Result plot = RunShell(python + " " + KVL_SOURCE_DIR + "/scripts/plots.py quality " +
                               png.string() + " " + json_path);
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
}

TEST_F(BenchQualityTest, AMissingTextFileIsNamed) {
  const Result r = RunKvl("bench quality -m " + testing::Stories260KPath() + " -f " +
                          (dir_ / "no-such-text.txt").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no-such-text.txt"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvl
