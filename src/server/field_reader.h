// Reading one request object's optional fields with their types and ranges checked: each
// failure is an OpenAI error naming the field (its `param`).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "api_request.h"
#include "json_body.h"

namespace kvl::server {

inline ApiError BadField(std::string_view param, std::string message) {
  return ApiError{400, std::move(message), "invalid_request_error", std::string(param), ""};
}

// Reads optional fields of one JSON object; null counts as absent. Each getter returns false
// with `error` set when the field is present but of the wrong type or out of range.
class FieldReader {
 public:
  explicit FieldReader(const JsonValue& object) : object_(object) {}
  std::optional<ApiError> error;

  const JsonValue* Find(std::string_view key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool Number(std::string_view key, double lo, double hi, bool lo_open, double* out) {
    const JsonValue* v = Find(key);
    if (v == nullptr) return true;
    if (!v->is_number()) return Fail(key, fmt::format("'{}' must be a number", key));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      return Fail(key, fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[",
                                   lo, hi, DescribeValue(*v)));
    }
    *out = x;
    return true;
  }

  bool Integer(std::string_view key, int64_t lo, int64_t hi, int64_t* out) {
    const JsonValue* v = Find(key);
    if (v == nullptr) return true;
    if (!v->is_number_integer()) return Fail(key, fmt::format("'{}' must be an integer", key));
    bool in_range = false;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      in_range =
          hi >= 0 && u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo));
    } else {
      in_range = v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    }
    if (!in_range) {
      return Fail(key,
                  fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, DescribeValue(*v)));
    }
    *out = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
    return true;
  }

  bool Bool(std::string_view key, bool* out) {
    const JsonValue* v = Find(key);
    if (v == nullptr) return true;
    if (!v->is_boolean()) return Fail(key, fmt::format("'{}' must be a boolean", key));
    *out = v->get<bool>();
    return true;
  }

  bool Fail(std::string_view key, std::string message) {
    error = BadField(key, std::move(message));
    return false;
  }

 private:
  const JsonValue& object_;
};

}  // namespace kvl::server
