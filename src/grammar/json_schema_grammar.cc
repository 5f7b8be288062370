// JSON schema -> GBNF, following llama.cpp's json-schema-to-grammar (its primitive rules, its
// object and repetition constructions, its whitespace and number bounds), written as a visitor
// that fails with the keyword it cannot honour.
#include "kvl/json_schema_grammar.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "json_schema_parts.h"

namespace kvl {
namespace {

using json = nlohmann::ordered_json;
using json_schema::GbnfLiteral;

// At most two line breaks and 20 spaces or tabs between tokens: a model cannot stall in
// whitespace (llama.cpp's SPACE_RULE).
constexpr const char* kSpaceRule = R"(| " " | "\n"{1,2} [ \t]{0,20})";

struct Primitive {
  const char* name;
  const char* body;
  std::vector<const char*> deps;
};

const std::vector<Primitive>& Primitives() {
  static const std::vector<Primitive> kPrimitives = {
      {"boolean", R"(("true" | "false") space)", {}},
      {"decimal-part", "[0-9]{1,16}", {}},
      {"integral-part", "[0] | [1-9] [0-9]{0,15}", {}},
      // The exponent has at most two digits (llama.cpp allows 16): 1e400 is valid JSON text but
      // overflows a double, and strict parsers (nlohmann's) refuse it.
      {"number", R"(("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})? space)",
       {"integral-part", "decimal-part"}},
      {"nonnegative-number", R"((integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})? space)",
       {"integral-part", "decimal-part"}},
      {"integer", R"(("-"? integral-part) space)", {"integral-part"}},
      {"value", "object | array | string | number | boolean | null",
       {"object", "array", "string", "number", "boolean", "null"}},
      {"object",
       R"("{" space ( string ":" space value ("," space string ":" space value)* )? "}" space)",
       {"string", "value"}},
      {"array", R"("[" space ( value ("," space value)* )? "]" space)", {"value"}},
      {"uuid",
       R"("\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space)",
       {}},
      // \u escapes never name a surrogate: strict parsers (nlohmann's, Python's with
      // surrogatepass off) refuse a lone one, and a model cannot be trusted to pair them.
      {"char",
       R"([^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2})))",
       {}},
      {"string", R"("\"" char* "\"" space)", {"char"}},
      {"null", R"("null" space)", {}},
      {"date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] ))",
       {}},
      {"time",
       R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
       {}},
      {"date-time", R"(date "T" time)", {"date", "time"}},
      {"date-string", R"("\"" date "\"" space)", {"date"}},
      {"time-string", R"("\"" time "\"" space)", {"time"}},
      {"date-time-string", R"("\"" date-time "\"" space)", {"date-time"}},
  };
  return kPrimitives;
}

// Keywords whose meaning a grammar here cannot carry: refused by name.
constexpr const char* kUnsupportedKeywords[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "minProperties", "maxProperties", "contains",
    "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "multipleOf",
    "$dynamicRef", "$recursiveRef"};

std::string SanitizeName(std::string_view name) {
  std::string out;
  for (const char c : name) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out.push_back(word ? c : '-');
  }
  return out.empty() ? "r" : out;
}

class SchemaConverter {
 public:
  explicit SchemaConverter(const json& root) : root_(root) {}

  StatusOr<std::string> Convert() {
    rules_["space"] = kSpaceRule;
    const std::string name = Visit(root_, "root");
    if (!error_.ok()) return error_;
    if (name != "root") rules_["root"] = name;
    std::string out = "root ::= " + rules_["root"] + "\n";
    for (const auto& [rule, body] : rules_) {
      if (rule != "root") out += rule + " ::= " + body + "\n";
    }
    return out;
  }

  // The rules any JSON object needs, root being an object.
  std::string JsonObject() {
    rules_["space"] = kSpaceRule;
    rules_["root"] = AddPrimitive("object");
    std::string out = "root ::= " + rules_["root"] + "\n";
    for (const auto& [rule, body] : rules_) {
      if (rule != "root") out += rule + " ::= " + body + "\n";
    }
    return out;
  }

 private:
  // Records the first error; the visit unwinds returning empty names.
  std::string Fail(std::string_view keyword, std::string_view message) {
    if (error_.ok()) {
      error_ = InvalidArgumentError(
          fmt::format("json_schema: '{}' at {}: {}", keyword, Path(), message));
    }
    return "";
  }
  std::string Path() const {
    std::string path = "#";
    for (const std::string& p : path_) path += "/" + p;
    return path;
  }

