// `kvl perplexity` on stories260K: the figure PyTorch computes for the same weights and tokens by
// llama-perplexity's method (scripts/train_model/torch_perplexity.py, run once and written here),
// the llama-perplexity output shape, the same figure whatever -b, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "run_command.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace kvl {
namespace {

using testing::RunKvl;

// A TinyStories-like text of 348 tokens in stories260K's vocabulary: five chunks of 64.
constexpr const char* kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
    "with her dog. One day, she found a shiny red ball under a big tree. She picked it up and ran "
    "to show her mom. Her mom smiled and said that the ball was very pretty. Lily was happy. She "
    "played with the ball all day. Then it was time for bed. Lily said goodnight to her dog and "
    "went to sleep.\n\nThe next day, Tom and his mom went to the park. Tom saw a big slide and "
    "wanted to go on it. His mom said yes, but he had to be careful. Tom climbed up the slide and "
    "went down very fast. He laughed and laughed. Then he saw a little bird on the ground. The "
    "bird was sad because it could not fly. Tom wanted to help the bird. He took it home and gave "
    "it some food and water. The bird was happy and sang a song. Tom and the bird became best "
    "friends.\n";

// PyTorch's figure for kStory at -c 64 (torch_perplexity.py --ctx 64, float32 weights as stored).
constexpr double kTorchPerplexityC64 = 3.114186;

class PerplexityCliTest : public testing::ScratchDirTest {
 protected:
  PerplexityCliTest() : ScratchDirTest("kvl-perplexity-test") {}
  std::string WriteText(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  static std::string LastLine(const std::string& output) {
    std::string s = output;
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s.substr(s.find_last_of('\n') + 1);
  }
  static double Figure(const std::string& output) {
    const std::string last = LastLine(output);
    EXPECT_EQ(last.rfind("perplexity: ", 0), 0u) << output;
    return std::atof(last.c_str() + 12);
  }
  const std::string model_ = "-m " + testing::Stories260KPath();
};

TEST_F(PerplexityCliTest, MatchesPyTorchAsLlamaPerplexityPrints) {
  const std::string text = WriteText("story.txt", kStory);
  const auto r = RunKvl("perplexity " + model_ + " -f " + text + " -c 64 -t 2", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(Figure(r.output), kTorchPerplexityC64, 0.002 * kTorchPerplexityC64) << r.output;
  // llama-perplexity's lines: a running estimate per chunk, then the final estimate.
  EXPECT_EQ(r.output.rfind("[1]", 0), 0u) << r.output;
  EXPECT_NE(r.output.find(",[5]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[6]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nFinal estimate: PPL = "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" +/- "), std::string::npos) << r.output;
}

TEST_F(PerplexityCliTest, StepSizeDoesNotChangeTheFigure) {
  const std::string text = WriteText("story.txt", kStory);
  const auto whole = RunKvl("perplexity " + model_ + " -f " + text + " -c 64 -b 64 -t 1", false);
  const auto steps = RunKvl("perplexity " + model_ + " -f " + text + " -c 64 -b 5 -t 1", false);
  ASSERT_EQ(whole.exit_code, 0);
  ASSERT_EQ(steps.exit_code, 0);
  EXPECT_NEAR(Figure(whole.output), Figure(steps.output), 1e-3 * Figure(whole.output));
}

TEST_F(PerplexityCliTest, LowBitCacheCostsPerplexity) {
  const std::string text = WriteText("story.txt", kStory);
  const auto f32 = RunKvl("perplexity " + model_ + " -f " + text + " -c 64", false);
  const auto q4 = RunKvl("perplexity " + model_ + " -f " + text + " -c 64 -ctk q4_0 -ctv q4_0",
                         false);
  ASSERT_EQ(q4.exit_code, 0) << q4.output;
  // stories260K's 8-wide heads lose much to 4 bits (a q4_0 block is one scale per 32 values):
  // the figure moves, in the worse direction.
  EXPECT_GT(Figure(q4.output), Figure(f32.output) * 1.001);
}

// The rotated cache types on the project's trained model (head_dim 64): accepted, the figure
// printed last, close to the f16 cache's where 8 bits are kept, and moved further (but little) at
// 4 bits; on stories260K, whose 8-wide heads cannot be rotated, refused by name. Whether rotated
// or plain 4 bits lands nearer f16 on a 1,500-token text is not a property of rotation (the
// model's step-4,297 export had q4_0r nearer, step 6,000 has q4_0 nearer): its KL divergence,
// over many more positions, is (bench_quality_test.cc, models/README.md).
TEST_F(PerplexityCliTest, RotatedCacheTypesAreAcceptedWhereTheHeadsCanBeRotated) {
  const std::string doc = std::string(KVL_TESTS_DIR) + "/../models/kvl-doc-12m.gguf";
  std::ifstream in(std::string(KVL_TESTS_DIR) + "/../models/kvl-doc-12m.heldout.txt");
  std::string held_out(6000, '\0');
  in.read(held_out.data(), static_cast<std::streamsize>(held_out.size()));
  held_out.resize(static_cast<size_t>(in.gcount()));
  const std::string text = WriteText("held_out.txt", held_out);
  const auto f16 = RunKvl("perplexity -m " + doc + " -f " + text + " -c 128 -t 1 -ctk f16 -ctv f16",
                          false);
  ASSERT_EQ(f16.exit_code, 0) << f16.output;
  const auto q8r = RunKvl("perplexity -m " + doc + " -f " + text +
                              " -c 128 -t 1 -ctk q8_0r -ctv q8_0r", false);
  ASSERT_EQ(q8r.exit_code, 0) << q8r.output;
  const auto q4r = RunKvl("perplexity -m " + doc + " -f " + text +
                              " -c 128 -t 1 -ctk q4_0r -ctv q4_0r", false);
  ASSERT_EQ(q4r.exit_code, 0) << q4r.output;
  // Measured at step 6,000 of the model: f16 84.3773, q8_0r 84.3738 (0.004% off), q4_0r 84.5781
  // (0.24% off); plain q4_0 84.4467.
  const double f16_ppl = Figure(f16.output);
  const double q8r_off = std::fabs(Figure(q8r.output) - f16_ppl);
  const double q4r_off = std::fabs(Figure(q4r.output) - f16_ppl);
  EXPECT_LT(q8r_off, 0.002 * f16_ppl);
  EXPECT_LT(q4r_off, 0.02 * f16_ppl);
  EXPECT_GT(q4r_off, 4 * q8r_off);

  const std::string story = WriteText("story.txt", kStory);
  const auto refused = RunKvl("perplexity " + model_ + " -f " + story + " -c 64 -ctk q4_0r", true);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("q4_0r"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("head_dim is 8"), std::string::npos) << refused.output;
}

TEST_F(PerplexityCliTest, BadInputGetsClearErrors) {
  const auto missing = RunKvl("perplexity " + model_ + " -f " + (dir_ / "nope.txt").string(), true);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nope.txt"), std::string::npos) << missing.output;

  const auto empty = RunKvl("perplexity " + model_ + " -f " + WriteText("empty.txt", ""), true);
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE(empty.output.find("is empty"), std::string::npos) << empty.output;

  const std::string story = WriteText("story.txt", kStory);
  const auto short_text = RunKvl("perplexity " + model_ + " -f " + story + " -c 256", true);
  EXPECT_NE(short_text.exit_code, 0);
  EXPECT_NE(short_text.output.find("needs at least 512"), std::string::npos) << short_text.output;

  const auto too_long = RunKvl("perplexity " + model_ + " -f " + story + " -c 4096", true);
  EXPECT_NE(too_long.exit_code, 0);
  EXPECT_NE(too_long.output.find("larger than the model's context (2048"), std::string::npos)
      << too_long.output;

  const auto tiny = RunKvl("perplexity " + model_ + " -f " + story + " -c 2", true);
  EXPECT_NE(tiny.exit_code, 0);
  EXPECT_NE(tiny.output.find("-c"), std::string::npos) << tiny.output;

  const auto bad_type = RunKvl("perplexity " + model_ + " -f " + story + " -ctk q5_9", true);
  EXPECT_NE(bad_type.exit_code, 0);
  EXPECT_NE(bad_type.output.find("q5_9"), std::string::npos) << bad_type.output;

  const auto no_model =
      RunKvl("perplexity -m " + (dir_ / "none.gguf").string() + " -f " + story, true);
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE(no_model.output.find("none.gguf"), std::string::npos) << no_model.output;
}

}  // namespace
}  // namespace kvl
