// How values print, compare and turn into JSON, as the reference's runtime does it. The
// reference is JavaScript, so two kinds of "to string" exist: Display is what `{{ x }}` prints
// (RuntimeValue.toString), RawString what `~` and `+` concatenate (the JavaScript value's own
// toString: 1.0 prints "1", a list prints its items joined by ",").
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "kvl/jinja_value.h"

namespace kvl::jinja {

// An error while rendering, thrown inside the library only and turned into a Status at
// Template::Render (the evaluator recurses deeply; unwinding by exception keeps each step short).
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Display(const Value& v);
std::string RawString(const Value& v);

struct JsonOptions {
  std::optional<int> indent;
  bool ensure_ascii = false;
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool sort_keys = false;
};
// toJSON(): Python's json.dumps layout ((", ", ": ") or ("," + newline, ": ") when indenting).
// `undefined_to_null` false prints an undefined value as `undefined` (how lists print).
std::string ToJson(const Value& v, const JsonOptions& options, int depth = 0, bool undefined_to_null = true);

// JavaScript `==` on the values (1 == "1", none == undefined, lists by identity).
bool LooseEquals(const Value& a, const Value& b);
// JavaScript `===` on the values (what `in` a list and the equalto test use).
bool StrictEquals(const Value& a, const Value& b);
// The reference's sort order: numbers (booleans as 0/1) and strings (case-insensitive unless
// asked); anything else, or mixed types, is an error.
int CompareValues(const Value& a, const Value& b, bool case_sensitive);

}  // namespace kvl::jinja