  bool IsReserved(const std::string& name) const {
    if (name == "root" || name == "space") return false;
    for (const Primitive& p : Primitives()) {
      if (name == p.name) return true;
    }
    return false;
  }

  // Adds `name ::= body` under a name not taken by another body; returns the name used.
  std::string AddRule(const std::string& wanted, const std::string& body) {
    std::string name = SanitizeName(wanted);
    if (IsReserved(name)) name += "-";
    for (int i = 1;; ++i) {
      const std::string candidate = i == 1 ? name : fmt::format("{}{}", name, i);
      auto it = rules_.find(candidate);
      // A body starting with \x01 holds the name for a $ref being visited (VisitRef).
      if (it == rules_.end() || it->second == body ||
          (i == 1 && !it->second.empty() && it->second[0] == '\x01')) {
        rules_[candidate] = body;
        return candidate;
      }
    }
  }

  std::string AddPrimitive(const std::string& name) {
    for (const Primitive& p : Primitives()) {
      if (name != p.name) continue;
      if (rules_.count(name) == 0) {
        rules_[name] = p.body;
        for (const char* dep : p.deps) AddPrimitive(dep);
      }
      return name;
    }
    return Fail("type", fmt::format("no primitive rule '{}'", name));
  }

  std::string Visit(const json& schema, const std::string& name);
  std::string VisitRef(const std::string& ref, const std::string& name);
  std::string VisitTyped(const json& schema, const std::string& type, const std::string& name);
  std::string BuildObject(const json& schema, const std::string& name);
  std::string BuildArray(const json& schema, const std::string& name);
  std::string BuildString(const json& schema, const std::string& name);
  std::string BuildInteger(const json& schema, const std::string& name);
  std::string BuildNumber(const json& schema, const std::string& name);
  std::string NotStrings(const std::vector<std::string>& keys);
  std::optional<uint64_t> Count(const json& schema, const char* keyword);

  const json& root_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> ref_rules_;  // $ref -> its rule's name
  std::vector<std::string> path_;                 // where in the schema the visit is
  Status error_;
};

// llama.cpp's _build_repetition: item (separator item){min-1,max-1}, optional as a whole when
// min is 0.
std::string Repetition(const std::string& item, uint64_t min, std::optional<uint64_t> max,
                       const std::string& separator) {
  if (max && *max == 0) return "";
  if (min == 0 && max && *max == 1) return item + "?";
  if (separator.empty()) {
    if (min == 1 && !max) return item + "+";
    if (min == 0 && !max) return item + "*";
    return fmt::format("{}{{{},{}}}", item, min, max ? std::to_string(*max) : "");
  }
  const std::string rest =
      Repetition("(" + separator + " " + item + ")", min > 0 ? min - 1 : 0,
                 max ? std::optional<uint64_t>(*max - 1) : std::nullopt, "");
  const std::string result = item + (rest.empty() ? "" : " " + rest);
  return min == 0 ? "(" + result + ")?" : result;
}

std::string SchemaConverter::Visit(const json& schema, const std::string& name) {
  if (!error_.ok()) return "";
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) return Fail("false", "the schema false accepts no value");
    return AddRule(name, AddPrimitive("value"));
  }
  if (!schema.is_object()) return Fail("", "a schema must be an object or a boolean");
  for (const char* keyword : kUnsupportedKeywords) {
    if (schema.contains(keyword)) return Fail(keyword, "this keyword is not supported");
  }
  if (schema.contains("uniqueItems") && schema["uniqueItems"] == true) {
    return Fail("uniqueItems", "unique items cannot be enforced by a grammar");
  }
  if (schema.contains("$ref")) {
    if (!schema["$ref"].is_string()) return Fail("$ref", "must be a string");
    return VisitRef(schema["$ref"].get<std::string>(), name);
  }
  for (const char* keyword : {"anyOf", "oneOf"}) {
    if (!schema.contains(keyword)) continue;
    const json& alts = schema[keyword];
    if (!alts.is_array() || alts.empty()) return Fail(keyword, "must be a non-empty array");
    std::string body;
    path_.push_back(keyword);
    for (size_t i = 0; i < alts.size(); ++i) {
      path_.push_back(std::to_string(i));
      const std::string alt = Visit(alts[i], fmt::format("{}-{}", name, i));
      path_.pop_back();
      if (!error_.ok()) return "";
      body += (body.empty() ? "" : " | ") + alt;
    }
    path_.pop_back();
    return AddRule(name, body);
  }
  if (schema.contains("allOf")) {
    // Object schemas merged (properties and required united); a single schema as itself.
    const json& parts = schema["allOf"];
    if (!parts.is_array() || parts.empty()) return Fail("allOf", "must be a non-empty array");
    json merged = schema;
    merged.erase("allOf");
    for (json part : parts) {
      if (part.is_object() && part.contains("$ref") && part["$ref"].is_string()) {
        const std::string ref = part["$ref"].get<std::string>();
        if (ref.empty() || ref[0] != '#') return Fail("allOf", "a $ref in allOf must be local");
        try {
          part = root_.at(json::json_pointer(ref.substr(1)));
        } catch (const json::exception&) {
          return Fail("$ref", fmt::format("'{}' names nothing in this schema", ref));
        }
      }
      if (!part.is_object()) return Fail("allOf", "its schemas must be objects");
      for (const auto& [key, value] : part.items()) {
        if (key == "properties" && value.is_object()) {
          for (const auto& [prop, sub] : value.items()) merged["properties"][prop] = sub;
        } else if (key == "required" && value.is_array()) {
          for (const json& r : value) merged["required"].push_back(r);
        } else if (key == "allOf" || key == "anyOf" || key == "oneOf" || key == "$ref") {
          return Fail("allOf", fmt::format("'{}' inside allOf is not supported", key));
        } else if (merged.contains(key) && merged[key] != value) {
          return Fail("allOf", fmt::format("its schemas disagree on '{}'", key));
        } else {
          merged[key] = value;
        }
      }
    }
    return Visit(merged, name);
  }
  if (schema.contains("const")) {
    return AddRule(name, GbnfLiteral(schema["const"].dump()) + " space");
  }
  if (schema.contains("enum")) {
    const json& values = schema["enum"];
    if (!values.is_array() || values.empty()) return Fail("enum", "must be a non-empty array");
    std::string body;
    for (const json& v : values) body += (body.empty() ? "" : " | ") + GbnfLiteral(v.dump());
    return AddRule(name, "(" + body + ") space");
  }
  if (schema.contains("type")) {
    const json& type = schema["type"];
    if (type.is_string()) return VisitTyped(schema, type.get<std::string>(), name);
    if (!type.is_array() || type.empty()) {
      return Fail("type", "must be a type name or a non-empty list of them");
    }
    std::string body;
    for (const json& t : type) {
      if (!t.is_string()) return Fail("type", "must list type names");
      const std::string alt = VisitTyped(schema, t.get<std::string>(),
                                         name + "-" + t.get<std::string>());
      if (!error_.ok()) return "";
      body += (body.empty() ? "" : " | ") + alt;
    }
    return AddRule(name, body);
  }
  // No type: what the keywords imply, else any value.
  if (schema.contains("properties") || schema.contains("additionalProperties") ||
      schema.contains("required")) {
    return VisitTyped(schema, "object", name);
  }
  if (schema.contains("items") || schema.contains("prefixItems") ||
      schema.contains("minItems") || schema.contains("maxItems")) {
    return VisitTyped(schema, "array", name);
  }
  if (schema.contains("pattern") || schema.contains("minLength") ||
      schema.contains("maxLength") || schema.contains("format")) {
    return VisitTyped(schema, "string", name);
  }
  return AddRule(name, AddPrimitive("value"));
}

std::string SchemaConverter::VisitRef(const std::string& ref, const std::string& name) {
  if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
  if (ref.empty() || ref[0] != '#') {
    return Fail("$ref", fmt::format("'{}' is not a local reference (only '#...' is)", ref));
  }
  const json* target = nullptr;
  try {
    target = &root_.at(json::json_pointer(ref.substr(1)));
  } catch (const json::exception&) {
    return Fail("$ref", fmt::format("'{}' names nothing in this schema", ref));
  }
  // The rule's name is fixed before its body is visited, so that a recursive reference inside
  // it refers to the rule being written.
  const size_t slash = ref.find_last_of('/');
  std::string rule = AddRule("ref-" + (slash == std::string::npos ? std::string("root")
                                                                  : ref.substr(slash + 1)),
                             "\x01" + ref);  // a placeholder body no other rule has
  ref_rules_[ref] = rule;
  path_.push_back("$ref");
  const std::string visited = Visit(*target, rule);
  path_.pop_back();
  if (!error_.ok()) return "";
  if (visited != rule) rules_[rule] = visited;
  return rule;
}

std::string SchemaConverter::VisitTyped(const json& schema, const std::string& type,
                                        const std::string& name) {
  if (type == "object") {
    if (schema.contains("properties") || schema.contains("required") ||
        (schema.contains("additionalProperties") && schema["additionalProperties"] != true)) {
      return BuildObject(schema, name);
    }
    return AddRule(name, AddPrimitive("object"));
  }
  if (type == "array") return BuildArray(schema, name);
  if (type == "string") return BuildString(schema, name);
  if (type == "integer") return BuildInteger(schema, name);
  if (type == "number") return BuildNumber(schema, name);
  if (type == "boolean" || type == "null") return AddRule(name, AddPrimitive(type));
  return Fail("type", fmt::format("unknown type '{}'", type));
}

// The strings that are none of `keys` (an object's other property names), llama.cpp's
// _not_strings: a trie of the keys, each branch either leaving the trie or going past a key's
// end.
std::string SchemaConverter::NotStrings(const std::vector<std::string>& keys) {
  struct Node {
    std::map<std::string, Node> children;  // by one JSON-encoded character
    bool end = false;
  };
  Node trie;
  for (const std::string& key : keys) {
    const std::string encoded = json(key).dump();  // with its escapes, between quotes
    Node* node = &trie;
    for (size_t i = 1; i + 1 < encoded.size();) {
      const auto b = static_cast<unsigned char>(encoded[i]);
      size_t length = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      if (b == '\\') length = encoded[i + 1] == 'u' ? 6 : 2;
      node = &node->children[encoded.substr(i, length)];
      i += length;
    }
    node->end = true;
  }
  const std::string char_rule = AddPrimitive("char");
  std::string out = R"("\"" ( )";
  const std::function<void(const Node&)> visit = [&](const Node& node) {
    std::string rejects;
    bool first = true;
    for (const auto& [c, child] : node.children) {
      if (!first) out += " | ";
      first = false;
      out += GbnfLiteral(c);
      if (c.size() == 1) rejects += c == "\\" || c == "]" || c == "-" || c == "^" ? "\\" + c : c;
      if (!child.children.empty()) {
        out += " (";
        visit(child);
        out += ")";
      } else if (child.end) {
        out += " " + char_rule + "+";
      }
    }
    if (!first) out += " | ";
    // A first character none of the keys continues with (never a raw backslash or control).
    out += "[^\"\\\\\\x00-\\x1F" + rejects + "] " + char_rule + "*";
  };
  visit(trie);
  out += std::string(" )") + (trie.end ? "" : "?") + R"( "\"" space)";
  return out;
}

