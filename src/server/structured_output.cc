// Structured output: see structured_output.h.
#include "structured_output.h"

#include <fmt/format.h>

#include "kvl/grammar.h"
#include "kvl/json_schema_grammar.h"

namespace kvl::server {
namespace {

using json = nlohmann::ordered_json;

ApiError Bad(std::string_view param, std::string message) {
  return ApiError{400, std::move(message), "invalid_request_error", std::string(param), ""};
}

// The grammar of response_format, or none for text.
std::optional<ApiError> ReadResponseFormat(const json& format, std::string* gbnf) {
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string()) {
    return Bad("response_format", "'response_format' must be an object with a 'type'");
  }
  const std::string type = format["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    // llama-server also takes a schema here.
    if (format.contains("schema") && !format["schema"].is_null()) {
      StatusOr<std::string> converted = JsonSchemaToGbnf(format["schema"]);
      if (!converted.ok()) return Bad("response_format", converted.status().message());
      *gbnf = std::move(*converted);
    } else {
      *gbnf = JsonObjectGbnf();
    }
    return std::nullopt;
  }
  if (type == "json_schema") {
    const json* spec = format.contains("json_schema") ? &format["json_schema"] : nullptr;
    if (spec == nullptr || !spec->is_object() || !spec->contains("schema")) {
      return Bad("response_format",
                 "'response_format' of type json_schema needs 'json_schema': {\"schema\": ...}");
    }
    // strict: the grammar is always enforced, so strict or not the reply follows the schema.
    if (spec->contains("strict") && !(*spec)["strict"].is_boolean() &&
        !(*spec)["strict"].is_null()) {
      return Bad("response_format", "'json_schema.strict' must be a boolean");
    }
    StatusOr<std::string> converted = JsonSchemaToGbnf((*spec)["schema"]);
    if (!converted.ok()) return Bad("response_format", converted.status().message());
    *gbnf = std::move(*converted);
    return std::nullopt;
  }
  return Bad("response_format",
             fmt::format("'response_format' type '{}' is not one of text, json_object, "
                         "json_schema",
                         type));
}

}  // namespace

std::optional<ApiError> ReadStructuredOutput(const json& body, Request* request) {
  std::string gbnf;
  const char* source = nullptr;  // the field the grammar came from
  auto claim = [&](const char* field) -> std::optional<ApiError> {
    if (source != nullptr) {
      return Bad(field, fmt::format("'{}' and '{}' both constrain the reply; send one", source,
                                    field));
    }
    source = field;
    return std::nullopt;
  };
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    if (auto e = ReadResponseFormat(body["response_format"], &gbnf)) return e;
    if (!gbnf.empty()) source = "response_format";
  }
  if (body.contains("json_schema") && !body["json_schema"].is_null()) {
    if (auto e = claim("json_schema")) return e;
    StatusOr<std::string> converted = JsonSchemaToGbnf(body["json_schema"]);
    if (!converted.ok()) return Bad("json_schema", converted.status().message());
    gbnf = std::move(*converted);
  }
  if (body.contains("grammar") && !body["grammar"].is_null() && body["grammar"] != "") {
    if (auto e = claim("grammar")) return e;
    if (!body["grammar"].is_string()) return Bad("grammar", "'grammar' must be a GBNF string");
    gbnf = body["grammar"].get<std::string>();
  }
  if (source == nullptr) return std::nullopt;
  // Checked here so that the error names the field; the engine compiles it again at Submit.
  if (StatusOr<std::shared_ptr<const Grammar>> parsed = ParseGbnf(gbnf); !parsed.ok()) {
    return Bad(source, parsed.status().message());
  }
  request->grammar = std::move(gbnf);
  return std::nullopt;
}

}  // namespace kvl::server
