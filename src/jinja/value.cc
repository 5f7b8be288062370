#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "interpreter.h"
#include "js_text.h"
#include "kvl/jinja_value.h"
#include "render_budget.h"
#include "value_ops.h"

namespace kvl::jinja {
namespace {

// A value's data with the bytes it counts against the render that made it, given back when the
// last Value naming it lets go.
template <typename T>
struct Counted {
  explicit Counted(T p) : payload(std::move(p)) {}
  ~Counted() {
    if (held) held->fetch_sub(bytes, std::memory_order_relaxed);
  }
  T payload;
  std::shared_ptr<std::atomic<int64_t>> held;  // null: made outside a render
  int64_t bytes = 0;
};

// What the allocator holds for a shared payload besides the payload's own heap data.
template <typename T>
constexpr size_t kPayloadOverhead = sizeof(Counted<T>) + 2 * sizeof(void*) + 16;

size_t HeapBytes(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }

size_t HeapBytes(const std::vector<Value>& items) { return items.capacity() * sizeof(Value); }

size_t HeapBytes(const ValueMap& map) {
  size_t bytes = map.entries.capacity() * sizeof(map.entries[0]);
  for (const auto& entry : map.entries) bytes += HeapBytes(entry.first);
  return bytes;
}

// The payload shared by the Values that name it; made during a render, it counts against that
// render's bytes (an error past its budget) until freed.
template <typename T>
std::shared_ptr<T> MakePayload(T payload) {
  RenderBudget* budget = CurrentBudget();
  if (budget == nullptr) return std::make_shared<T>(std::move(payload));
  const size_t bytes = HeapBytes(payload) + kPayloadOverhead<T>;
  auto box = std::make_shared<Counted<T>>(std::move(payload));
  budget->Hold(bytes);
  box->held = budget->held();
  box->bytes = static_cast<int64_t>(bytes);
  return std::shared_ptr<T>(box, &box->payload);
}

}  // namespace

Value::~Value() {
  if (!array_ && !map_ && !function_) return;
  std::vector<Value> pending;
  ReleaseChildren(&pending);
  while (!pending.empty()) {
    Value v = std::move(pending.back());
    pending.pop_back();
    v.ReleaseChildren(&pending);
    // `v` is freed here owning nothing that owns more: its destructor finds nothing to do.
  }
}

void Value::ReleaseChildren(std::vector<Value>* pending) {
  auto owns_more = [](const Value& v) { return v.array_ || v.map_ || v.function_; };
  // use_count() is exact for the payloads a render made (one thread); for a caller's values
  // shared across threads a stale count only means the ordinary, recursive free.
  if (array_ && array_.use_count() == 1) {
    for (Value& item : *array_) {
      if (owns_more(item)) pending->push_back(std::move(item));
    }
    array_->clear();
  }
  if (map_ && map_.use_count() == 1) {
    for (auto& entry : map_->entries) {
      if (owns_more(entry.second)) pending->push_back(std::move(entry.second));
    }
    map_->entries.clear();
  }
  if (function_ && function_.use_count() == 1) {
    Value receiver = function_->TakeReceiver();
    if (owns_more(receiver)) pending->push_back(std::move(receiver));
  }
}

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
  v.string_ = MakePayload(std::move(s));
  return v;
}
Value Value::Array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.array_ = MakePayload(std::move(items));
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
  v.map_ = MakePayload(std::move(map));
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