std::string SchemaConverter::BuildObject(const json& schema, const std::string& name) {
  static const json kEmptyObject = json::object();
  const json& props = schema.contains("properties") ? schema["properties"] : kEmptyObject;
  if (!props.is_object()) return Fail("properties", "must be an object");
  std::set<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) return Fail("required", "must be an array of names");
    for (const json& r : schema["required"]) {
      if (!r.is_string()) return Fail("required", "must be an array of names");
      required.insert(r.get<std::string>());
    }
  }
  // Every property: a key-value rule. A required name with no schema takes any value.
  std::map<std::string, std::string> kv_rules;
  std::vector<std::string> required_keys, optional_keys;
  path_.push_back("properties");
  for (const auto& [key, sub] : props.items()) {
    path_.push_back(key);
    const std::string value = Visit(sub, name + "-" + key);
    path_.pop_back();
    if (!error_.ok()) return "";
    kv_rules[key] = AddRule(name + "-" + key + "-kv",
                            GbnfLiteral(json(key).dump()) + R"( space ":" space )" + value);
    (required.count(key) ? required_keys : optional_keys).push_back(key);
  }
  path_.pop_back();
  for (const std::string& key : required) {
    if (props.contains(key)) continue;
    kv_rules[key] = AddRule(name + "-" + key + "-kv", GbnfLiteral(json(key).dump()) +
                                                          R"( space ":" space )" +
                                                          AddPrimitive("value"));
    required_keys.push_back(key);
  }
  if (schema.contains("additionalProperties")) {
    const json& additional = schema["additionalProperties"];
    if (!additional.is_boolean() && !additional.is_object()) {
      return Fail("additionalProperties", "must be a boolean or a schema");
    }
    if (additional != false) {
      path_.push_back("additionalProperties");
      const std::string value = additional == true ? AddPrimitive("value")
                                                   : Visit(additional, name + "-additional-value");
      path_.pop_back();
      if (!error_.ok()) return "";
      std::vector<std::string> declared;
      for (const auto& [key, unused] : kv_rules) declared.push_back(key);
      const std::string key_rule =
          declared.empty() ? AddPrimitive("string")
                           : AddRule(name + "-additional-k", NotStrings(declared));
      kv_rules["*"] = AddRule(name + "-additional-kv", key_rule + R"( ":" space )" + value);
      optional_keys.push_back("*");
    }
  }
  // Required properties in order, then any run of the optional ones in their order (each
  // optional chain a rule of its own so that the grammar stays linear in their number).
  std::string body = R"("{" space )";
  for (size_t i = 0; i < required_keys.size(); ++i) {
    body += (i > 0 ? R"( "," space )" : "") + kv_rules[required_keys[i]];
  }
  if (!optional_keys.empty()) {
    body += " (";
    if (!required_keys.empty()) body += R"( "," space ( )";
    std::function<std::string(size_t, bool)> chain = [&](size_t from,
                                                         bool first_is_optional) -> std::string {
      const std::string& key = optional_keys[from];
      const std::string& kv = kv_rules[key];
      const std::string comma_ref = R"(( "," space )" + kv + " )";
      std::string res = first_is_optional
                            ? comma_ref + (key == "*" ? "*" : "?")
                            : kv + (key == "*" ? " " + comma_ref + "*" : "");
      if (from + 1 < optional_keys.size()) {
        res += " " + AddRule(name + "-" + SanitizeName(key) + "-rest", chain(from + 1, true));
      }
      return res;
    };
    for (size_t i = 0; i < optional_keys.size(); ++i) {
      body += (i > 0 ? " | " : "") + chain(i, false);
    }
    if (!required_keys.empty()) body += " )";
    body += " )?";
  }
  body += R"( "}" space)";
  return AddRule(name, body);
}

std::optional<uint64_t> SchemaConverter::Count(const json& schema, const char* keyword) {
  if (!schema.contains(keyword)) return std::nullopt;
  const json& v = schema[keyword];
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    Fail(keyword, "must be a non-negative integer");
    return std::nullopt;
  }
  constexpr uint64_t kMaxCount = 10000;  // what a grammar may expand to stays bounded
  if (v.get<uint64_t>() > kMaxCount) {
    Fail(keyword, fmt::format("at most {} is supported", kMaxCount));
    return std::nullopt;
  }
  return v.get<uint64_t>();
}

std::string SchemaConverter::BuildArray(const json& schema, const std::string& name) {
  const std::optional<uint64_t> min = Count(schema, "minItems");
  const std::optional<uint64_t> max = Count(schema, "maxItems");
  if (!error_.ok()) return "";
  const json* tuple = nullptr;
  if (schema.contains("prefixItems")) {
    tuple = &schema["prefixItems"];
    if (schema.contains("items") && schema["items"] != false) {
      return Fail("items", "items beside prefixItems is not supported (only items: false)");
    }
  } else if (schema.contains("items") && schema["items"].is_array()) {
    tuple = &schema["items"];
  }
  if (tuple != nullptr) {
    if (!tuple->is_array()) return Fail("prefixItems", "must be an array of schemas");
    std::string body = R"("[" space )";
    path_.push_back("prefixItems");
    for (size_t i = 0; i < tuple->size(); ++i) {
      path_.push_back(std::to_string(i));
      const std::string item = Visit((*tuple)[i], fmt::format("{}-tuple-{}", name, i));
      path_.pop_back();
      if (!error_.ok()) return "";
      body += (i > 0 ? R"( "," space )" : "") + item;
    }
    path_.pop_back();
    if ((min && *min > tuple->size()) || (max && *max < tuple->size())) {
      return Fail("minItems", "the tuple's length is outside minItems..maxItems");
    }
    return AddRule(name, body + R"( "]" space)");
  }
  if (min && max && *min > *max) return Fail("minItems", "minItems is above maxItems");
  std::string item;
  if (schema.contains("items")) {
    path_.push_back("items");
    item = Visit(schema["items"], name + "-item");
    path_.pop_back();
    if (!error_.ok()) return "";
  } else {
    item = AddPrimitive("value");
  }
  const std::string list = Repetition(item, min.value_or(0), max, R"("," space)");
  return AddRule(name, R"("[" space )" + (list.empty() ? "" : list + " ") + R"("]" space)");
}

