// End-to-end tests of the kvl binary, run the way a user runs it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "run_command.h"
#include "test_paths.h"

namespace kvl {
namespace {

using testing::CommandResult;
using testing::RunShell;

CommandResult RunKvl(const std::string& args, bool with_stderr = false) {
  return testing::RunKvl(args, with_stderr);
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

// Found by a hostile probe: each of these ran, or failed late, instead of a clear refusal.
TEST(CliTest, BenchAndCalibrateRefuseWhatTheyCannotMeasureUpFront) {
  const std::string m = " -m " + testing::Stories260KPath();
  CommandResult r = RunKvl("bench" + m + " -p 0 -n 4 -np 1,,2 -r 1", true);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("-np: an empty entry in the list '1,,2'"), std::string::npos) << r.output;
  r = RunKvl("bench" + m + " -p 3000 -n 0 -r 1", true);  // stories260K holds 2048 tokens
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("holds 2048"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("pp3000 |"), std::string::npos) << r.output;  // nothing measured
  r = RunKvl("bench serve --port 1 --prompt-tokens 100 --shared-prefix 500", true);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--shared-prefix (500)"), std::string::npos) << r.output;
  r = RunKvl("bench turns" + m + " --disk-dir /nonexistent-kvl-dir", true);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--disk-dir '/nonexistent-kvl-dir' is not an existing directory"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("config"), std::string::npos) << r.output;  // before any config ran
  r = RunShell(std::string("TMPDIR=/nonexistent-kvl-tmp ") + KVL_KVL_BINARY + " calibrate" + m +
               " --quick -o " + ::testing::TempDir() + "kvl-no-tmpdir-profile.json 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TMPDIR='/nonexistent-kvl-tmp'"), std::string::npos) << r.output;
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

// -d as llama-bench takes it: per depth the pp then the tg tests, named "pp16 @ d40".
TEST(CliTest, BenchAtDepthNamesRowsAsLlamaBench) {
  CommandResult b = RunKvl("bench -m " + testing::Stories260KPath() +
                           " -p 16 -n 4 -d 0,40 -np 1,2 -r 1 -t 1 -o json");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  nlohmann::json results = nlohmann::json::parse(b.output);
  ASSERT_EQ(results.size(), 6u);
  const char* names[] = {"pp16", "tg4", "tg4 np2", "pp16 @ d40", "tg4 @ d40", "tg4 np2 @ d40"};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(results[i]["test"], names[i]);
    EXPECT_EQ(results[i]["n_depth"], i < 3 ? 0 : 40);
    EXPECT_GT(results[i]["avg_ts"].get<double>(), 0.0);
  }
  CommandResult bad = RunKvl("bench -m " + testing::Stories260KPath() + " -d -1", true);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("-d"), std::string::npos) << bad.output;
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
  // 8 blocks of 16 tokens (f16, the default KV type: 10 KiB each) for a 200-token generation:
  // the oldest pages must be evicted.
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() +
                               " -n 200 --temp 0 -t 1 -c 256 --kv-budget 80KiB --kv-policy evict "
                               "--kv-sink 4 --kv-recent 32",
                           /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kvl: kv evict"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kv resident peak"), std::string::npos) << r.output;

  // With room for everything nothing is acted on, and nothing is printed about it.
  CommandResult quiet = RunKvl("run -m " + testing::Stories260KPath() + " -n 16 --temp 0 -t 1",
                               /*with_stderr=*/true);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("kv resident peak"), std::string::npos) << quiet.output;
}

