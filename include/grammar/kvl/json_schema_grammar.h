// JSON schemas turned into GBNF grammars, as llama.cpp's json-schema-to-grammar does, so that a
// constrained output is always a JSON document the schema accepts.
//
// Supported: type (object, array, string, number, integer, boolean, null, and lists of them),
// properties, required, additionalProperties (false, true or a schema), enum, const, items
// (a schema, or a list for tuples) and prefixItems, minItems, maxItems, anyOf, oneOf (as anyOf),
// allOf (of object schemas: merged), $ref to #, #/$defs/... and #/definitions/... (recursion
// allowed), string minLength, maxLength, format (date, time, date-time, uuid; other formats are
// annotations and left free, as JSON Schema itself does unless asked), pattern (a regex subset:
// literals, ., classes, \d \w \s and their negations, groups, |, ?, *, +, {m,n}), integer
// minimum, maximum, exclusiveMinimum, exclusiveMaximum, and a number's minimum of 0.
//
// What JSON leaves unbounded is bounded as llama.cpp bounds it: a whitespace run is at most two
// line breaks and 20 spaces or tabs, an integer part and a fraction at most 16 digits each. A
// schema that bounds its strings and arrays therefore bounds the whole output.
//
// A keyword this cannot honour (not, if/then/else, patternProperties, uniqueItems: true,
// multipleOf, a regex feature outside the subset, ...) is INVALID_ARGUMENT naming it, never
// silently ignored: an output that ignored it could fail the caller's validation.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvl/status.h"

namespace kvl {

// The GBNF of `schema`, its root rule named "root". Properties come in the schema's order, as
// a client wrote them (an ordered_json keeps it; a json's are sorted by name).
StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema);
StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::json& schema);

// The GBNF of any JSON object (response_format {"type": "json_object"}).
std::string JsonObjectGbnf();

namespace json_schema {
// `text` as a GBNF literal: "..." with quotes, backslashes and control bytes escaped (for
// grammars written around a schema's, such as the server's forced tool calls).
std::string GbnfLiteral(std::string_view text);
}  // namespace json_schema

}  // namespace kvl
