// JSON schemas for the constrained-output suites: varied in the keywords they use, and bounded
// (every string, array and number has a limit) so that even a model that writes at random
// finishes each output within a bounded number of tokens. (additionalProperties with a schema
// is not: nothing bounds how many members or how long a key a model writes, and greedy decoding
// of stories260K wrote members until max_tokens; it is checked by the grammar tests instead.)
#pragma once

#include <string>
#include <vector>

namespace kvl::testing {

struct SuiteSchema {
  const char* name;
  const char* schema;
};

inline const std::vector<SuiteSchema>& BoundedSchemaSuite() {
  static const std::vector<SuiteSchema> kSuite = {
      {"boolean", R"({"type":"boolean"})"},
      {"null", R"({"type":"null"})"},
      {"integer", R"({"type":"integer"})"},
      {"number", R"({"type":"number"})"},
      {"nonnegative-number", R"({"type":"number","minimum":0})"},
      {"short-string", R"({"type":"string","maxLength":8})"},
      {"string-min-max", R"({"type":"string","minLength":2,"maxLength":5})"},
      {"exact-string", R"({"type":"string","minLength":3,"maxLength":3})"},
      {"enum-strings", R"({"enum":["red","green","blue"]})"},
      {"enum-mixed", R"({"enum":[1,"two",null,true,{"x":[1,2]}]})"},
      {"const", R"({"const":{"kind":"fixed","n":3}})"},
      {"int-range", R"({"type":"integer","minimum":-15,"maximum":1234})"},
      {"int-exclusive", R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})"},
      {"int-draft4-exclusive",
       R"({"type":"integer","minimum":10,"exclusiveMinimum":true,"maximum":20,"exclusiveMaximum":true})"},
      {"int-negative-range", R"({"type":"integer","minimum":-1000,"maximum":-7})"},
      {"int-min-only", R"({"type":"integer","minimum":42})"},
      {"type-list", R"({"type":["string","null"],"maxLength":4})"},
      {"date", R"({"type":"string","format":"date"})"},
      {"time", R"({"type":"string","format":"time"})"},
      {"date-time", R"({"type":"string","format":"date-time"})"},
      {"uuid", R"({"type":"string","format":"uuid"})"},
      {"pattern-phone", R"({"type":"string","pattern":"^\\d{3}-\\d{4}$"})"},
      {"pattern-alternation", R"({"type":"string","pattern":"^(cat|dog)s?( [a-z]{1,5}){0,2}$"})"},
      {"pattern-classes", R"({"type":"string","pattern":"^[A-Z][a-z0-9_]{0,6}\\.(txt|md)$"})"},
      {"pattern-escapes", R"({"type":"string","pattern":"^a\"b\\\\c[^a-z\\s]{1,3}$"})"},
      {"pattern-dot", R"({"type":"string","pattern":"^x.{2}y?$"})"},
      {"array-of-ints", R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"maxItems":5})"},
      {"array-min-max", R"({"type":"array","items":{"type":"boolean"},"minItems":2,"maxItems":4})"},
      {"array-empty-only", R"({"type":"array","maxItems":0})"},
      {"tuple", R"({"type":"array","prefixItems":[{"type":"string","maxLength":3},{"type":"integer","maximum":5,"minimum":0},{"type":"boolean"}]})"},
      {"object-required",
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"]})"},
      {"object-optional",
       R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"integer","maximum":9,"minimum":0}}})"},
      {"object-mixed",
       R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"ok":{"type":"boolean"},"note":{"type":"string","maxLength":6},"n":{"type":"integer","minimum":1,"maximum":3}},"required":["id","n"]})"},
      {"object-additional-false",
       R"({"type":"object","properties":{"x":{"type":"null"}},"additionalProperties":false})"},
      {"nested-objects",
       R"({"type":"object","properties":{"user":{"type":"object","properties":{"first":{"type":"string","maxLength":6},"last":{"type":"string","maxLength":6}},"required":["first"]},"active":{"type":"boolean"}},"required":["user","active"]})"},
      {"array-of-objects",
       R"({"type":"array","maxItems":3,"items":{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{2}[0-9]{3}$"},"qty":{"type":"integer","minimum":1,"maximum":50}},"required":["sku","qty"]}})"},
      {"anyOf",
       R"({"anyOf":[{"type":"integer","minimum":0,"maximum":10},{"type":"string","maxLength":4},{"type":"null"}]})"},
      {"oneOf-disjoint",
       R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"integer","minimum":1,"maximum":9}},"required":["kind","r"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"integer","minimum":1,"maximum":9}},"required":["kind","side"],"additionalProperties":false}]})"},
      {"allOf-merge",
       R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":5}},"required":["a"]},{"properties":{"b":{"type":"string","maxLength":3}},"required":["b"]}]})"},
      {"ref-defs",
       R"({"$defs":{"point":{"type":"object","properties":{"x":{"type":"integer","minimum":-9,"maximum":9},"y":{"type":"integer","minimum":-9,"maximum":9}},"required":["x","y"]}},"type":"object","properties":{"from":{"$ref":"#/$defs/point"},"to":{"$ref":"#/$defs/point"}},"required":["from","to"]})"},
      {"ref-definitions",
       R"({"definitions":{"color":{"enum":["r","g","b"]}},"type":"array","items":{"$ref":"#/definitions/color"},"minItems":1,"maxItems":4})"},
      {"recursive-tree",
       R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},"kids":{"type":"array","maxItems":2,"items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})"},
      {"unicode-keys-and-enum",
       R"({"type":"object","properties":{"名前":{"enum":["é","ß","日本"]},"a\"b":{"type":"boolean"}},"required":["名前","a\"b"]})"},
      {"tool-call",
       R"({"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"type":"string","maxLength":12},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]}},"required":["name","arguments"]})"},
      {"empty-object-schema-bounded",
       R"({"type":"object","properties":{},"additionalProperties":false})"},
  };
  return kSuite;
}

}  // namespace kvl::testing
