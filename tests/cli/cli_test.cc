// End-to-end tests of the kvl binary, run the way a user runs it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "test_paths.h"

namespace kvl {
namespace {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout, plus stderr when asked
};

CommandResult RunKvl(const std::string& args, bool with_stderr = false) {
  const std::string cmd =
      std::string(KVL_KVL_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(CliTest, RunGreedyPrintsTheReferenceStory) {
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() +
                           " -p 'Once upon a time' -n 30 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u)
      << r.output;
}

TEST(CliTest, RunReportsTimingsOnStderr) {
  CommandResult r =
      RunKvl("run -m " + testing::Stories260KPath() + " -n 8 --temp 0 -t 1", /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("prompt eval time"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens per second"), std::string::npos) << r.output;
}

TEST(CliTest, MissingModelFailsWithAClearMessage) {
  CommandResult r = RunKvl("run -m /no/such/model.gguf -n 4", /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/no/such/model.gguf"), std::string::npos) << r.output;
}

TEST(CliTest, BadSamplingFlagFailsWithAClearMessage) {
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() + " --top-p 1.5",
                           /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("top_p"), std::string::npos) << r.output;
}

TEST(CliTest, InspectShowsShapeAndKvCosts) {
  CommandResult r = RunKvl("inspect " + testing::Stories260KPath());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("GQA"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("KV cache per token"), std::string::npos);
  EXPECT_NE(r.output.find("residual checkpoint"), std::string::npos);

  CommandResult j = RunKvl("inspect --json " + testing::Stories260KPath());
  ASSERT_EQ(j.exit_code, 0);
  nlohmann::json parsed = nlohmann::json::parse(j.output);
  EXPECT_EQ(parsed["kv_bytes_per_token"]["f32"]["per_layer"], 256);
  EXPECT_EQ(parsed["kv_bytes_per_token"]["f32"]["total"], 1280);
  EXPECT_EQ(parsed["residual_bytes_per_token"]["f32"]["per_layer"], 256);
  EXPECT_EQ(parsed["layers"], 5);
}

TEST(CliTest, SynthThenBenchPrintsLlamaBenchJson) {
  const std::string path = ::testing::TempDir() + "/cli-tiny-q8.gguf";
  CommandResult s = RunKvl("synth --shape tiny-test --type q8_0 -o " + path, true);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  CommandResult b = RunKvl("bench -m " + path + " -p 32 -n 8 -r 2 -t 1 -o json");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  nlohmann::json results = nlohmann::json::parse(b.output);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["test"], "pp32");
  EXPECT_EQ(results[1]["test"], "tg8");
  EXPECT_GT(results[0]["avg_ts"].get<double>(), 0.0);
  EXPECT_EQ(results[0]["samples_ts"].size(), 2u);

  CommandResult md = RunKvl("bench -m " + path + " -p 16 -n 4 -r 1 -t 1");
  ASSERT_EQ(md.exit_code, 0);
  EXPECT_NE(md.output.find("| model"), std::string::npos);
  EXPECT_NE(md.output.find("pp16"), std::string::npos);
  EXPECT_NE(md.output.find("tg4"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(CliTest, CacheTypeFlagsTakeLlamaCppSpellings) {
  // -ctk / -ctv are llama.cpp's multi-letter single-dash flags, with a space or an '='.
  for (const char* flags : {"-ctk f16 -ctv f16", "-ctk=bf16 -ctv=f16", "--cache-type-k f16"}) {
    CommandResult r = RunKvl("run -m " + testing::Stories260KPath() +
                             " -p 'Once upon a time' -n 8 --temp 0 -t 1 " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.output;
    EXPECT_EQ(r.output.rfind("Once upon a time", 0), 0u) << flags << ": " << r.output;
  }
  CommandResult bad =
      RunKvl("run -m " + testing::Stories260KPath() + " -n 4 -ctk q9", /*with_stderr=*/true);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("q9"), std::string::npos) << bad.output;
}

TEST(CliTest, RunUnderASmallKvBudgetSummarizesTheKvActions) {
  // 8 blocks of 16 tokens for a 200-token generation: the oldest pages must be evicted.
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() +
                               " -n 200 --temp 0 -t 1 -c 256 --kv-budget 160KiB --kv-policy evict "
                               "--kv-sink 4 --kv-recent 32",
                           /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kvl: kv evict"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kv pool peak"), std::string::npos) << r.output;

  // With room for everything nothing is acted on, and nothing is printed about it.
  CommandResult quiet = RunKvl("run -m " + testing::Stories260KPath() + " -n 16 --temp 0 -t 1",
                               /*with_stderr=*/true);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("kv pool peak"), std::string::npos) << quiet.output;
}

TEST(CliTest, BenchShowsTheCacheTypes) {
  const std::string model = testing::Stories260KPath();
  CommandResult j = RunKvl("bench -m " + model + " -p 16 -n 4 -r 1 -t 1 -ctk f32,f16 -o json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  nlohmann::json results = nlohmann::json::parse(j.output);
  ASSERT_EQ(results.size(), 4u);  // (pp16, tg4) x (f32, f16)
  EXPECT_EQ(results[0]["type_k"], "f32");
  EXPECT_EQ(results[2]["type_k"], "f16");
  EXPECT_EQ(results[2]["type_v"], "f32");

  // As in llama-bench, the columns appear only when a type other than the default is asked for.
  CommandResult md = RunKvl("bench -m " + model + " -p 16 -n 0 -r 1 -t 1 -ctv=bf16");
  ASSERT_EQ(md.exit_code, 0) << md.output;
  EXPECT_NE(md.output.find("type_v"), std::string::npos) << md.output;
  EXPECT_NE(md.output.find("bf16"), std::string::npos) << md.output;
  CommandResult plain = RunKvl("bench -m " + model + " -p 16 -n 0 -r 1 -t 1");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("type_k"), std::string::npos) << plain.output;
}

// The K-quant mix llama.cpp users download most: synth writes it, inspect names its types, run
// generates from it.
TEST(CliTest, SynthQ4KMThenInspectAndRun) {
  const std::string path = ::testing::TempDir() + "/cli-tiny-q4_k_m.gguf";
  CommandResult s = RunKvl("synth --shape tiny-test-256 --type q4_k_m -o " + path, true);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("q4_k_m"), std::string::npos) << s.output;
  CommandResult j = RunKvl("inspect --json " + path);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  nlohmann::json parsed = nlohmann::json::parse(j.output);
  EXPECT_EQ(parsed["weight_type"], "mixed (q4_k, q6_k)");
  // 8 layers: attn_v and ffn_down of layers 0, 3, 6 and 7 plus output.weight are Q6_K.
  EXPECT_EQ(parsed["tensor_types"]["q6_k"]["tensors"], 9);
  EXPECT_EQ(parsed["tensor_types"]["q4_k"]["tensors"], 1 + 8 * 7 - 8);
  EXPECT_EQ(parsed["tensor_types"]["q6_k"]["bytes"].get<int64_t>() % 210, 0);
  CommandResult r = RunKvl("run -m " + path + " -p hello -n 8 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, RunKvl("run -m " + path + " -p hello -n 8 --temp 0").output);
  for (const char* type : {"q4_k", "q5_k", "q6_k"}) {
    EXPECT_EQ(RunKvl("synth --shape tiny-test-256 --type " + std::string(type) + " -o " + path).exit_code, 0);
    CommandResult i = RunKvl("inspect --json " + path);
    ASSERT_EQ(i.exit_code, 0) << i.output;
    EXPECT_EQ(nlohmann::json::parse(i.output)["weight_type"], type);
  }
  // Rows of 128 values cannot hold a super-block of 256: a clear refusal.
  CommandResult bad = RunKvl("synth --shape tiny-test --type q4_k -o " + path, true);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("256"), std::string::npos) << bad.output;
  std::filesystem::remove(path);
}

TEST(CliTest, SynthRejectsUnknownShapeAndType) {
  EXPECT_EQ(RunKvl("synth --shape nope --type q8_0 -o /tmp/x.gguf").exit_code, 1);
  EXPECT_EQ(RunKvl("synth --shape tiny-test --type q3_k -o /tmp/x.gguf").exit_code, 1);
}

// A path under a file of its own, unique to this test process.
std::string UnwritableProfilePath(const std::string& name) {
  const std::string file = ::testing::TempDir() + "/kvl-cli-test-" + std::to_string(getpid()) +
                           "-" + name;
  FILE* f = std::fopen(file.c_str(), "w");
  if (f != nullptr) std::fclose(f);
  return file + "/profile.json";
}

TEST(CliTest, CalibrateChecksTheOutputBeforeMeasuring) {
  CommandResult r = RunKvl("calibrate --quick -t 1 -m " + testing::Stories260KPath() + " -o " +
                               UnwritableProfilePath("calibrate-output"),
                           /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is not a directory"), std::string::npos) << r.output;
  // No stage ran.
  EXPECT_EQ(r.output.find("matmul"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("done in"), std::string::npos) << r.output;

  CommandResult dir = RunKvl(
      "calibrate --quick -t 1 -m " + testing::Stories260KPath() + " -o " + ::testing::TempDir(),
      /*with_stderr=*/true);
  EXPECT_EQ(dir.exit_code, 1) << dir.output;
  EXPECT_NE(dir.output.find("is a directory"), std::string::npos) << dir.output;
}

TEST(CliTest, RunWithoutCalibrationUsesDefaultsAndWritesNothing) {
  const std::string path =
      ::testing::TempDir() + "/kvl-cli-test-" + std::to_string(getpid()) + "-no-calibrate.json";
  std::filesystem::remove(path);
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() +
                               " -n 8 --temp 0 -t 1 --kv-tier ram:1MiB --no-calibrate --kv-profile " +
                               path,
                           /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("analytic defaults"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("measuring"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(path));

  // With calibration (the default) the same run measures, says so and saves the profile there.
  CommandResult measured = RunKvl("run -m " + testing::Stories260KPath() +
                                      " -n 8 --temp 0 -t 1 --kv-tier ram:1MiB --kv-profile " + path,
                                  /*with_stderr=*/true);
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("kvl: no cost profile at " + path + ": measuring this machine"),
            std::string::npos)
      << measured.output;
  EXPECT_NE(measured.output.find("kvl: cost profile saved to " + path), std::string::npos)
      << measured.output;
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvl
