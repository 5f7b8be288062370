// The matcher against references: strings derived from a grammar are accepted, random
// mutations of them are judged as the plain reference matcher judges them, and for JSON
// grammars as nlohmann::json judges them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar_test_util.h"
#include "kvl/grammar_matcher.h"
#include "kvl/json_schema_grammar.h"

namespace kvl {
namespace {

using testing::GrammarSampler;
using testing::MatcherAccepts;
using testing::MustParse;
using testing::ReferenceMatcher;

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80                    ? 1
                     : (b >= 0xC2 && b <= 0xDF) ? 2
                     : (b >= 0xE0 && b <= 0xEF) ? 3
                     : (b >= 0xF0 && b <= 0xF4) ? 4
                                                : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// One random edit: a byte replaced, inserted or deleted, or a span duplicated.
std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const std::string kBytes = "{}[]\",:0123456789.-+eEtrufalsn \n\\abcxyz\x01\xc3\xa9";
  const char b = kBytes[rng() % kBytes.size()];
  const size_t at = s.empty() ? 0 : rng() % s.size();
  switch (rng() % 4) {
    case 0:
      if (!s.empty()) s[at] = b;
      break;
    case 1: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), b); break;
    case 2:
      if (!s.empty()) s.erase(at, 1);
      break;
    default: {
      const size_t len = 1 + rng() % 4;
      s.insert(at, s.substr(at, len));
    }
  }
  return s;
}

constexpr const char* kArithmetic = R"gbnf(
root  ::= expr
expr  ::= term (("+" | "-") term)*
term  ::= factor (("*" | "/") factor)*
factor ::= [0-9]{1,3} | "(" ws expr ws ")" | "-" factor
ws    ::= [ ]{0,2}
)gbnf";

TEST(GrammarMatcherTest, DerivedStringsAreAcceptedAndMutationsJudgedAsTheReferenceDoes) {
  const std::vector<std::string> grammars = {
      kArithmetic,
      JsonObjectGbnf(),
      "root ::= (\"ab\" | [c-e]+ | \"é\"{1,2})* \"!\"",
      "root ::= item (\",\" item){0,4}\nitem ::= [^,!\\n]{1,3} | \"!\"",
      *JsonSchemaToGbnf(nlohmann::json::parse(R"({"type":"object","properties":{
          "a":{"type":"integer","minimum":-20,"maximum":300},"b":{"type":"string","maxLength":4},
          "c":{"type":"array","items":{"type":"boolean"},"maxItems":3}},"required":["a"]})")),
  };
  std::mt19937_64 rng(42);
  int mutations = 0, mutations_accepted = 0;
  for (const std::string& gbnf : grammars) {
    auto grammar = MustParse(gbnf);
    ASSERT_NE(grammar, nullptr);
    GrammarMatcher matcher(grammar);
    ReferenceMatcher reference(*grammar);
    GrammarSampler sampler(*grammar, rng());
    for (int i = 0; i < 150; ++i) {
      const std::string s = sampler.Generate();
      ASSERT_TRUE(MatcherAccepts(matcher, s)) << gbnf << "\nderived: " << s;
      ASSERT_TRUE(reference.Accepts(s)) << "reference: " << s;
      for (int m = 0; m < 4; ++m) {
        const std::string mutated = Mutate(s, rng);
        const bool accepted = MatcherAccepts(matcher, mutated);
        if (IsValidUtf8(mutated)) {
          ASSERT_EQ(accepted, reference.Accepts(mutated)) << gbnf << "\nmutated: " << mutated;
        } else {
          ASSERT_FALSE(accepted) << "invalid UTF-8 accepted: " << mutated;
        }
        ++mutations;
        mutations_accepted += accepted;
      }
    }
  }
  // Most random edits break a string of these grammars: the check above saw both outcomes.
  EXPECT_GT(mutations_accepted, mutations / 20);
  EXPECT_LT(mutations_accepted, mutations / 2);
}

