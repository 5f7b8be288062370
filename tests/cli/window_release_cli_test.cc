// The sliding-window release as the command line shows it: `kvl inspect` counts what the pool
// keeps per token and what one sequence's window holds; `kvl run` reports the rings and gives the
// same text with --no-kv-window-release (every layer's K/V in the pool).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "run_command.h"

namespace kvl {
namespace {

TEST(WindowReleaseCliTest, InspectCountsThePoolAndTheWindowAndRunMatchesKeepAll) {
  const std::string path =
      ::testing::TempDir() + "/cli-gemma3-" + std::to_string(::getpid()) + ".gguf";
  testing::CommandResult s =
      testing::RunKvl("synth --shape test-gemma3 --type f32 -o " + path, true);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  testing::CommandResult j = testing::RunKvl("inspect --json " + path, false);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  const nlohmann::json parsed = nlohmann::json::parse(j.output);
  // test-gemma3: 7 layers, 6 local with a 6-token window, kv_dim 64: 512 B a layer a token.
  EXPECT_EQ(parsed["local_layers"], 6);
  EXPECT_EQ(parsed["kv_bytes_per_token"]["f32"]["total"], 7 * 512);
  EXPECT_EQ(parsed["kv_bytes_per_token"]["f32"]["pooled"], 512);
  EXPECT_EQ(parsed["kv_bytes_per_token"]["f32"]["window_per_sequence"], 6 * 5 * 512);
  testing::CommandResult text = testing::RunKvl("inspect " + path, false);
  EXPECT_NE(text.output.find("sliding-window release"), std::string::npos) << text.output;

  const std::string run = "run -m " + path + " -p 'a b c d e f g h i j k l m n o p' -n 24 --temp 0 -t 1 -b 8";
  testing::CommandResult released = testing::RunKvl(run, true);
  ASSERT_EQ(released.exit_code, 0) << released.output;
  // The rings of one sequence: window - 1 + -b rows x 6 local layers x 512 B.
  EXPECT_NE(released.output.find("sliding-window layers"), std::string::npos) << released.output;
  testing::CommandResult keep_all = testing::RunKvl(run + " --no-kv-window-release", true);
  ASSERT_EQ(keep_all.exit_code, 0) << keep_all.output;
  EXPECT_EQ(keep_all.output.find("sliding-window layers"), std::string::npos) << keep_all.output;
  EXPECT_EQ(testing::RunKvl(run, false).output,
            testing::RunKvl(run + " --no-kv-window-release", false).output);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvl
