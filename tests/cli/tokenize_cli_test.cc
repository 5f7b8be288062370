// `kvl tokenize`: llama-tokenize's output shapes on stories260K, a vocab-only GGUF of a made-up
// architecture (only the tokenizer is read), the text from a file, and clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"
#include "run_command.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace kvl {
namespace {

using testing::RunKvl;

class TokenizeCliTest : public testing::ScratchDirTest {
 protected:
  TokenizeCliTest() : ScratchDirTest("kvl-tokenize-test") {}
  // A vocab-only GGUF: GPT-2's byte alphabet is not needed for ASCII letters, so "a", "b" and
  // their merge make a byte-level BPE vocabulary of three tokens plus an end-of-text token.
  std::string WriteVocabOnly(const std::string& pre) {
    GgufWriter w;
    w.AddString("general.architecture", "made-up-arch");
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddString("tokenizer.ggml.pre", pre);
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab", "<|endoftext|>"});
    w.AddInt32Array("tokenizer.ggml.token_type", {1, 1, 1, 3});
    w.AddStringArray("tokenizer.ggml.merges", {"a b"});
    w.AddUint32("tokenizer.ggml.bos_token_id", 3);
    w.AddUint32("tokenizer.ggml.eos_token_id", 3);
    const std::string path = (dir_ / ("vocab-" + pre + ".gguf")).string();
    EXPECT_TRUE(w.Write(path).ok());
    return path;
  }
};

TEST_F(TokenizeCliTest, PrintsAsLlamaTokenize) {
  const std::string m = "-m " + testing::Stories260KPath();
  auto r = RunKvl("tokenize " + m + " -p 'Once upon a time'", false);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output,
            "     1 -> '<s>'\n   403 -> ' Once'\n   407 -> ' upon'\n   261 -> ' a'\n"
            "   378 -> ' time'\n");
  r = RunKvl("tokenize " + m + " -p 'Once upon a time' --ids", false);
  EXPECT_EQ(r.output, "[1, 403, 407, 261, 378]\n");
  r = RunKvl("tokenize " + m + " -p 'Once upon a time' --ids --no-bos --show-count", false);
  EXPECT_EQ(r.output, "[403, 407, 261, 378]\nTotal number of tokens: 4\n");
  r = RunKvl("tokenize " + m + " -p 'Once' --pieces", false);
  EXPECT_EQ(r.output, "[\"<s>\",\" Once\"]\n");
  r = RunKvl("tokenize " + m + " -p 'Once' --pieces --ids --no-bos", false);
  EXPECT_EQ(r.output, "[{\"id\":403,\"piece\":\" Once\"}]\n");
  // parse_special: "<s>" in the text is BOS only when asked.
  r = RunKvl("tokenize " + m + " -p '<s>Once' --ids --no-bos --parse-special", false);
  EXPECT_EQ(r.output, "[1, 403]\n");
  r = RunKvl("tokenize " + m + " -p '<s>Once' --ids --no-bos", false);
  EXPECT_EQ(r.output.find("[1,"), std::string::npos) << r.output;
}

TEST_F(TokenizeCliTest, ReadsAFileWhole) {
  const std::string path = (dir_ / "text.txt").string();
  std::ofstream(path, std::ios::binary) << "Once upon a time\n\n";
  const auto from_file = RunKvl("tokenize -m " + testing::Stories260KPath() + " -f " + path +
                                    " --ids", false);
  auto file = GgufFile::Open(testing::Stories260KPath());
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  std::string expected = "[";
  for (TokenId id : (*tok)->Encode("Once upon a time\n\n", true)) {
    expected += (expected.size() > 1 ? ", " : "") + std::to_string(id);
  }
  EXPECT_EQ(from_file.exit_code, 0);
  EXPECT_EQ(from_file.output, expected + "]\n");
  EXPECT_NE(from_file.output, "[1, 403, 407, 261, 378]\n");  // the newlines are tokens too
}

TEST_F(TokenizeCliTest, ProcessesEscapesAsLlamaTokenizeUnlessAsked) {
  const std::string m = "tokenize -m " + testing::Stories260KPath() + " --ids --no-bos -p ";
  const auto escaped = RunKvl(m + "'a\\nb\\x41\\q'", false);
  auto file = GgufFile::Open(testing::Stories260KPath());
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  const auto ids = [](const std::vector<TokenId>& v) {
    std::string s = "[";
    for (TokenId id : v) s += (s.size() > 1 ? ", " : "") + std::to_string(id);
    return s + "]\n";
  };
  EXPECT_EQ(escaped.output, ids((*tok)->Encode("a\nbA\\q", false)));
  const auto verbatim = RunKvl(m + "'a\\nb\\x41\\q' --no-escape", false);
  EXPECT_EQ(verbatim.output, ids((*tok)->Encode("a\\nb\\x41\\q", false)));
  EXPECT_NE(escaped.output, verbatim.output);
}

TEST_F(TokenizeCliTest, VocabOnlyFileOfAnyArchitecture) {
  const auto r = RunKvl("tokenize -m " + WriteVocabOnly("gpt-2") + " -p 'abab a' --ids", true);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // "abab" is one word (ab merged twice), " a" another: " " has no token in this vocabulary.
  EXPECT_EQ(r.output, "[2, 2, 0]\n");
}

TEST_F(TokenizeCliTest, ErrorsNameTheProblem) {
  auto r = RunKvl("tokenize -m " + testing::Stories260KPath(), true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("-p TEXT or -f FILE"), std::string::npos) << r.output;
  r = RunKvl("tokenize -m /nonexistent/model.gguf -p x", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent/model.gguf"), std::string::npos) << r.output;
  r = RunKvl("tokenize -m " + testing::Stories260KPath() + " -f /nonexistent/text.txt", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent/text.txt"), std::string::npos) << r.output;
  r = RunKvl("tokenize -m " + WriteVocabOnly("no-such-pre") + " -p x", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("'no-such-pre'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("llama-bpe"), std::string::npos) << r.output;  // lists the supported
}

}  // namespace
}  // namespace kvl
