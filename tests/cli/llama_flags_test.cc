// llama.cpp's command lines (issue 44 item 3): its GPU and attention flags are accepted with a
// note and no effect, a flag the command lacks is named with the closest one it has, and -c 0
// means the model's whole context. Parsed in process (ParseCommandLine runs nothing).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/options.h"

namespace kvl::cli {
namespace {

std::string ParseError(const std::vector<std::string>& args) {
  StatusOr<ParsedCommand> parsed = ParseCommandLine(args);
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(LlamaFlagsTest, GpuAndAttentionFlagsAreNotedAndTheRestParsesAsWithoutThem) {
  StatusOr<ParsedCommand> with = ParseCommandLine(
      {"run", "-m", "m.gguf", "-ngl", "99", "-fa", "on", "--mlock", "-p", "hi", "--jinja", "-n",
       "4", "--flash-attn=auto", "-sm", "row", "-nkvo"});
  ASSERT_TRUE(with.ok()) << with.status().message();
  EXPECT_EQ(with->kind, ParsedCommand::Kind::kRun);
  ASSERT_EQ(with->run.prompts, std::vector<std::string>{"hi"});
  EXPECT_EQ(with->run.num_predict, 4);
  ASSERT_EQ(with->notes.size(), 7u);
  EXPECT_EQ(with->notes[0].rfind("note: -ngl 99 ignored: kvl computes on the CPU", 0), 0u)
      << with->notes[0];
  EXPECT_EQ(with->notes[1].rfind("note: -fa on ignored: ", 0), 0u) << with->notes[1];
  EXPECT_EQ(with->notes[2].rfind("note: --mlock ignored: ", 0), 0u) << with->notes[2];
  EXPECT_EQ(with->notes[4].rfind("note: --flash-attn=auto ignored: ", 0), 0u) << with->notes[4];
  EXPECT_EQ(with->notes[5].rfind("note: -sm row ignored: ", 0), 0u) << with->notes[5];

  // llama.cpp's older -fa took no value: the word after it stays the command's.
  StatusOr<ParsedCommand> bare = ParseCommandLine({"serve", "-m", "m.gguf", "-fa", "--port", "8090"});
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  EXPECT_EQ(bare->serve.serve.port, 8090);
  ASSERT_EQ(bare->notes.size(), 1u);
  EXPECT_EQ(bare->notes[0].rfind("note: -fa ignored: ", 0), 0u) << bare->notes[0];

  // Without the notes' flags nothing is noted.
  StatusOr<ParsedCommand> plain = ParseCommandLine({"run", "-m", "m.gguf", "-p", "hi"});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->notes.empty());
}

TEST(LlamaFlagsTest, AnUnknownFlagIsNamedWithTheClosestKnownOne) {
  EXPECT_EQ(ParseError({"run", "-m", "m.gguf", "--ctx-sise", "512"}),
            "run has no flag '--ctx-sise': did you mean --ctx-size?");
  EXPECT_EQ(ParseError({"run", "-m", "m.gguf", "--temperature", "0"}),
            "run has no flag '--temperature': did you mean --temp?");
  EXPECT_EQ(ParseError({"serve", "-m", "m.gguf", "--kv-buget=1GiB"}),
            "serve has no flag '--kv-buget=1GiB': did you mean --kv-budget?");
  EXPECT_EQ(ParseError({"bench", "lattice", "-m", "m.gguf", "--polcies", "auto"}),
            "bench lattice has no flag '--polcies': did you mean --policies?");
  EXPECT_EQ(ParseError({"run", "-m", "m.gguf", "--frobnicate"}),
            "run has no flag '--frobnicate' (kvl run --help lists them)");
  // A multi-letter single-dash flag is not read as a short flag with a value (-xyz as -x yz).
  EXPECT_EQ(ParseError({"run", "-m", "m.gguf", "-nx", "3"}),
            "run has no flag '-nx': did you mean -n?");
}

TEST(LlamaFlagsTest, ValuesThatLookLikeFlagsAndAttachedNumbersStillParse) {
  StatusOr<ParsedCommand> attached = ParseCommandLine({"run", "-m", "m.gguf", "-n32", "-t1"});
  ASSERT_TRUE(attached.ok()) << attached.status().message();
  EXPECT_EQ(attached->run.num_predict, 32);
  EXPECT_EQ(attached->run.engine.num_threads, 1);
  // -n -1 (until the end): the value is a number, not a flag.
  StatusOr<ParsedCommand> negative = ParseCommandLine({"run", "-m", "m.gguf", "-n", "-1"});
  ASSERT_TRUE(negative.ok()) << negative.status().message();
  EXPECT_EQ(negative->run.num_predict, -1);
  // A stop string that starts with dashes, given as --stop's attached value.
  StatusOr<ParsedCommand> stop = ParseCommandLine({"run", "-m", "m.gguf", "--stop=--end"});
  ASSERT_TRUE(stop.ok()) << stop.status().message();
  EXPECT_EQ(stop->run.stop, std::vector<std::string>{"--end"});
}

TEST(LlamaFlagsTest, ContextZeroMeansTheModelsWholeContext) {
  StatusOr<ParsedCommand> zero = ParseCommandLine({"run", "-m", "m.gguf", "-c", "0"});
  ASSERT_TRUE(zero.ok()) << zero.status().message();
  EXPECT_EQ(zero->run.engine.context_length, 0);
  EXPECT_TRUE(zero->run.engine.whole_model_context);
  StatusOr<ParsedCommand> unset = ParseCommandLine({"run", "-m", "m.gguf"});
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->run.engine.context_length, 0);  // the model's, at most 4096
  EXPECT_FALSE(unset->run.engine.whole_model_context);
  StatusOr<ParsedCommand> given = ParseCommandLine({"serve", "-m", "m.gguf", "-c", "512"});
  ASSERT_TRUE(given.ok()) << given.status().message();
  EXPECT_EQ(given->serve.serve.engine.context_length, 512);
  EXPECT_NE(ParseError({"run", "-m", "m.gguf", "-c", "-5"}).find("context (-c)"),
            std::string::npos);
}

}  // namespace
}  // namespace kvl::cli