TEST(GrammarMatcherTest, JsonObjectGrammarAgreesWithNlohmann) {
  auto grammar = MustParse(JsonObjectGbnf());
  ASSERT_NE(grammar, nullptr);
  GrammarMatcher matcher(grammar);
  GrammarSampler sampler(*grammar, 7);
  std::mt19937_64 rng(7);
  int agree = 0, total = 0, grammar_only = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string s = sampler.Generate(8);
    ASSERT_TRUE(nlohmann::json::parse(s, nullptr, false).is_object()) << s;
    for (int m = 0; m < 5; ++m) {
      const std::string mutated = Mutate(s, rng);
      const bool ours = MatcherAccepts(matcher, mutated);
      const nlohmann::json parsed = nlohmann::json::parse(mutated, nullptr, false);
      const bool theirs = !parsed.is_discarded() && parsed.is_object();
      // The grammar is stricter (bounded whitespace, numbers), never looser.
      if (ours && !theirs) ++grammar_only;
      agree += ours == theirs;
      ++total;
    }
  }
  EXPECT_EQ(grammar_only, 0);
  EXPECT_GT(agree, total * 90 / 100) << agree << " of " << total;
}

TEST(GrammarMatcherTest, PartialUtf8IsRefusedAsSoonAsNoCharacterCanComplete) {
  auto grammar = MustParse("root ::= [a-z\\u00e0-\\u00ff]+");
  GrammarMatcher m(grammar);
  // é is C3 A9: C3 alone can still complete to U+00C0..U+00FF.
  const auto c3 = m.Next(m.current(), 0xC3);
  ASSERT_NE(c3, GrammarMatcher::kDead);
  EXPECT_FALSE(m.IsAccepting(c3));
  EXPECT_NE(m.Next(c3, 0xA9), GrammarMatcher::kDead);   // é (U+00E9)
  EXPECT_EQ(m.Next(c3, 0x80), GrammarMatcher::kDead);   // U+00C0, outside the class
  // E4 starts U+4000..U+4FFF: no class character there.
  EXPECT_EQ(m.Next(m.current(), 0xE4), GrammarMatcher::kDead);
  // Never valid in UTF-8.
  EXPECT_EQ(m.Next(m.current(), 0xFF), GrammarMatcher::kDead);
  EXPECT_EQ(m.Next(m.current(), 0x80), GrammarMatcher::kDead);
  // A negated class: C3 can complete to something outside [^\u00c0-\u00ff]? No.
  auto negated = MustParse("root ::= [^\\u00c0-\\u00ff]");
  GrammarMatcher n(negated);
  EXPECT_EQ(n.Next(n.current(), 0xC3), GrammarMatcher::kDead);
  EXPECT_NE(n.Next(n.current(), 0xC4), GrammarMatcher::kDead);
}

TEST(GrammarMatcherTest, CompactingTheCachesKeepsTheMatch) {
  // A grammar whose states never repeat (counted positions), matched with a tiny cache limit.
  auto grammar = MustParse("root ::= [a-z]{0,300} \".\"");
  GrammarMatcher small(grammar), reference(grammar);
  std::string text(250, 'q');
  size_t compactions = 0;
  for (char c : text) {
    const uint64_t before = small.generation();
    small.set_current(small.Next(small.current(), static_cast<uint8_t>(c)));
    ASSERT_NE(small.current(), GrammarMatcher::kDead);
    small.CompactIfLarge(16, 1 << 20);
    compactions += small.generation() != before;
    EXPECT_LE(small.num_states(), 17u);
  }
  EXPECT_GT(compactions, 10u);
  EXPECT_TRUE(small.IsAccepting(small.NextBytes(small.current(), ".")));
  EXPECT_FALSE(MatcherAccepts(reference, std::string(301, 'q') + "."));
  EXPECT_TRUE(MatcherAccepts(reference, text + "."));
}

TEST(GrammarMatcherTest, RepetitionsDoNotGrowTheStack) {
  // Right recursion in tail position returns to the caller: 10,000 items cost no more stack
  // nodes than 10 (llama.cpp's tail-call rule).
  auto grammar = MustParse("root ::= (\"a\" | \"b\")* \";\"");
  GrammarMatcher m(grammar);
  auto state = m.NextBytes(m.current(), "ababababab");
  const size_t nodes = m.num_stack_nodes();
  state = m.NextBytes(state, std::string(10000, 'a'));
  ASSERT_NE(state, GrammarMatcher::kDead);
  EXPECT_EQ(m.num_stack_nodes(), nodes);
  EXPECT_TRUE(m.IsAccepting(m.NextBytes(state, ";")));
}

}  // namespace
}  // namespace kvl
