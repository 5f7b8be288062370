#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "js_text.h"
#include "kvl/jinja_value.h"
#include "value_ops.h"

namespace kvl::jinja {

const Value* ValueMap::Find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueMap::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::Null() {
  Value v;
  v.kind_ = Kind::kNull;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.number_ = b ? 1 : 0;
  return v;
}
Value Value::Int(double n) {
  Value v;
  v.kind_ = Kind::kInt;
  v.number_ = n;
  return v;
}
Value Value::Float(double n) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.number_ = n;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::Array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.array_ = std::make_shared<std::vector<Value>>(std::move(items));
  return v;
}
Value Value::Tuple(std::vector<Value> items) {
  Value v = Array(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::Object(ValueMap map) {
  Value v;
  v.kind_ = Kind::kObject;
  v.map_ = std::make_shared<ValueMap>(std::move(map));
  return v;
}
Value Value::Namespace(ValueMap map) {
  Value v = Object(std::move(map));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::Function(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.function_ = std::move(fn);
  return v;
}

std::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "UndefinedValue";
    case Kind::kNull: return "NullValue";
    case Kind::kBool: return "BooleanValue";
    case Kind::kInt: return "IntegerValue";
    case Kind::kFloat: return "FloatValue";
    case Kind::kString: return "StringValue";
    case Kind::kArray: return tuple_ ? "TupleValue" : "ArrayValue";
    case Kind::kObject: return "ObjectValue";
    case Kind::kNamespace: return "NamespaceValue";
    case Kind::kFunction: return "FunctionValue";
  }
  return "Value";
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNull: return false;
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat: return number_ != 0 && !std::isnan(number_);
    case Kind::kString: return !string_->empty();
    case Kind::kArray: return !array_->empty();
    case Kind::kObject: return !map_->entries.empty();
    case Kind::kNamespace:  // a JavaScript Map object: always true
    case Kind::kFunction: return true;
  }
  return false;
}

bool Value::SameObject(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kArray: return array_ == other.array_;
    case Kind::kObject:
    case Kind::kNamespace: return map_ == other.map_;
    case Kind::kFunction: return function_ == other.function_;
    default: return false;
  }
}

std::string Display(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNull: return "null";
    case Value::Kind::kBool: return v.boolean() ? "true" : "false";
    case Value::Kind::kInt: return JsNumberToString(v.number());
    case Value::Kind::kFloat: return FloatToString(v.number());
    case Value::Kind::kString: return v.str();
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: return ToJson(v, {}, 0, false);
    case Value::Kind::kFunction: return "[function]";
  }
  return "";
}

std::string RawString(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return JsNumberToString(v.number());
    case Value::Kind::kArray: {
      std::string out;
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += ",";
        out += Display(v.items()[i]);
      }
      return out;
    }
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: return "[object Map]";
    default: return Display(v);
  }
}

std::string ToJson(const Value& v, const JsonOptions& options, int depth, bool undefined_to_null) {
  const bool indenting = options.indent.has_value() && *options.indent != 0;
  std::string item_sep = ", ", key_sep = ": ";
  if (options.separators) {
    item_sep = options.separators->first, key_sep = options.separators->second;
  } else if (indenting) {
    item_sep = ",";
  }
  switch (v.kind()) {
    case Value::Kind::kNull: return "null";
    case Value::Kind::kUndefined: return undefined_to_null ? "null" : "undefined";
    case Value::Kind::kBool: return v.boolean() ? "true" : "false";
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return std::isfinite(v.number()) ? JsNumberToString(v.number()) : "null";
    case Value::Kind::kString: return JsonQuote(v.str(), options.ensure_ascii);
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: {
      // The reference's toJSON knows no TupleValue: a tuple does not print.
      if (v.is_tuple()) throw RenderError("cannot convert a tuple to JSON or text");
      if (depth > 256) throw RenderError("tojson: a value nested deeper than 256 levels");
      const std::string indent_unit = indenting ? std::string(std::max(0, *options.indent), ' ') : "";
      std::string base_padding = "\n";
      for (int i = 0; i < depth; ++i) base_padding += indent_unit;
      const std::string child_padding = base_padding + indent_unit;
      std::vector<std::string> core;
      if (v.is_array()) {
        for (const Value& item : v.items()) core.push_back(ToJson(item, options, depth + 1, undefined_to_null));
        std::string out = "[";
        if (indenting && !core.empty()) {
          out += child_padding;
          for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep + child_padding : "") + core[i];
          return out + base_padding + "]";
        }
        for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep : "") + core[i];
        return out + "]";
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.map().entries) entries.push_back(&entry);
      if (options.sort_keys) {
        // localeCompare on the keys; plain code point order stands in for the locale's.
        std::stable_sort(entries.begin(), entries.end(), [](auto* x, auto* y) { return x->first < y->first; });
      }
      std::string out = "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        std::string entry = JsonQuote(entries[i]->first, options.ensure_ascii) + key_sep +
                            ToJson(entries[i]->second, options, depth + 1, undefined_to_null);
        out += (i ? item_sep : "") + (indenting ? child_padding : "") + entry;
      }
      return out + (indenting && !entries.empty() ? base_padding : "") + "}";
    }
    case Value::Kind::kFunction: throw RenderError("cannot convert a function to JSON");
  }
  return "";
}

namespace {

// ToPrimitive for loose equality: a list becomes its joined text, a mapping "[object Map]".
Value Primitive(const Value& v) {
  if (v.is_array() || v.is_object() || v.is_namespace()) return Value::String(RawString(v));
  return v;
}

double ToNumber(const Value& v) {
  return v.is_string() ? JsStringToNumber(v.str()) : v.number();
}

}  // namespace

bool LooseEquals(const Value& a, const Value& b) {
  const bool a_nullish = a.is_undefined() || a.is_null();
  const bool b_nullish = b.is_undefined() || b.is_null();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  const bool a_object = a.is_array() || a.is_object() || a.is_namespace() || a.is_function();
  const bool b_object = b.is_array() || b.is_object() || b.is_namespace() || b.is_function();
  if (a_object && b_object) return a.SameObject(b);
  if (a_object) return LooseEquals(Primitive(a), b);
  if (b_object) return LooseEquals(a, Primitive(b));
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_bool() && b.is_bool()) return a.boolean() == b.boolean();
  return ToNumber(a) == ToNumber(b);
}

bool StrictEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNull: return true;
    case Value::Kind::kBool: return a.boolean() == b.boolean();
    case Value::Kind::kString: return a.str() == b.str();
    default: return a.SameObject(b);
  }
}

int CompareValues(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null() || a.is_undefined() != b.is_undefined()) {
    throw RenderError(fmt::format("cannot compare {} with {}", a.TypeName(), b.TypeName()));
  }
  if (a.is_undefined()) return 0;
  const auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  if (a.TypeName() != b.TypeName()) {
    throw RenderError(fmt::format("cannot compare different types: {} and {}", a.TypeName(), b.TypeName()));
  }
  if (!a.is_string()) throw RenderError(fmt::format("cannot compare type {}", a.TypeName()));
  // JavaScript compares UTF-16 code units; UTF-8 byte order agrees except across surrogates.
  std::string x = case_sensitive ? a.str() : AsciiLower(a.str());
  std::string y = case_sensitive ? b.str() : AsciiLower(b.str());
  return x < y ? -1 : x > y ? 1 : 0;
}

}  // namespace kvl::jinja
