// JSON -> jinja::Value, for callers that hold nlohmann::json or nlohmann::ordered_json (the
// server, tests). Header-only and templated on the JSON type, so kvl_jinja itself needs no JSON
// library. Use ordered_json where key order matters: a template that prints `tools | tojson`
// prints the keys in the order they arrive here.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvl/jinja_value.h"

namespace kvl::jinja {

// Numbers with an integral value become integers, as JavaScript's Number.isInteger decides
// for the reference renderer (so 2.0 in a request prints as "2", as there).
template <typename Json>
Value FromJson(const Json& j) {
  if (j.is_null()) return Value::Null();
  if (j.is_boolean()) return Value::Bool(j.template get<bool>());
  if (j.is_number_integer()) return Value::Int(static_cast<double>(j.template get<int64_t>()));
  if (j.is_number_unsigned()) return Value::Int(static_cast<double>(j.template get<uint64_t>()));
  if (j.is_number()) {
    const double v = j.template get<double>();
    return std::isfinite(v) && std::trunc(v) == v ? Value::Int(v) : Value::Float(v);
  }
  if (j.is_string()) return Value::String(j.template get<std::string>());
  if (j.is_array()) {
    std::vector<Value> items;
    items.reserve(j.size());
    for (const auto& item : j) items.push_back(FromJson(item));
    return Value::Array(std::move(items));
  }
  ValueMap map;
  for (auto it = j.begin(); it != j.end(); ++it) map.entries.emplace_back(it.key(), FromJson(it.value()));
  return Value::Object(std::move(map));
}

}  // namespace kvl::jinja