std::string SchemaConverter::BuildString(const json& schema, const std::string& name) {
  const std::optional<uint64_t> min = Count(schema, "minLength");
  const std::optional<uint64_t> max = Count(schema, "maxLength");
  if (!error_.ok()) return "";
  if (min && max && *min > *max) return Fail("minLength", "minLength is above maxLength");
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) return Fail("pattern", "must be a string");
    if (min || max) return Fail("pattern", "a pattern with minLength or maxLength");
    StatusOr<std::string> body =
        json_schema::RegexToGbnf(schema["pattern"].get<std::string>(), AddPrimitive("char"));
    if (!body.ok()) return Fail("pattern", body.status().message());
    return AddRule(name, R"("\"" )" + *body + R"( "\"" space)");
  }
  if (schema.contains("format") && schema["format"].is_string()) {
    const std::string format = schema["format"].get<std::string>();
    if (format == "uuid") return AddRule(name, AddPrimitive("uuid"));
    if (format == "date" || format == "time" || format == "date-time") {
      if (min || max) return Fail("format", "a format with minLength or maxLength");
      return AddRule(name, AddPrimitive(format + "-string"));
    }
    // Other formats (email, uri, ...) are annotations, as JSON Schema's default treats them.
  }
  if (!min && !max) return AddRule(name, AddPrimitive("string"));
  const std::string chars = Repetition(AddPrimitive("char"), min.value_or(0), max, "");
  return AddRule(name, R"("\"" )" + (chars.empty() ? "" : chars + " ") + R"("\"" space)");
}

std::string SchemaConverter::BuildInteger(const json& schema, const std::string& name) {
  std::optional<int64_t> lo, hi;
  // A bound as an integer: minimum rounds up, maximum down; an exclusive one moves past itself.
  auto read = [&](const char* keyword, bool lower, bool exclusive) -> bool {
    if (!schema.contains(keyword)) return true;
    const json& v = schema[keyword];
    if (v.is_boolean()) return true;  // draft 4's exclusive flags: read with minimum/maximum
    if (!v.is_number()) return Fail(keyword, "must be a number"), false;
    const double d = v.get<double>();
    if (!(std::fabs(d) < 9.0e15)) return Fail(keyword, "must be within +-9e15"), false;
    double bound = lower ? std::ceil(d) : std::floor(d);
    if (exclusive && bound == d) bound += lower ? 1 : -1;
    const auto b = static_cast<int64_t>(bound);
    std::optional<int64_t>& side = lower ? lo : hi;
    side = side ? (lower ? std::max(*side, b) : std::min(*side, b)) : b;
    return true;
  };
  const bool draft4_min = schema.value("exclusiveMinimum", json()) == true;
  const bool draft4_max = schema.value("exclusiveMaximum", json()) == true;
  if (!read("minimum", true, draft4_min) || !read("maximum", false, draft4_max) ||
      !read("exclusiveMinimum", true, true) || !read("exclusiveMaximum", false, true)) {
    return "";
  }
  if (!lo && !hi) return AddRule(name, AddPrimitive("integer"));
  const std::string range = json_schema::IntegerRangeGbnf(lo, hi);
  if (range.empty()) return Fail("minimum", "no integer lies between minimum and maximum");
  return AddRule(name, range + " space");
}

std::string SchemaConverter::BuildNumber(const json& schema, const std::string& name) {
  for (const char* keyword : {"maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (schema.contains(keyword)) {
      return Fail(keyword, "bounds on a non-integer number are not supported (only minimum 0)");
    }
  }
  if (schema.contains("minimum")) {
    if (schema["minimum"] != 0) {
      return Fail("minimum", "bounds on a non-integer number are not supported (only 0)");
    }
    return AddRule(name, AddPrimitive("nonnegative-number"));
  }
  return AddRule(name, AddPrimitive("number"));
}

}  // namespace

StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema) {
  try {
    return SchemaConverter(schema).Convert();
  } catch (const nlohmann::json::exception& e) {
    // (A string that is not UTF-8 cannot be dumped into a literal, for one.)
    return InvalidArgumentError(fmt::format("json_schema: {}", e.what()));
  }
}

StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::json& schema) {
  return JsonSchemaToGbnf(nlohmann::ordered_json(schema));
}

std::string JsonObjectGbnf() {
  static const json kEmpty;
  return SchemaConverter(kEmpty).JsonObject();
}

}  // namespace kvl
