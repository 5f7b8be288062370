// llama.cpp's own tokenizer test vectors (models/ggml-vocab-*.gguf with .inp / .out): every text,
// encoded without BOS / EOS and without parsing special tokens, must give exactly llama.cpp's ids,
// as its tests/test-tokenizer-0 checks them.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"
#include "tokenizer/llama_vocab_files.h"

namespace kvl {
namespace {

struct VectorCase {
  std::string text;
  std::vector<TokenId> ids;
};

// Splits the .inp at "\n__ggml_vocab_test__\n" and reads one line of ids per text from the .out.
std::vector<VectorCase> ReadVectors(const std::string& inp_path, const std::string& out_path) {
  const std::string inp = testing::ReadWholeFile(inp_path);
  const std::string out = testing::ReadWholeFile(out_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<VectorCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& text : texts) {
    if (!std::getline(lines, line)) break;
    VectorCase c{text, {}};
    std::istringstream ids(line);
    for (TokenId id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << out_path;
  return cases;
}

class LlamaVectorsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaVectorsTest, EveryVectorMatches) {
  std::string why_not;
  const std::string dir = testing::LlamaCppDir(&why_not);
  if (dir.empty()) GTEST_SKIP() << why_not;
  const std::string base = dir + "/models/ggml-vocab-" + GetParam() + ".gguf";
  auto file = GgufFile::Open(base);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::vector<VectorCase> cases = ReadVectors(base + ".inp", base + ".out");
  ASSERT_GT(cases.size(), 20u);
  int failures = 0;
  for (const VectorCase& c : cases) {
    const std::vector<TokenId> ids = (*tok)->Encode(c.text, EncodeOptions{false, false});
    if (ids != c.ids) ++failures;
    EXPECT_EQ(ids, c.ids) << GetParam() << ": '" << c.text << "'";
  }
  EXPECT_EQ(failures, 0) << failures << " of " << cases.size() << " vectors differ";
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaVectorsTest,
                         ::testing::Values("llama-bpe", "qwen2", "phi-3", "llama-spm", "gpt-2",
                                           "starcoder", "deepseek-llm", "deepseek-coder",
                                           "falcon", "mpt", "refact", "command-r", "qwen35"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kvl
