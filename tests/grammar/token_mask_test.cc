// The trie walk's mask equals the brute-force mask (every token's text tried from the state) on
// real vocabularies, step after step along constrained outputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "grammar_test_util.h"
#include "kvl/gguf.h"
#include "kvl/json_schema_grammar.h"
#include "kvl/token_mask.h"
#include "kvl/tokenizer.h"
#include "test_paths.h"
#include "tokenizer/llama_vocab_files.h"

namespace kvl {
namespace {

using testing::MustParse;

// What the engine hands the grammar layer: each token's bytes, control tokens none.
std::shared_ptr<const GrammarVocabulary> VocabularyOf(const Tokenizer& tokenizer) {
  std::vector<std::string> pieces(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const TokenType type = tokenizer.type(id);
    if (type == TokenType::kControl || type == TokenType::kUnknown || type == TokenType::kUnused) {
      continue;
    }
    pieces[static_cast<size_t>(id)] = tokenizer.TokenPiece(id, false);
  }
  return std::make_shared<GrammarVocabulary>(std::move(pieces), tokenizer.end_of_generation_ids());
}

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return nullptr;
  auto tokenizer = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

// Every token tried on its own from the state, as a grammar-constrained sampler without a trie
// would.
std::vector<uint64_t> BruteForceMask(const GrammarVocabulary& vocab, GrammarMatcher& matcher) {
  std::vector<uint64_t> words((static_cast<size_t>(vocab.vocab_size()) + 63) / 64, 0);
  const GrammarMatcher::StateId state = matcher.current();
  for (int32_t id = 0; id < vocab.vocab_size(); ++id) {
    bool allowed;
    if (vocab.IsEndOfGeneration(id)) {
      allowed = matcher.IsAccepting(state);
    } else {
      allowed = !vocab.piece(id).empty() &&
                matcher.NextBytes(state, vocab.piece(id)) != GrammarMatcher::kDead;
    }
    if (allowed) words[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  }
  return words;
}

struct WalkStats {
  int steps = 0;
  int finished = 0;      // outputs that reached the grammar's end
  int64_t allowed_min = 1 << 30, allowed_max = 0;
};

// Follows random allowed tokens from the grammar's start, checking each step's mask against the
// brute force and that Accept agrees with the mask.
void CheckMasksAlongOutputs(const std::string& gbnf, const GrammarVocabulary* raw_vocab,
                            std::shared_ptr<const GrammarVocabulary> vocab, int outputs,
                            int max_steps, WalkStats* stats) {
  auto grammar = MustParse(gbnf);
  ASSERT_NE(grammar, nullptr);
  std::mt19937_64 rng(1234);
  for (int o = 0; o < outputs; ++o) {
    GrammarConstraint constraint(grammar, vocab);
    GrammarMatcher reference(grammar);  // the brute force's own matcher
    for (int step = 0; step < max_steps; ++step) {
      bool any = false;
      const uint64_t* mask = constraint.AllowedTokens(&any);
      const std::vector<uint64_t> expected = BruteForceMask(*raw_vocab, reference);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->vocab_size(); ++id) {
        const bool got = (mask[id / 64] >> (id % 64)) & 1;
        const bool want = (expected[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
        ASSERT_EQ(got, want) << "token " << id << " '" << vocab->piece(id) << "' at step "
                             << step << "\n" << gbnf;
        if (got) allowed.push_back(id);
      }
      ASSERT_EQ(any, !allowed.empty());
      ++stats->steps;
      stats->allowed_min = std::min<int64_t>(stats->allowed_min, allowed.size());
      stats->allowed_max = std::max<int64_t>(stats->allowed_max, allowed.size());
      if (allowed.empty()) break;
      // Prefer ending once the grammar may, so that outputs finish.
      int32_t token = allowed[rng() % allowed.size()];
      for (int32_t id : allowed) {
        if (vocab->IsEndOfGeneration(id) && rng() % 2 == 0) token = id;
      }
      // A token outside the mask is refused.
      for (int tries = 0; tries < 20; ++tries) {
        const auto other = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab->vocab_size()));
        if (!((mask[other / 64] >> (other % 64)) & 1)) {
          EXPECT_FALSE(constraint.Accept(other).ok()) << "token " << other << " was masked";
          break;
        }
      }
      ASSERT_TRUE(constraint.Accept(token).ok()) << "allowed token " << token << " refused";
      if (vocab->IsEndOfGeneration(token)) {
        ++stats->finished;
        break;
      }
      reference.set_current(reference.NextBytes(reference.current(), vocab->piece(token)));
      reference.CompactIfLarge();
    }
  }
}

const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":12},
    "age":{"type":"integer","minimum":0,"maximum":150},
    "tags":{"type":"array","items":{"enum":["a","b","ccc"]},"maxItems":3},
    "when":{"type":"string","format":"date"}},
  "required":["name","age"]})";

