// A small JSON Schema validator for the keywords the converter supports, written from the
// specification (draft 2020-12, with draft 4's boolean exclusive bounds), to check constrained
// outputs independently of the grammar that produced them.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace kvl::testing {

class SchemaChecker {
 public:
  explicit SchemaChecker(const nlohmann::json& root) : root_(root) {}

  // Empty when `value` is valid, else why not (the first failure found).
  std::string Check(const nlohmann::json& value) const { return Check(root_, value, "$"); }

 private:
  using json = nlohmann::json;

  static size_t CodePoints(const std::string& s) {
    size_t n = 0;
    for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
  }

  // UTF-8 as code points, for std::wregex (wchar_t holds a code point on Linux): std::regex on
  // bytes would see a multi-byte character as several.
  static std::wstring Wide(const std::string& s) {
    std::wstring out;
    for (size_t i = 0; i < s.size();) {
      const auto b = static_cast<unsigned char>(s[i]);
      const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      uint32_t cp = n == 1 ? b : b & (0x7F >> n);
      for (int k = 1; k < n && i + static_cast<size_t>(k) < s.size(); ++k) {
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
      }
      out.push_back(static_cast<wchar_t>(cp));
      i += static_cast<size_t>(n);
    }
    return out;
  }
  static bool Search(const std::string& text, const std::string& pattern) {
    return std::regex_search(Wide(text), std::wregex(Wide(pattern), std::regex::ECMAScript));
  }

  static bool HasType(const json& v, const std::string& type) {
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "number") return v.is_number();
    if (type == "integer") {
      return v.is_number_integer() ||
             (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    }
    return false;
  }

  std::string Check(const json& s, const json& v, const std::string& at) const {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"];
      return Check(root_.at(json::json_pointer(ref.substr(1))), v, at);
    }
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string()) {
        ok = HasType(v, s["type"]);
      } else {
        for (const json& t : s["type"]) ok = ok || HasType(v, t);
      }
      if (!ok) return at + ": not of type " + s["type"].dump();
    }
    if (s.contains("const") && s["const"] != v) return at + ": not the const";
    if (s.contains("enum")) {
      bool found = false;
      for (const json& e : s["enum"]) found = found || e == v;
      if (!found) return at + ": not in the enum";
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const json& alts = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
      int matched = 0;
      for (const json& alt : alts) matched += Check(alt, v, at).empty();
      if (matched == 0) return at + ": matches no alternative";
      if (s.contains("oneOf") && matched > 1) return at + ": matches several oneOf alternatives";
    }
    if (s.contains("allOf")) {
      for (const json& part : s["allOf"]) {
        if (std::string e = Check(part, v, at); !e.empty()) return e;
      }
    }
    if (v.is_object()) {
      for (const json& r : s.value("required", json::array())) {
        if (!v.contains(r.get<std::string>())) return at + ": missing " + r.dump();
      }
      const json props = s.value("properties", json::object());
      for (const auto& [key, item] : v.items()) {
        if (props.contains(key)) {
          if (std::string e = Check(props[key], item, at + "." + key); !e.empty()) return e;
        } else if (s.contains("additionalProperties")) {
          if (std::string e = Check(s["additionalProperties"], item, at + "." + key); !e.empty()) {
            return e;
          }
        }
      }
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many";
      size_t first = 0;
      const json* tuple = s.contains("prefixItems") ? &s["prefixItems"]
                          : (s.contains("items") && s["items"].is_array()) ? &s["items"]
                                                                           : nullptr;
      if (tuple != nullptr) {
        for (; first < tuple->size() && first < v.size(); ++first) {
          if (std::string e = Check((*tuple)[first], v[first], at + "[" + std::to_string(first) + "]");
              !e.empty()) {
            return e;
          }
        }
      }
      if (s.contains("items") && !s["items"].is_array()) {
        for (size_t i = first; i < v.size(); ++i) {
          if (std::string e = Check(s["items"], v[i], at + "[" + std::to_string(i) + "]");
              !e.empty()) {
            return e;
          }
        }
      }
    }
    if (v.is_string()) {
      const std::string& str = v.get_ref<const std::string&>();
      if (s.contains("minLength") && CodePoints(str) < s["minLength"].get<size_t>()) {
        return at + ": shorter than minLength";
      }
      if (s.contains("maxLength") && CodePoints(str) > s["maxLength"].get<size_t>()) {
        return at + ": longer than maxLength";
      }
      if (s.contains("pattern") && !Search(str, s["pattern"].get<std::string>())) {
        return at + ": does not match the pattern";
      }
      if (s.contains("format")) {
        static const std::map<std::string, std::string> kFormats = {
            {"date", R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$)"},
            {"time", R"(^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|z|[+-]([01]\d|2[0-3]):[0-5]\d)$)"},
            {"date-time",
             R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|z|[+-]([01]\d|2[0-3]):[0-5]\d)$)"},
            {"uuid", R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
        };
        auto it = kFormats.find(s["format"].get<std::string>());
        if (it != kFormats.end() && !Search(str, it->second)) {
          return at + ": not a " + it->first;
        }
      }
    }
    if (v.is_number()) {
      const double d = v.get<double>();
      const bool draft4_min = s.value("exclusiveMinimum", json()) == true;
      const bool draft4_max = s.value("exclusiveMaximum", json()) == true;
      if (s.contains("minimum") && (draft4_min ? d <= s["minimum"].get<double>()
                                               : d < s["minimum"].get<double>())) {
        return at + ": below minimum";
      }
      if (s.contains("maximum") && (draft4_max ? d >= s["maximum"].get<double>()
                                               : d > s["maximum"].get<double>())) {
        return at + ": above maximum";
      }
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() &&
          d <= s["exclusiveMinimum"].get<double>()) {
        return at + ": not above exclusiveMinimum";
      }
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() &&
          d >= s["exclusiveMaximum"].get<double>()) {
        return at + ": not below exclusiveMaximum";
      }
    }
    return "";
  }

  const json& root_;
};

}  // namespace kvl::testing
