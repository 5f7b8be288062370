// The pieces of the JSON-schema converter (json_schema_grammar.cc) that stand on their own: GBNF
// literals, integer ranges as digit grammars, and regex patterns as GBNF.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvl/json_schema_grammar.h"
#include "kvl/status.h"

namespace kvl::json_schema {

// GbnfLiteral is declared in kvl/json_schema_grammar.h (the server writes literals too).

// The integers in [lo, hi] (either side open where unset) written in decimal, without leading
// zeros or "-0", as a GBNF expression. An open side stops at 16 digits (the number rules' own
// bound). Empty when the range holds no integer.
std::string IntegerRangeGbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A regex pattern (JSON Schema's ECMAScript dialect, the subset listed in
// kvl/json_schema_grammar.h) as a GBNF expression for the characters inside a JSON string:
// never a raw quote, backslash or control character, so the string stays valid JSON whose
// decoded text matches the pattern. An unanchored side may hold any other characters
// (`char_rule`, the escaped-character rule). INVALID_ARGUMENT naming the regex feature it cannot
// translate.
StatusOr<std::string> RegexToGbnf(std::string_view pattern, std::string_view char_rule);

}  // namespace kvl::json_schema