TEST(TokenMaskTest, TrieWalkEqualsBruteForceOnStories260K) {
  auto tokenizer = LoadTokenizer(testing::Stories260KPath());
  ASSERT_NE(tokenizer, nullptr);
  auto vocab = VocabularyOf(*tokenizer);
  // Byte tokens share text with nothing else; every piece of 512 tokens is in the trie.
  EXPECT_GT(vocab->num_trie_nodes(), 400u);
  WalkStats stats;
  for (const std::string& gbnf :
       {JsonObjectGbnf(), *JsonSchemaToGbnf(nlohmann::json::parse(kSchema)),
        std::string("root ::= [0-9]+ (\"+\" [0-9]+)* \"=\" | \"é\" [^\\x00-\\x7f]{1,3}")}) {
    CheckMasksAlongOutputs(gbnf, vocab.get(), vocab, 6, 60, &stats);
  }
  // The checks covered narrow and wide masks, and outputs that ended.
  EXPECT_GT(stats.steps, 200);
  EXPECT_LE(stats.allowed_min, 3);
  EXPECT_GT(stats.allowed_max, 300);
  EXPECT_GE(stats.finished, 3);
}

TEST(TokenMaskTest, TrieWalkEqualsBruteForceOnA128kVocabulary) {
  std::string why_not;
  const std::string dir = testing::LlamaCppDir(&why_not);
  if (dir.empty()) GTEST_SKIP() << why_not;
  auto tokenizer = LoadTokenizer(dir + "/models/ggml-vocab-llama-bpe.gguf");
  ASSERT_NE(tokenizer, nullptr);
  ASSERT_GT(tokenizer->vocab_size(), 128000);
  auto vocab = VocabularyOf(*tokenizer);
  WalkStats stats;
  // Fewer steps: each brute-force step tries 128k tokens.
  CheckMasksAlongOutputs(*JsonSchemaToGbnf(nlohmann::json::parse(kSchema)), vocab.get(), vocab,
                         3, 25, &stats);
  CheckMasksAlongOutputs(JsonObjectGbnf(), vocab.get(), vocab, 2, 25, &stats);
  EXPECT_GT(stats.steps, 40);
  EXPECT_GT(stats.allowed_max, 50000);  // inside a string almost every token may follow
}

TEST(TokenMaskTest, EndOfGenerationOnlyWhereTheGrammarMayEnd) {
  // A hand-made vocabulary: two texts, a control token, EOS.
  auto vocab = std::make_shared<GrammarVocabulary>(
      std::vector<std::string>{"a", "ab", "", "", "b", "\xC3", "\xA9"}, std::vector<int32_t>{3});
  auto grammar = MustParse("root ::= \"a\" \"b\"? \"\xC3\xA9\"?");
  GrammarConstraint c(grammar, vocab);
  bool any = false;
  auto bits = [&](const uint64_t* m) { return m[0] & 0x7F; };
  EXPECT_EQ(bits(c.AllowedTokens(&any)), 0b11u);  // "a", "ab"
  ASSERT_TRUE(c.Accept(0).ok());
  // After "a": "b", C3 (é's first byte) and EOS (the grammar may end); never the control token.
  EXPECT_EQ(bits(c.AllowedTokens(&any)), (1u << 4) | (1u << 5) | (1u << 3));
  ASSERT_TRUE(c.Accept(5).ok());
  EXPECT_FALSE(c.IsAccepting());  // inside a character
  EXPECT_EQ(bits(c.AllowedTokens(&any)), 1u << 6);
  ASSERT_TRUE(c.Accept(6).ok());
  EXPECT_TRUE(c.IsFinished());
  EXPECT_EQ(bits(c.AllowedTokens(&any)), 1u << 3);  // only EOS
  EXPECT_FALSE(c.Accept(2).ok());
  EXPECT_TRUE(c.Accept(3).ok());
}

TEST(TokenMaskTest, ADeadEndSaysNoTokenIsAllowed) {
  // The grammar wants a character no token spells.
  auto vocab = std::make_shared<GrammarVocabulary>(std::vector<std::string>{"a", "b", ""},
                                                   std::vector<int32_t>{2});
  GrammarConstraint c(MustParse("root ::= \"a\" \"z\""), vocab);
  bool any = false;
  c.AllowedTokens(&any);
  EXPECT_TRUE(any);
  ASSERT_TRUE(c.Accept(0).ok());
  c.AllowedTokens(&any);
  EXPECT_FALSE(any);
}

}  // namespace
}  // namespace kvl
