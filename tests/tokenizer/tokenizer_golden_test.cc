// The hard corpus (tests/tokenizer/golden/corpus.json) against the ids llama.cpp's tokenizer
// gave for it, per vocabulary, with special tokens parsed and not (golden/<vocab>.json, written
// once by scripts/gen_tokenizer_golden.py). The vocab files come from llama.cpp's bundle
// (llama_vocab_files.h); the test skips, saying why, without them.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"
#include "tokenizer/llama_vocab_files.h"

namespace kvl {
namespace {

using nlohmann::json;

const std::string kGoldenDir = std::string(KVL_SOURCE_DIR) + "/tests/tokenizer/golden";

std::string FromHex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

std::map<std::string, std::string> Corpus() {
  const json corpus = json::parse(testing::ReadWholeFile(kGoldenDir + "/corpus.json"));
  std::map<std::string, std::string> texts;
  for (const json& t : corpus["texts"]) texts[t["name"]] = FromHex(t["hex"]);
  return texts;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EveryTextGivesLlamaCppsIds) {
  const std::string golden_path = kGoldenDir + "/" + GetParam() + ".json";
  ASSERT_TRUE(std::filesystem::exists(golden_path)) << golden_path;
  std::string why_not;
  const std::string dir = testing::LlamaCppDir(&why_not);
  if (dir.empty()) GTEST_SKIP() << why_not;
  auto file = GgufFile::Open(dir + "/models/ggml-vocab-" + GetParam() + ".gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();

  const std::map<std::string, std::string> texts = Corpus();
  const json golden = json::parse(testing::ReadWholeFile(golden_path));
  int checked = 0, differ = 0;
  for (const json& c : golden["cases"]) {
    const std::string& text = texts.at(c["name"].get<std::string>());
    const bool parse_special = c["parse_special"];
    const std::vector<TokenId> expected = c["ids"].get<std::vector<TokenId>>();
    const std::vector<TokenId> ids = (*tok)->Encode(text, EncodeOptions{false, parse_special});
    differ += ids != expected;
    EXPECT_EQ(ids, expected) << GetParam() << " '" << c["name"].get<std::string>()
                             << "' parse_special=" << parse_special;
    ++checked;
  }
  EXPECT_EQ(checked, 2 * static_cast<int>(texts.size()));
  EXPECT_EQ(differ, 0) << differ << " of " << checked << " cases differ";
}

INSTANTIATE_TEST_SUITE_P(Vocabs, GoldenTest,
                         ::testing::Values("llama-bpe", "qwen2", "qwen35", "phi-3", "llama-spm",
                                           "gpt-2", "starcoder", "deepseek-llm", "deepseek-coder",
                                           "falcon", "mpt", "refact", "command-r"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kvl
