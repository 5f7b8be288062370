// The values a Jinja template reads and computes: undefined, none, booleans, numbers, strings,
// lists, mappings, namespaces and functions, with the semantics of the reference renderer
// (@huggingface/jinja, which HF transformers' chat templates are checked against).
//
// Numbers are doubles, as in JavaScript, with a flag that says whether the value is an integer
// (IntegerValue) or a float (FloatValue): integer arithmetic, overflow and printing then match
// the reference digit for digit. Lists, mappings and namespaces are shared by reference (a copy
// of a Value names the same list), because templates compare and mutate them by identity
// (`{% set ns.x = ... %}`).
//
// Not thread-safe while a render mutates a namespace; a Value built by the caller and only read
// may be shared by concurrent renders.
//
// A list or mapping however deeply nested (a loop can wrap a list in a list 400k times) is freed
// without recursion, by the destructor of whichever Value lets go of it last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvl::jinja {

class Value;
class Callable;  // a macro or built-in function; private to the library

// A mapping in insertion order (templates print tools as JSON in the order the client sent).
struct ValueMap {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

class Value {
 public:
  enum class Kind {
    kUndefined,  // a name or key that does not exist; prints as nothing
    kNull,       // none
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,      // a list or a tuple
    kObject,     // a mapping
    kNamespace,  // namespace(...): a mutable record
    kFunction,
  };

  Value() = default;  // undefined
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value();
  static Value Null();
  static Value Bool(bool b);
  static Value Int(double v);  // an integer value held as a double, as the reference does
  static Value Float(double v);
  static Value String(std::string s);
  static Value Array(std::vector<Value> items = {});
  static Value Tuple(std::vector<Value> items);
  static Value Object(ValueMap map = {});
  static Value Namespace(ValueMap map = {});
  static Value Function(std::shared_ptr<const Callable> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_tuple() const { return kind_ == Kind::kArray && tuple_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool boolean() const { return number_ != 0; }
  double number() const { return number_; }
  const std::string& str() const { return *string_; }
  std::vector<Value>& items() const { return *array_; }  // kArray
  ValueMap& map() const { return *map_; }                // kObject, kNamespace
  const Callable& function() const { return *function_; }

  // The reference's type names ("StringValue", ...), used in error messages.
  std::string_view TypeName() const;
  // Python truthiness as the reference computes it (empty list and mapping are false).
  bool Truthy() const;
  // True when both name the same list, mapping, namespace or function.
  bool SameObject(const Value& other) const;

 private:
  // Where this is the last owner of its list, mapping or method receiver: moves the values in
  // it that own more onto *pending and empties it, so that freeing it recurses no further.
  void ReleaseChildren(std::vector<Value>* pending);

  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  double number_ = 0;  // kBool (0/1), kInt, kFloat
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<std::vector<Value>> array_;
  std::shared_ptr<ValueMap> map_;
  std::shared_ptr<const Callable> function_;
};

}  // namespace kvl::jinja