TEST(CliTest, PromotionBackIsOnByDefaultAndNoKvPromoteBackTurnsItOff) {
  // Four sequences in 200 KiB of f16 pages with a RAM tier beside it (the budget holds both: the
  // tier's 4 MiB of pages and 336 KiB for its map of 2048 layer pages): pages leave the pool, and
  // some come back into it
  // once a sequence ends; the text is the same either way.
  const std::string run = "run -m " + testing::Stories260KPath() +
                          " -p 'Once upon a time' -p 'The little dog' -p 'Lily wanted to' "
                          "-p 'The cat sat on' -np 4 -n 200 --temp 0 -t 1 -c 256 "
                          "--kv-budget 4632KiB --kv-policy auto --kv-tier ram:4MiB "
                          "--no-prefix-cache --no-calibrate --spec off";
  // (--spec off: a token a step, the pacing at which pages leave and come back here.)
  const std::string line = "pages of running sequences brought back into the pool";
  CommandResult on = RunKvl(run, /*with_stderr=*/true);
  ASSERT_EQ(on.exit_code, 0) << on.output;
  EXPECT_NE(on.output.find(line), std::string::npos) << on.output;
  CommandResult off = RunKvl(run + " --no-kv-promote-back", /*with_stderr=*/true);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(off.output.find(line), std::string::npos) << off.output;
  EXPECT_EQ(RunKvl(run).output, RunKvl(run + " --no-kv-promote-back").output);
}

TEST(CliTest, BenchShowsTheCacheTypes) {
  const std::string model = testing::Stories260KPath();
  CommandResult j =
      RunKvl("bench -m " + model + " -p 16 -n 4 -r 1 -t 1 -ctk f32,f16,q8_0 -o json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  nlohmann::json results = nlohmann::json::parse(j.output);
  ASSERT_EQ(results.size(), 6u);  // (pp16, tg4) x (f32, f16, q8_0)
  EXPECT_EQ(results[0]["type_k"], "f32");
  EXPECT_EQ(results[2]["type_k"], "f16");
  EXPECT_EQ(results[2]["type_v"], "f32");
  EXPECT_EQ(results[4]["type_k"], "q8_0");
  // The quality columns: f32 against itself is exact; a quantized key cache is not.
  EXPECT_EQ(results[0]["kld_vs_f32"], 0.0);
  EXPECT_EQ(results[0]["top1_vs_f32"], 1.0);
  EXPECT_GT(results[4]["kld_vs_f32"].get<double>(), results[2]["kld_vs_f32"].get<double>());
  EXPECT_GT(results[4]["kld_vs_f32"].get<double>(), 0.0);

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

// Options out of range, overflowing or contradicting each other are refused by the one
// validation layer before anything runs: exit 1, a message naming the flag, nothing on stdout.
TEST(CliTest, OptionsOutOfRangeOrContradictoryAreErrors) {
  const std::string m = " -m " + testing::Stories260KPath() + " ";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"run" + m + "--kv-sink 9223372036854775800", "--kv-sink"},
      {"run" + m + "--kv-recent 9223372036854775800", "--kv-recent"},
      {"run" + m + "--kv-sink -4", "--kv-sink"},
      {"run" + m + "--kv-recent -1", "--kv-recent"},
      {"run" + m + "-n -5", "-n"},
      {"run" + m + "--top-k -5", "top_k"},
      {"run" + m + "-s 18446744073709551616", "--seed"},
      {"run" + m + "-s -1", "--seed"},
      {"run" + m + "--kv-budget 0", "--kv-budget must be positive"},
      {"run" + m + "-f " + testing::Stories260KPath() + " -p hi", "not both"},
      {"run" + m + "--kv-tier disk:/tmp/a.kv:1MiB --kv-tier disk:/tmp/b.kv:1MiB",
       "already given"},
      {"run" + m + "--kv-tier ram:1MiB --kv-tier ram:2MiB", "already given"},
      // The one budget holds the RAM tier: both figures named.
      {"run" + m + "--kv-budget 256KiB --kv-tier ram:1MiB",
       "1048576 bytes do not fit in --kv-budget 262144 bytes"},
      {"run" + m + "--kv-budget 256KiB --kv-tier ram:250KiB",
       "256000 bytes do not fit in --kv-budget 262144 bytes"},
      {"run" + m + "--kv-policy compress --kv-quality lossless", "lossy"},
      {"run" + m + "-c -1", "context"},
      {"run" + m + "-c 9223372036854775807", "context"},
      {"run" + m + "-t -2", "threads"},
      {"run" + m + "-np 0", "-np"},
      {"bench" + m + "-p -5 -n -3", "-p"},
      {"bench" + m + "-p 16 -n -3", "-n"},
      {"bench" + m + "-p 0 -n 0", "nothing to measure"},
      {"bench" + m + "-p 16 -n 0 --prefix 32 --suffix 0", "--suffix"},
      {"bench" + m + "-p 16 --prefix -1", "--prefix"},
      {"synth --shape tiny-test --seed 99999999999999999999 -o /tmp/x.gguf", "--seed"},
      {"calibrate -t -1" + m, "-t"},
      {"serve" + m + "--cors-origin https://app.example/path", "--cors-origin"},
      {"serve" + m + "--cors-origin app.example", "--cors-origin"},
  };
  for (const Case& c : cases) {
    CommandResult out = RunKvl(c.args);
    EXPECT_EQ(out.exit_code, 1) << c.args;
    EXPECT_EQ(out.output, "") << c.args;
    CommandResult err = RunKvl(c.args, /*with_stderr=*/true);
    EXPECT_NE(err.output.find(c.message), std::string::npos) << c.args << ": " << err.output;
  }
  // The largest seed is a seed; a fixed lossy policy without an explicit quality still runs.
  EXPECT_EQ(RunKvl("run" + m + "-n 2 -t 1 -s 18446744073709551615").exit_code, 0);
  EXPECT_EQ(RunKvl("run" + m + "-n 2 -t 1 --kv-policy compress").exit_code, 0);
}

