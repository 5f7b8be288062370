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

// More of each kind: with the suite above, the >= 100 schemas of the ajv suite
// (tests/server/json_schema_ajv_test.cc). Kept apart so that the engine's suite, which runs each
// schema three times in one batch, keeps its size.
inline const std::vector<SuiteSchema>& MoreBoundedSchemas() {
  static const std::vector<SuiteSchema> kMore = {
      {"bool-in-object", R"({"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]})"},
      {"null-or-bool", R"({"type":["null","boolean"]})"},
      {"int-or-string", R"({"type":["integer","string"],"maxLength":3,"minimum":0,"maximum":99})"},
      {"int-0-1", R"({"type":"integer","minimum":0,"maximum":1})"},
      {"int-year", R"({"type":"integer","minimum":1900,"maximum":2100})"},
      {"int-percent", R"({"type":"integer","minimum":0,"maximum":100})"},
      {"int-minus-one-to-one", R"({"type":"integer","minimum":-1,"maximum":1})"},
      {"int-big-range", R"({"type":"integer","minimum":-99999,"maximum":99999})"},
      {"int-exclusive-max-only", R"({"type":"integer","exclusiveMaximum":5,"minimum":-5})"},
      {"int-exclusive-min-only", R"({"type":"integer","exclusiveMinimum":-3,"maximum":3})"},
      {"number-in-object", R"({"type":"object","properties":{"price":{"type":"number","minimum":0}},"required":["price"]})"},
      {"string-min-only-bounded", R"({"type":"string","minLength":1,"maxLength":1})"},
      {"string-max-20", R"({"type":"string","maxLength":20})"},
      {"string-empty-only", R"({"type":"string","maxLength":0})"},
      {"enum-one", R"({"enum":["only"]})"},
      {"enum-numbers", R"({"enum":[1,2,3,5,8,13]})"},
      {"enum-unicode", R"({"enum":["naïve","café","Ω","🙂"]})"},
      {"enum-with-quotes", R"({"enum":["a\"b","c\\d","e/f"]})"},
      {"const-string", R"({"const":"fixed"})"},
      {"const-number", R"({"const":42})"},
      {"const-array", R"({"const":[1,"a",null]})"},
      {"const-in-object", R"({"type":"object","properties":{"v":{"const":1},"k":{"const":"x"}},"required":["v","k"]})"},
      {"date-in-object", R"({"type":"object","properties":{"born":{"type":"string","format":"date"}},"required":["born"]})"},
      {"times-array", R"({"type":"array","items":{"type":"string","format":"time"},"minItems":1,"maxItems":2})"},
      {"uuid-list", R"({"type":"array","items":{"type":"string","format":"uuid"},"maxItems":2})"},
      {"pattern-hex", R"({"type":"string","pattern":"^#[0-9a-f]{6}$"})"},
      {"pattern-word", R"({"type":"string","pattern":"^\\w{1,8}$"})"},
      {"pattern-digits-optional", R"({"type":"string","pattern":"^\\d{2}(\\.\\d{1,2})?$"})"},
      {"pattern-ip-like", R"({"type":"string","pattern":"^\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}$"})"},
      {"pattern-negated-class", R"({"type":"string","pattern":"^[^0-9]{2,4}$"})"},
      {"pattern-email-like", R"({"type":"string","pattern":"^[a-z]{1,6}@[a-z]{1,6}\\.(com|org)$"})"},
      {"pattern-upper-code", R"({"type":"string","pattern":"^[A-Z]{3}-[0-9]{2}$"})"},
      {"array-of-strings", R"({"type":"array","items":{"type":"string","maxLength":4},"maxItems":3})"},
      {"array-of-enums", R"({"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":3})"},
      {"array-exact-2", R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":2,"maxItems":2})"},
      {"array-of-nulls", R"({"type":"array","items":{"type":"null"},"maxItems":4})"},
      {"array-of-arrays", R"({"type":"array","maxItems":2,"items":{"type":"array","maxItems":2,"items":{"type":"boolean"}}})"},
      {"array-of-anyof", R"({"type":"array","maxItems":3,"items":{"anyOf":[{"type":"boolean"},{"type":"integer","minimum":0,"maximum":3}]}})"},
      {"tuple-two", R"({"type":"array","prefixItems":[{"const":"point"},{"type":"integer","minimum":0,"maximum":9}]})"},
      {"tuple-items-list", R"({"type":"array","items":[{"type":"boolean"},{"type":"null"}]})"},
      {"object-all-optional", R"({"type":"object","properties":{"p":{"type":"integer","minimum":0,"maximum":5},"q":{"type":"string","maxLength":3}}})"},
      {"object-one-required-of-three", R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"boolean"},"c":{"type":"boolean"}},"required":["b"]})"},
      {"object-enum-props", R"({"type":"object","properties":{"size":{"enum":["s","m","l"]},"color":{"enum":["red","blue"]}},"required":["size","color"]})"},
      {"object-array-prop", R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},"required":["tags"]})"},
      {"object-nested-3", R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"object","properties":{"c":{"type":"integer","minimum":0,"maximum":9}},"required":["c"]}},"required":["b"]}},"required":["a"]})"},
      {"object-additional-false-required", R"({"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":999}},"required":["id"],"additionalProperties":false})"},
      {"object-nullable-prop", R"({"type":"object","properties":{"v":{"type":["integer","null"],"minimum":0,"maximum":9}},"required":["v"]})"},
      {"object-many-props", R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"integer","minimum":0,"maximum":1},"d":{"enum":["d"]},"e":{"const":5},"f":{"type":"string","maxLength":2}},"required":["a","b","c","d","e","f"]})"},
      {"object-date-time", R"({"type":"object","properties":{"at":{"type":"string","format":"date-time"}},"required":["at"]})"},
      {"anyOf-objects", R"({"anyOf":[{"type":"object","properties":{"ok":{"const":true}},"required":["ok"]},{"type":"object","properties":{"error":{"type":"string","maxLength":10}},"required":["error"]}]})"},
      {"oneOf-scalars", R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})"},
      {"anyOf-nested-in-prop", R"({"type":"object","properties":{"value":{"anyOf":[{"type":"integer","minimum":0,"maximum":9},{"enum":["none"]}]}},"required":["value"]})"},
      {"allOf-three", R"({"allOf":[{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]},{"properties":{"b":{"type":"null"}},"required":["b"]},{"properties":{"c":{"enum":[1]}},"required":["c"]}]})"},
      {"ref-in-array", R"({"$defs":{"flag":{"type":"boolean"}},"type":"array","items":{"$ref":"#/$defs/flag"},"maxItems":3})"},
      {"ref-chain", R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"type":"integer","minimum":0,"maximum":7}},"type":"object","properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]})"},
      {"ref-twice", R"({"$defs":{"name":{"type":"string","maxLength":5}},"type":"object","properties":{"first":{"$ref":"#/$defs/name"},"last":{"$ref":"#/$defs/name"}},"required":["first","last"]})"},
      {"function-call-like", R"({"type":"object","properties":{"name":{"enum":["search","lookup"]},"arguments":{"type":"object","properties":{"query":{"type":"string","maxLength":12},"limit":{"type":"integer","minimum":1,"maximum":10}},"required":["query"]}},"required":["name","arguments"]})"},
      {"address", R"({"type":"object","properties":{"street":{"type":"string","maxLength":12},"zip":{"type":"string","pattern":"^[0-9]{5}$"},"country":{"enum":["DE","FR","US"]}},"required":["street","zip","country"]})"},
      {"event", R"({"type":"object","properties":{"title":{"type":"string","maxLength":10},"day":{"type":"string","format":"date"},"attendees":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3}},"required":["title","day"]})"},
      {"matrix-2x2", R"({"type":"array","minItems":2,"maxItems":2,"items":{"type":"array","minItems":2,"maxItems":2,"items":{"type":"integer","minimum":-9,"maximum":9}}})"},
      {"rating", R"({"type":"object","properties":{"stars":{"type":"integer","minimum":1,"maximum":5},"comment":{"type":["string","null"],"maxLength":15}},"required":["stars","comment"]})"},
  };
  return kMore;
}

// Both lists.
inline std::vector<SuiteSchema> FullSchemaSuite() {
  std::vector<SuiteSchema> all = BoundedSchemaSuite();
  all.insert(all.end(), MoreBoundedSchemas().begin(), MoreBoundedSchemas().end());
  return all;
}

}  // namespace kvl::testing
