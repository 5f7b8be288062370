// JSON schema -> GBNF: every string the grammar derives is JSON the schema accepts (checked by
// an independent validator), strings the matcher accepts after random edits still are, integer
// ranges are exact, and schemas it cannot honour are refused naming the keyword.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "grammar_test_util.h"
#include "json_schema_check.h"
#include "json_schema_suite.h"
#include "kvl/json_schema_grammar.h"

namespace kvl {
namespace {

using json = nlohmann::json;
using testing::GrammarSampler;
using testing::MatcherAccepts;
using testing::MustParse;
using testing::SchemaChecker;

std::shared_ptr<const Grammar> SchemaGrammar(const json& schema) {
  StatusOr<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().ToString() << "\n" << schema.dump();
  return gbnf.ok() ? MustParse(*gbnf) : nullptr;
}

// Derived strings validate; mutated strings the matcher still accepts validate too.
void CheckSchema(const std::string& name, const json& schema, size_t max_depth, int* accepted_mutations) {
  auto grammar = SchemaGrammar(schema);
  ASSERT_NE(grammar, nullptr) << name;
  SchemaChecker checker(schema);
  GrammarSampler sampler(*grammar, std::hash<std::string>()(name));
  GrammarMatcher matcher(grammar);
  std::mt19937_64 rng(99);
  for (int i = 0; i < 40; ++i) {
    const std::string text = sampler.Generate(max_depth);
    ASSERT_TRUE(MatcherAccepts(matcher, text)) << name << ": " << text;
    const json value = json::parse(text, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << name << ": not JSON: " << text;
    ASSERT_EQ(checker.Check(value), "") << name << ": " << text;
    for (int m = 0; m < 10; ++m) {
      std::string mutated = text;
      const size_t at = rng() % (mutated.size() + 1);
      static const std::string kBytes = "0123456789-.eE\"{}[],:tfn \\ax";
      if (rng() % 2 == 0 && at < mutated.size()) {
        mutated[at] = kBytes[rng() % kBytes.size()];
      } else {
        mutated.insert(mutated.begin() + static_cast<std::ptrdiff_t>(at),
                       kBytes[rng() % kBytes.size()]);
      }
      if (!MatcherAccepts(matcher, mutated)) continue;
      ++*accepted_mutations;
      const json v = json::parse(mutated, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << name << ": accepted non-JSON: " << mutated;
      ASSERT_EQ(checker.Check(v), "") << name << ": accepted " << mutated;
    }
  }
}

TEST(JsonSchemaGrammarTest, DerivedOutputsValidateForTheSuite) {
  int accepted_mutations = 0;
  for (const auto& s : testing::FullSchemaSuite()) {
    CheckSchema(s.name, json::parse(s.schema), 10, &accepted_mutations);
  }
  // Unbounded ones too (the derivation bounds their depth).
  for (const char* schema : {
           R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})",
           R"({"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":true})",
           R"({"type":"object","properties":{"aa":{"type":"integer"},"ab":{"type":"integer"},"b":{"type":"null"}},"additionalProperties":{"type":"string"}})",
           R"({"type":"object","properties":{"k":{"type":"integer","minimum":0,"maximum":3}},"required":["k"],"additionalProperties":{"type":"boolean"}})",
           R"({"type":"object","additionalProperties":{"type":"integer","minimum":0,"maximum":99}})",
           R"({})", R"(true)", R"({"type":"array"})", R"({"type":"object"})",
           R"({"type":"string","pattern":"[0-9]{2}"})",
           R"({"type":"array","items":[{"type":"integer"},{"type":"string"}]})",
       }) {
    CheckSchema(schema, json::parse(schema), 5, &accepted_mutations);
  }
  EXPECT_GT(accepted_mutations, 100);  // the soundness check above ran on real cases
}

TEST(JsonSchemaGrammarTest, IntegerRangesAreExact) {
  std::mt19937_64 rng(5);
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> ranges = {
      {0, 0},     {0, 9},      {1, 10},   {-5, 5},       {-1000, -7},   {7, 7},
      {99, 101},  {-101, -99}, {0, 1234}, {15, 1000000}, {-3, std::nullopt},
      {std::nullopt, 12},      {123456789, 123456999},   {-9, -1},
  };
  for (const auto& [lo, hi] : ranges) {
    json schema = {{"type", "integer"}};
    if (lo) schema["minimum"] = *lo;
    if (hi) schema["maximum"] = *hi;
    auto grammar = SchemaGrammar(schema);
    ASSERT_NE(grammar, nullptr);
    GrammarMatcher matcher(grammar);
    const int64_t from = lo ? *lo - 30 : *hi - 3000;
    const int64_t to = hi ? *hi + 30 : *lo + 3000;
    for (int64_t v = from; v <= to; ++v) {
      const bool inside = (!lo || v >= *lo) && (!hi || v <= *hi);
      ASSERT_EQ(MatcherAccepts(matcher, std::to_string(v)), inside) << schema.dump() << " " << v;
    }
    // Never a leading zero, "-0", or a fraction.
    for (const std::string s : {"00", "01", "-0", "-01", "1.0", "+1"}) {
      EXPECT_FALSE(MatcherAccepts(matcher, s)) << schema.dump() << " " << s;
    }
  }
  // An open side stops at 16 digits, as the number rules do.
  auto open = SchemaGrammar(json::parse(R"({"type":"integer","minimum":5})"));
  GrammarMatcher m(open);
  EXPECT_TRUE(MatcherAccepts(m, "9999999999999999"));
  EXPECT_FALSE(MatcherAccepts(m, "10000000000000000"));
}

std::string SchemaError(const char* schema) {
  StatusOr<std::string> gbnf = JsonSchemaToGbnf(json::parse(schema));
  EXPECT_FALSE(gbnf.ok()) << schema;
  return gbnf.ok() ? "" : gbnf.status().message();
}

TEST(JsonSchemaGrammarTest, RefusesWhatItCannotHonourNamingTheKeyword) {
  EXPECT_EQ(SchemaError(R"({"not":{"type":"string"}})"),
            "json_schema: 'not' at #: this keyword is not supported");
  EXPECT_EQ(SchemaError(R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})"),
            "json_schema: 'uniqueItems' at #/properties/a: unique items cannot be enforced by a "
            "grammar");
  EXPECT_EQ(SchemaError(R"({"type":"integer","multipleOf":3})"),
            "json_schema: 'multipleOf' at #: this keyword is not supported");
  EXPECT_EQ(SchemaError(R"({"type":"number","maximum":3.5})"),
            "json_schema: 'maximum' at #: bounds on a non-integer number are not supported "
            "(only minimum 0)");
  EXPECT_EQ(SchemaError(R"({"$ref":"https://example.com/s.json"})"),
            "json_schema: '$ref' at #: 'https://example.com/s.json' is not a local reference "
            "(only '#...' is)");
  EXPECT_EQ(SchemaError(R"({"$ref":"#/$defs/missing"})"),
            "json_schema: '$ref' at #: '#/$defs/missing' names nothing in this schema");
  EXPECT_EQ(SchemaError(R"({"type":"strin"})"), "json_schema: 'type' at #: unknown type 'strin'");
  EXPECT_EQ(SchemaError(R"({"type":"integer","minimum":5,"maximum":4})"),
            "json_schema: 'minimum' at #: no integer lies between minimum and maximum");
  EXPECT_EQ(SchemaError(R"({"type":"array","minItems":3,"maxItems":2})"),
            "json_schema: 'minItems' at #: minItems is above maxItems");
  EXPECT_EQ(SchemaError(R"({"type":"string","maxLength":100000})"),
            "json_schema: 'maxLength' at #: at most 10000 is supported");
  EXPECT_EQ(SchemaError(R"({"anyOf":[{"type":"string"},{"if":{}}]})"),
            "json_schema: 'if' at #/anyOf/1: this keyword is not supported");
  const std::string lookahead = SchemaError(R"({"type":"string","pattern":"^(?=a)b$"})");
  EXPECT_EQ(lookahead.rfind("json_schema: 'pattern' at #: pattern", 0), 0u) << lookahead;
  EXPECT_NE(lookahead.find("lookaround"), std::string::npos) << lookahead;
  EXPECT_NE(SchemaError(R"({"type":"string","pattern":"^(a)\\1$"})").find("'\\1'"),
            std::string::npos);
  EXPECT_NE(SchemaError(R"({"type":"string","pattern":"a^b"})").find("anchor"), std::string::npos);
  EXPECT_EQ(SchemaError(R"(false)"), "json_schema: 'false' at #: the schema false accepts no value");
}

TEST(JsonSchemaGrammarTest, PatternsMatchAsTheRegexDoes) {
  // Strings the grammar derives match the regex (std::regex, ECMAScript); strings the regex
  // refuses are refused.
  const char* patterns[] = {"^[a-c]{2,3}x?$", "^(ab|cd)+$", "^\\w\\d\\s?\\.$", "^[^0-9]{1,2}$",
                            "^\\u0041+$", "b{2}", "^a.c$", "^[\\]\\-]$"};
  for (const char* pattern : patterns) {
    const json schema = {{"type", "string"}, {"pattern", pattern}};
    auto grammar = SchemaGrammar(schema);
    ASSERT_NE(grammar, nullptr) << pattern;
    GrammarMatcher matcher(grammar);
    GrammarSampler sampler(*grammar, 3);
    for (int i = 0; i < 50; ++i) {
      const std::string text = sampler.Generate(6);
      const json value = json::parse(text, nullptr, false);
      ASSERT_TRUE(value.is_string()) << pattern << ": " << text;
      EXPECT_EQ(SchemaChecker(schema).Check(value), "") << pattern << ": " << text;
    }
    for (const char* s : {"\"\"", "\"ab\"", "\"abx\"", "\"abcd\"", "\"a1 .\"", "\"xy\"", "\"abc\""}) {
      if (!MatcherAccepts(matcher, s)) continue;
      EXPECT_EQ(SchemaChecker(schema).Check(json::parse(s)), "") << pattern << " " << s;
    }
  }
}

TEST(JsonSchemaGrammarTest, WhitespaceAndNumbersAreBounded) {
  auto grammar = MustParse(JsonObjectGbnf());
  GrammarMatcher m(grammar);
  EXPECT_TRUE(MatcherAccepts(m, "{\n\n" + std::string(20, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(MatcherAccepts(m, "{\n\n" + std::string(21, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(MatcherAccepts(m, "{\n\n\n\"a\": 1}"));
  EXPECT_TRUE(MatcherAccepts(m, "{\"a\": " + std::string(16, '9') + "}"));
  EXPECT_FALSE(MatcherAccepts(m, "{\"a\": " + std::string(17, '9') + "}"));
  EXPECT_FALSE(MatcherAccepts(m, "[1]"));  // json_object: an object at the top
}

}  // namespace
}  // namespace kvl