namespace {

// Printing walks a value recursively: deeper than this is an error, however deep the value.
constexpr int kMaxPrintDepth = 256;
// The longest text a value prints to outside a render (inside one, its max_string_bytes).
constexpr size_t kPrintLimitOutsideRender = size_t{16} << 20;

size_t PrintLimit() {
  const RenderBudget* budget = CurrentBudget();
  return budget != nullptr ? budget->max_string_bytes() : kPrintLimitOutsideRender;
}

// Refuses text about to grow past the print limit before it does (a list holding itself many
// times over prints exponentially long).
void ReserveText(const std::string& out, size_t more) {
  const size_t limit = PrintLimit();
  if (more > limit || out.size() > limit - more) {
    throw RenderError(fmt::format("a value printed longer than {} bytes (the render's string limit)", limit));
  }
}

void Append(std::string* out, std::string_view text) {
  ReserveText(*out, text.size());
  out->append(text);
}

// "\n" and `indent` spaces `levels` times.
void AppendPadding(std::string* out, int indent, int levels) {
  const size_t spaces = static_cast<size_t>(std::max(0, indent)) * static_cast<size_t>(levels);
  ReserveText(*out, spaces + 1);
  out->push_back('\n');
  out->append(spaces, ' ');
}

void AppendJson(const Value& v, const JsonOptions& options, int depth, bool undefined_to_null, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kNull: return Append(out, "null");
    case Value::Kind::kUndefined: return Append(out, undefined_to_null ? "null" : "undefined");
    case Value::Kind::kBool: return Append(out, v.boolean() ? "true" : "false");
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return Append(out, std::isfinite(v.number()) ? JsNumberToString(v.number()) : "null");
    case Value::Kind::kString: return Append(out, JsonQuote(v.str(), options.ensure_ascii));
    case Value::Kind::kFunction: throw RenderError("cannot convert a function to JSON");
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: break;
  }
  // The reference's toJSON knows no TupleValue: a tuple does not print.
  if (v.is_tuple()) throw RenderError("cannot convert a tuple to JSON or text");
  if (depth > kMaxPrintDepth) {
    throw RenderError(fmt::format("tojson: a value nested deeper than {} levels", kMaxPrintDepth));
  }
  const bool indenting = options.indent.has_value() && *options.indent != 0;
  std::string_view item_sep = ", ", key_sep = ": ";
  if (options.separators) {
    item_sep = options.separators->first, key_sep = options.separators->second;
  } else if (indenting) {
    item_sep = ",";
  }
  const int indent = indenting ? *options.indent : 0;
  if (v.is_array()) {
    Append(out, "[");
    for (size_t i = 0; i < v.items().size(); ++i) {
      if (i > 0) Append(out, item_sep);
      if (indenting) AppendPadding(out, indent, depth + 1);
      AppendJson(v.items()[i], options, depth + 1, undefined_to_null, out);
    }
    if (indenting && !v.items().empty()) AppendPadding(out, indent, depth);
    return Append(out, "]");
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& entry : v.map().entries) entries.push_back(&entry);
  if (options.sort_keys) {
    // localeCompare on the keys; plain code point order stands in for the locale's.
    std::stable_sort(entries.begin(), entries.end(), [](auto* x, auto* y) { return x->first < y->first; });
  }
  Append(out, "{");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) Append(out, item_sep);
    if (indenting) AppendPadding(out, indent, depth + 1);
    Append(out, JsonQuote(entries[i]->first, options.ensure_ascii));
    Append(out, key_sep);
    AppendJson(entries[i]->second, options, depth + 1, undefined_to_null, out);
  }
  if (indenting && !entries.empty()) AppendPadding(out, indent, depth);
  Append(out, "}");
}

}  // namespace

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
        if (i > 0) Append(&out, ",");
        Append(&out, Display(v.items()[i]));
      }
      return out;
    }
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: return "[object Map]";
    default: return Display(v);
  }
}

std::string ToJson(const Value& v, const JsonOptions& options, int depth, bool undefined_to_null) {
  std::string out;
  AppendJson(v, options, depth, undefined_to_null, &out);
  return out;
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
  if (a.is_string() && b.is_string()) {
    CountWork(std::min(a.str().size(), b.str().size()));
    return a.str() == b.str();
  }
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
    case Value::Kind::kString:
      CountWork(std::min(a.str().size(), b.str().size()));
      return a.str() == b.str();
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
  CountWork(a.str().size() + b.str().size());
  // JavaScript compares UTF-16 code units; UTF-8 byte order agrees except across surrogates.
  std::string x = case_sensitive ? a.str() : AsciiLower(a.str());
  std::string y = case_sensitive ? b.str() : AsciiLower(b.str());
  return x < y ? -1 : x > y ? 1 : 0;
}

}  // namespace kvl::jinja