// --explain lists the quality prices the run prices lossy actions with, as set by the flags.
TEST(CliTest, ExplainListsTheQualityPrices) {
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() +
                               " -p 'Once upon a time' -n 2 --temp 0 -t 1 --explain "
                               "--kv-price-evict-balanced 1234",
                           /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kvl: explain: quality prices (ms-equivalent)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("balanced 1234 (--kv-price-evict-balanced)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("aggressive 1000 (--kv-price-kld-aggressive)"), std::string::npos)
      << r.output;
  // Without --explain nothing is said.
  CommandResult quiet = RunKvl("run -m " + testing::Stories260KPath() +
                                   " -p 'Once upon a time' -n 2 --temp 0 -t 1",
                               /*with_stderr=*/true);
  EXPECT_EQ(quiet.output.find("quality prices"), std::string::npos) << quiet.output;
}

TEST(CliTest, ZeroTokensMeansZeroTokens) {
  CommandResult r =
      RunKvl("run -m " + testing::Stories260KPath() + " -p 'Once upon a time' -n 0 --temp 0 -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "Once upon a time\n");
  CommandResult np = RunKvl("run -m " + testing::Stories260KPath() +
                            " -p 'Once upon a time' -n 0 --temp 0 -t 1 -np 2");
  ASSERT_EQ(np.exit_code, 0) << np.output;
  EXPECT_NE(np.output.find("---\nOnce upon a time\n"), std::string::npos) << np.output;
  EXPECT_EQ(np.output.find("Lily"), std::string::npos) << np.output;
}

TEST(CliTest, ContextBeyondTheTrainedOneWarns) {
  CommandResult r = RunKvl("run -m " + testing::Stories260KPath() + " -n 2 -t 1 -c 4096", true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: context 4096 (-c) is beyond the 2048 tokens"),
            std::string::npos)
      << r.output;
  CommandResult within = RunKvl("run -m " + testing::Stories260KPath() + " -n 2 -t 1 -c 512", true);
  EXPECT_EQ(within.output.find("warning: context"), std::string::npos) << within.output;
}

// A unique scratch directory per test process.
std::string ScratchDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/kvl-cli-" + std::to_string(getpid()) + "-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A FIFO (or a directory) named as a model, a profile or a prompt file fails at once with a
// message: it never blocks in open(). `timeout` turns a hang into exit 124.
TEST(CliTest, SpecialFilesFailAtOnce) {
  const std::string dir = ScratchDir("fifo");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string model = " -m " + testing::Stories260KPath() + " ";
  const std::vector<std::string> commands = {
      "run -m " + fifo + " -n 2",
      "inspect " + fifo,
      "bench -m " + fifo + " -p 8 -n 0 -r 1",
      "calibrate --quick -t 1 -m " + fifo,
      "run" + model + "-n 2 -t 1 --kv-tier ram:1MiB --kv-profile " + fifo,
      "run" + model + "-n 2 -t 1 -f " + fifo,
  };
  for (const std::string& c : commands) {
    const auto start = std::chrono::steady_clock::now();
    const std::string cmd = "timeout 20 " + std::string(KVL_KVL_BINARY) + " " + c + " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
    const int status = pclose(pipe);
    ASSERT_TRUE(WIFEXITED(status)) << c;
    EXPECT_EQ(WEXITSTATUS(status), 1) << c << ": " << out;
    EXPECT_NE(out.find("FIFO"), std::string::npos) << c << ": " << out;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15)) << c;
  }
  CommandResult d = RunKvl("run" + model + "-n 2 -t 1 -f " + dir, /*with_stderr=*/true);
  EXPECT_EQ(d.exit_code, 1) << d.output;
  EXPECT_NE(d.output.find("is a directory"), std::string::npos) << d.output;
  std::filesystem::remove_all(dir);
}

