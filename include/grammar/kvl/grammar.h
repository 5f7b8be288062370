// A context-free grammar in llama.cpp's GBNF syntax, parsed into rules of flat elements as
// llama.cpp's llama-grammar holds them, so that grammars written for llama-server mean the same
// here:
//
//   root   ::= object ws          # a rule: a name, "::=", alternatives separated by "|"
//   object ::= "{" ( pair ("," pair)* )? "}"
//   pair   ::= [a-z]+ ":" [^\n"\\]{1,16} | "x"?
//
// Literals ("..."), character classes ([...], ranges a-z, negation [^...]), `.` (any character),
// groups, rule references, and the postfix operators `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}`;
// escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH; `#` comments. Repetitions are expanded
// into rules of their own at parse time (llama.cpp's expansion), so the matcher sees only
// sequences, alternatives and references.
//
// Thread-safety: immutable after parsing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/status.h"

namespace kvl {

enum class GrammarElemType : uint8_t {
  kEnd,             // end of a rule
  kAlt,             // start of another alternative of the rule
  kRuleRef,         // value: the rule's id
  kChar,            // value: a code point; starts a character class (a literal char is one)
  kCharNot,         // value: a code point; starts a negated character class
  kCharRangeUpper,  // value: the upper bound of a range whose lower bound is the previous element
  kCharAlt,         // value: another code point (or range start) of the current class
  kCharAny,         // `.`: any code point
};

struct GrammarElem {
  GrammarElemType type;
  uint32_t value;
};

// The most elements a grammar may expand to (a repetition such as x{1,100000} expands into that
// many copies): a request cannot make the server allocate without bound.
inline constexpr size_t kMaxGrammarElements = 1 << 21;

struct Grammar {
  // rules[id]: alternatives separated by kAlt, the last ended by kEnd.
  std::vector<std::vector<GrammarElem>> rules;
  std::vector<std::string> rule_names;  // the written name, or name_N for generated rules
  uint32_t root = 0;
};

// Parses GBNF text. INVALID_ARGUMENT for a syntax error (with line and column), a reference to
// a rule never defined, a grammar without the root rule, a left-recursive rule (the matcher
// could never finish expanding it) or one larger than kMaxGrammarElements.
StatusOr<std::shared_ptr<const Grammar>> ParseGbnf(std::string_view text,
                                                   std::string_view root = "root");

// The grammar written back as GBNF (generated rules included), for errors and tests.
std::string GrammarToGbnf(const Grammar& grammar);

}  // namespace kvl
