// GBNF parsing: what it accepts means what llama.cpp's grammars mean, and what it refuses is
// refused with the place and the reason.
#include <gtest/gtest.h>

#include "grammar_test_util.h"
#include "kvl/grammar.h"

namespace kvl {
namespace {

using testing::MatcherAccepts;
using testing::MustParse;

std::string ParseError(std::string_view gbnf) {
  auto grammar = ParseGbnf(gbnf);
  EXPECT_FALSE(grammar.ok()) << "parsed: " << gbnf;
  return grammar.ok() ? "" : grammar.status().message();
}

TEST(GbnfParserTest, ErrorsNameTheLineAndColumn) {
  EXPECT_EQ(ParseError("root ::= \"a\"\nfoo ::= \"b\" ]"),
            "grammar: line 2, column 13: unexpected ']' (expected a line break)");
  EXPECT_EQ(ParseError("root ::= \"abc"),
            "grammar: line 1, column 14: the literal is not closed (missing '\"')");
  EXPECT_EQ(ParseError("root ::= [a-z"),
            "grammar: line 1, column 14: the character class is not closed (missing ']')");
  EXPECT_EQ(ParseError("root ::= ( \"a\" | \"b\""),
            "grammar: line 1, column 21: expected ')' to close the group");
  EXPECT_EQ(ParseError("root = \"a\""), "grammar: line 1, column 6: expected '::=' after the rule name");
  EXPECT_EQ(ParseError("root ::= * \"a\""),
            "grammar: line 1, column 10: '*' follows nothing it could repeat");
  EXPECT_EQ(ParseError("root ::= \"\\q\""), "grammar: line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(ParseError("root ::= \"a\"{3,1}"), "grammar: line 1, column 13: in '{m,n}' n is below m");
  EXPECT_EQ(ParseError("root ::= [z-a]"),
            "grammar: line 1, column 12: the range's upper bound is below its lower bound");
  EXPECT_EQ(ParseError("root ::= \"\\x4\""), "grammar: line 1, column 11: '\\x' needs 2 hex digits");
}

TEST(GbnfParserTest, RefusesUndefinedRulesMissingRootAndLeftRecursion) {
  EXPECT_EQ(ParseError("root ::= item \"x\"\n  # comment\n"),
            "grammar: line 1, column 10: rule 'item' is used but never defined");
  EXPECT_EQ(ParseError("start ::= \"x\""), "grammar: no rule named 'root' (the root)");
  EXPECT_EQ(ParseError("root ::= \"a\"\nroot ::= \"b\""),
            "grammar: line 2, column 1: rule 'root' is defined twice");
  // Direct, and through a rule that can match nothing.
  EXPECT_NE(ParseError("root ::= root \"a\" | \"b\"").find("rule 'root' is left-recursive"),
            std::string::npos);
  EXPECT_NE(ParseError("root ::= opt expr\nopt ::= \"-\"?\nexpr ::= root \"x\" | \"y\"")
                .find("left-recursive"),
            std::string::npos);
  // Right recursion is fine.
  EXPECT_TRUE(ParseGbnf("root ::= \"a\" root | \"b\"").ok());
}

TEST(GbnfParserTest, RefusesGrammarsThatExpandPastTheLimit) {
  // (A group is one reference, so ([a-z]{1,90000}){1,90000} stays small; a long literal is not.)
  const std::string error = ParseError("root ::= \"abcdefghijklmnopqrstuvwxyz\"{1,90000}");
  EXPECT_NE(error.find("expands to more than"), std::string::npos) << error;
  EXPECT_NE(ParseError("root ::= \"a\"{1,100001}").find("a repetition count above 100000"),
            std::string::npos);
}

TEST(GbnfParserTest, SyntaxMeansWhatLlamaCppMeans) {
  struct Case {
    const char* gbnf;
    std::vector<std::string> accepted, refused;
  };
  const Case cases[] = {
      {"root ::= \"ab\" | \"c\"", {"ab", "c"}, {"a", "abc", "", "b"}},
      {"root ::= [a-c]+ \"!\"", {"a!", "cab!"}, {"!", "ad!", "a"}},
      {"root ::= [^a-c\\n]*", {"", "xyz", "é€"}, {"a", "x\n"}},
      {"root ::= \"x\"{2,3}", {"xx", "xxx"}, {"x", "xxxx"}},
      {"root ::= \"x\"{2}", {"xx"}, {"x", "xxx"}},
      {"root ::= \"x\"{2,}", {"xx", "xxxxxxx"}, {"x"}},
      {"root ::= \"x\"{0,2} \"y\"", {"y", "xy", "xxy"}, {"xxxy"}},
      {"root ::= (\"a\" | \"b\")? \"c\"", {"c", "ac", "bc"}, {"abc"}},
      {"root ::= . \".\"", {"a.", "€."}, {"ab", "."}},
      {"root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\"", {"A\u00e9\U0001F600\t\""}, {"A"}},
      {"# a comment\nroot ::= a   # trailing\n\na ::= \"q\"\n", {"q"}, {""}},
      {"root ::= ( \"a\"\n  | \"b\" )\n", {"a", "b"}, {"ab"}},
      {"root ::= [\\]\\[-] \"\"", {"]", "[", "-"}, {"a"}},
      {"root ::= [^]", {"z", "\x01"}, {""}},
  };
  for (const Case& c : cases) {
    auto grammar = MustParse(c.gbnf);
    ASSERT_NE(grammar, nullptr);
    testing::ReferenceMatcher reference(*grammar);
    for (const std::string& s : c.accepted) {
      GrammarMatcher matcher(grammar);
      EXPECT_TRUE(MatcherAccepts(matcher, s)) << c.gbnf << " should accept '" << s << "'";
      EXPECT_TRUE(reference.Accepts(s)) << c.gbnf << " (reference) should accept '" << s << "'";
    }
    for (const std::string& s : c.refused) {
      GrammarMatcher matcher(grammar);
      EXPECT_FALSE(MatcherAccepts(matcher, s)) << c.gbnf << " should refuse '" << s << "'";
      EXPECT_FALSE(reference.Accepts(s)) << c.gbnf << " (reference) should refuse '" << s << "'";
    }
  }
}

TEST(GbnfParserTest, WritesItselfBackAsGbnfThatParsesTheSame) {
  auto grammar = MustParse("root ::= [a-z\\-]+ (\",\" [^\"\\\\]){0,3} \"é\"");
  ASSERT_NE(grammar, nullptr);
  const std::string text = GrammarToGbnf(*grammar);
  auto again = MustParse(text);
  ASSERT_NE(again, nullptr);
  for (const std::string s : {"ab-c,x,yé", "aé", "a,\"é", "é", "ab,x,y,z,wé"}) {
    GrammarMatcher a(grammar), b(again);
    EXPECT_EQ(MatcherAccepts(a, s), MatcherAccepts(b, s)) << s << "\n" << text;
  }
}

}  // namespace
}  // namespace kvl