// Output that was not delivered is an error: a full device and a closed pipe.
TEST(CliTest, FailedStdoutIsAnError) {
  const std::string model = testing::Stories260KPath();
  for (const std::string& c :
       {"run -m " + model + " -n 8 -t 1", "inspect " + model,
        "bench -m " + model + " -p 8 -n 2 -r 1 -t 1", std::string("synth --list")}) {
    CommandResult r = RunShell(std::string(KVL_KVL_BINARY) + " " + c + " 2>&1 >/dev/full");
    EXPECT_EQ(r.exit_code, 1) << c << ": " << r.output;
    EXPECT_NE(r.output.find("cannot write to standard output: No space left on device"),
              std::string::npos)
        << c << ": " << r.output;
  }
  // The reader goes away after one byte: generation stops with EPIPE instead of running on.
  const std::string dir = ScratchDir("pipe");
  const std::string cmd = "(" + std::string(KVL_KVL_BINARY) + " run -m " + model +
                          " -n 1000 -c 2048 -t 1 2>" + dir + "/err; echo $? >" + dir +
                          "/rc) | head -c 1 >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream rc(dir + "/rc"), err(dir + "/err");
  int code = -1;
  rc >> code;
  std::string message((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_EQ(code, 1) << message;
  EXPECT_NE(message.find("Broken pipe"), std::string::npos) << message;
  std::filesystem::remove_all(dir);
}

// Starts kvl with `args` (default signal dispositions, output discarded) and returns its pid.
pid_t SpawnKvl(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(sig, SIG_DFL);
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    std::vector<char*> argv;
    std::string binary = KVL_KVL_BINARY;
    argv.push_back(binary.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// True once a file whose name starts with `prefix` exists in `dir` (polled for up to 20 s).
bool WaitForFile(const std::string& dir, const std::string& prefix) {
  for (int i = 0; i < 20000; ++i) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename().string().starts_with(prefix)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// SIGINT, SIGTERM and SIGHUP during a run leave no scratch tier file and no calibration scratch
// file behind, and the exit status still says which signal ended the process. A persistent tier
// file stays, consistent: the next run opens it.
TEST(CliTest, SignalsLeaveNoTemporaryFiles) {
  const std::string model = testing::Stories260KPath();
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const std::string dir = ScratchDir("signal-run");
    const pid_t pid =
        SpawnKvl({"run", "-m", model, "-np", "8", "-n", "2000", "-c", "2048", "-t", "1",
                  "--no-calibrate", "--kv-tier", "disk:" + dir + "/tier.kv:64MiB:scratch",
                  // Room for one 2000-token sequence in the pool and the staging
                  // (else refused at once), not for eight.
                  "--kv-budget", "4MiB", "--kv-policy", "demote-disk", "--kv-recent", "16"});
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(WaitForFile(dir, "tier.kv")) << sig;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // into the generation
    kill(pid, sig);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "signal " << sig << ", status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "signal " << sig << " left a file in " << dir;
    std::filesystem::remove_all(dir);
  }
  {
    const std::string dir = ScratchDir("signal-persistent");
    const std::string tier = "disk:" + dir + "/tier.kv:64MiB";
    const pid_t pid = SpawnKvl({"run", "-m", model, "-np", "8", "-n", "2000", "-c", "2048", "-t",
                                "1", "--no-calibrate", "--kv-tier", tier, "--kv-budget", "256KiB",
                                "--kv-policy", "demote-disk", "--kv-recent", "16"});
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(WaitForFile(dir, "tier.kv"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(pid, SIGTERM);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(std::filesystem::exists(dir + "/tier.kv"));
    const CommandResult again =
        RunKvl("run -m " + model + " -n 4 -t 1 --no-calibrate --kv-tier " + tier, true);
    EXPECT_EQ(again.exit_code, 0) << again.output;
    EXPECT_NE(again.output.find("reopened"), std::string::npos) << again.output;
    std::filesystem::remove_all(dir);
  }
  // Calibration's scratch file, kvl-calibrate-PID.tmp, in the --disk directory.
  const std::string dir = ScratchDir("signal-calibrate");
  const pid_t pid = SpawnKvl({"calibrate", "--quick", "-t", "1", "-m", model, "-o",
                              dir + "/out/profile.json", "--disk", dir});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(WaitForFile(dir, "kvl-calibrate-"));
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    EXPECT_FALSE(entry.is_regular_file()) << entry.path();
  }
  std::filesystem::remove_all(dir);
}

// kvl chat -f: one user turn per line; a reply per turn on stdout, "cached N of M" per turn on
// stderr.
std::string WriteTurns(const std::string& name, const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "/kvl-chat-" + std::to_string(getpid()) + "-" + name + ".txt";
  std::ofstream(path) << text;
  return path;
}

// The "cached N of M prompt tokens" numbers, one pair per turn, from the combined output.
std::vector<std::pair<long, long>> CachedPerTurn(const std::string& out) {
  std::vector<std::pair<long, long>> turns;
  const std::string key = "kvl: cached ";
  for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + 1)) {
    long n = 0, m = 0;
    if (std::sscanf(out.c_str() + at + key.size(), "%ld of %ld", &n, &m) == 2) turns.push_back({n, m});
  }
  return turns;
}

const char kChatTurns[] =
    "Once upon a time there was a little girl named Lily who liked to play in the park.\n"
    "One day she saw a big red ball under a tree and she wanted to play with it.\n"
    "Her mom said she could play with the ball if she shared it with her friend.\n";

TEST(CliChatTest, TurnsFileKeepsTheHistoryInThePrefixCache) {
  const std::string turns = WriteTurns("three", kChatTurns);
  const std::string base = "chat -m " + testing::Stories260KPath() + " -f " + turns +
                           " --temp 0 -n 16 -t 2";
  CommandResult out = RunKvl(base);
  ASSERT_EQ(out.exit_code, 0) << out.output;
  int lines = 0;
  for (char c : out.output) lines += c == '\n';
  EXPECT_GE(lines, 3) << out.output;
  CommandResult all = RunKvl(base, /*with_stderr=*/true);
  ASSERT_EQ(all.exit_code, 0) << all.output;
  const auto cached = CachedPerTurn(all.output);
  ASSERT_EQ(cached.size(), 3u) << all.output;
  EXPECT_EQ(cached[0].first, 0) << all.output;
  EXPECT_GT(cached[1].first, 0) << all.output;
  EXPECT_GT(cached[2].first, 0) << all.output;
  // The history grows: each prompt holds the one before it.
  EXPECT_GT(cached[1].second, cached[0].second);
  EXPECT_GT(cached[2].second, cached[1].second);
  std::filesystem::remove(turns);
}

TEST(CliChatTest, ResetForgetsTheHistory) {
  // /reset drops the history: the next turn is a fresh, short prompt that shares no block with
  // the conversation before it, so nothing of it is cached.
  const std::string turns = WriteTurns(
      "reset", std::string(kChatTurns).substr(0, std::string(kChatTurns).find('\n') + 1) +
                   "Lily ran to the tree to get the ball and she was very happy.\n/reset\n"
                   "/stats\nThe sun was shining.\n");
  CommandResult r = RunKvl("chat -m " + testing::Stories260KPath() + " -f " + turns +
                               " --temp 0 -n 16 -t 2",
                           /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto cached = CachedPerTurn(r.output);
  ASSERT_EQ(cached.size(), 3u) << r.output;
  EXPECT_GT(cached[1].first, 0) << r.output;
  EXPECT_EQ(cached[2].first, 0) << r.output;
  EXPECT_LT(cached[2].second, cached[1].second) << r.output;
  EXPECT_NE(r.output.find("history cleared"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kv pool:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("prefix cache:"), std::string::npos) << r.output;
  std::filesystem::remove(turns);
}

TEST(CliChatTest, StatsShowEachKvTier) {
  const std::string turns = WriteTurns("tiers", "Once upon a time there was a cat.\n/stats\n");
  CommandResult r = RunKvl("chat -m " + testing::Stories260KPath() + " -f " + turns +
                           " --temp 0 -n 8 -t 2 --no-calibrate --kv-tier ram:64MiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tier ram: 0.00 KiB of 64.00 MiB used"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("prefix lookups "), std::string::npos) << r.output;
  CommandResult none =
      RunKvl("chat -m " + testing::Stories260KPath() + " -f " + turns + " --temp 0 -n 8 -t 2");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("kv tiers: none"), std::string::npos) << none.output;
  std::filesystem::remove(turns);
}

TEST(CliChatTest, UnknownChatTemplateFails) {
  CommandResult r = RunKvl("chat -m " + testing::Stories260KPath() + " --chat-template nope",
                           /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown chat template 'nope'"), std::string::npos) << r.output;
}

TEST(CliChatTest, ChatTemplateFileIsRenderedAndBrokenOnesAreNamed) {
  // A template that frames every user turn: the prompt grows by the frame, turn after turn.
  const std::string tmpl = WriteTurns(
      "template", "{% for m in messages %}{% if m.role == 'user' %}Once upon a time, {{ m.content | trim }}."
                  "{% else %} {{ m.content }}{% endif %}{% endfor %}");
  const std::string turns = WriteTurns("tmpl_turns", kChatTurns);
  CommandResult r = RunKvl("chat -m " + testing::Stories260KPath() + " -f " + turns +
                               " --temp 0 -n 4 -t 1 --chat-template-file " + tmpl,
                           /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("chat template jinja (" + tmpl + ")"), std::string::npos) << r.output;
  EXPECT_EQ(CachedPerTurn(r.output).size(), 3u) << r.output;
  // Unbalanced: named with its line; and the flag excludes --chat-template.
  const std::string broken = WriteTurns("broken", "{% if messages %}\n{{ messages[0].content }}");
  r = RunKvl("chat -m " + testing::Stories260KPath() + " -f " + turns + " --chat-template-file " + broken,
             /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("template line 1: '{% if %}' is never closed"), std::string::npos) << r.output;
  r = RunKvl("chat -m " + testing::Stories260KPath() + " --chat-template chatml --chat-template-file " + tmpl,
             /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("exclude each other"), std::string::npos) << r.output;
  for (const std::string& f : {tmpl, turns, broken}) std::filesystem::remove(f);
}

TEST(CliChatTest, BadFlagsAndMissingFilesFail) {
  EXPECT_EQ(RunKvl("chat -m " + testing::Stories260KPath() + " -n -2").exit_code, 1);
  EXPECT_EQ(RunKvl("chat -m " + testing::Stories260KPath() + " --top-p 2").exit_code, 1);
  CommandResult r = RunKvl("chat -m " + testing::Stories260KPath() + " -f /no/such/turns.txt",
                           /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/no/such/turns.txt"), std::string::npos) << r.output;
}

TEST(CliChatTest, StdinTurnsAndExit) {
  CommandResult r = RunShell("printf 'Once upon a time there was a cat.\\n/exit\\nnot run\\n' | " +
                             std::string(KVL_KVL_BINARY) + " chat -m " +
                             testing::Stories260KPath() + " --temp 0 -n 8 -t 2 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(CachedPerTurn(r.output).size(), 1u) << r.output;
}

}  // namespace
}  // namespace kvl
