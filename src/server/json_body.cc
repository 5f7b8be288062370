#include "json_body.h"

#include <fmt/format.h>

namespace kvl::server {

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included, does not end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::optional<ApiError> ParseJsonBody(std::string_view body, JsonValue* doc) {
  const auto bad = [](std::string message) {
    return ApiError{400, std::move(message), "invalid_request_error", "", ""};
  };
  if (JsonNestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return bad(
        fmt::format("the JSON body nests arrays and objects deeper than {} levels", kMaxJsonDepth));
  }
  *doc = JsonValue::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc->is_discarded()) return bad("the request body is not valid JSON");
  if (!doc->is_object()) return bad("the request body must be a JSON object");
  return std::nullopt;
}

std::optional<JsonValue> ParseNestedJson(std::string_view text) {
  if (JsonNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) return std::nullopt;
  JsonValue value = JsonValue::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

namespace {

// Where to cut `text` to at most `max_bytes`: back to the start of a UTF-8 character
// (continuation bytes are 10xxxxxx).
size_t CutAt(std::string_view text, size_t max_bytes) {
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

}  // namespace

std::string Truncated(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return fmt::format("{}... ({} bytes)", text.substr(0, CutAt(text, max_bytes)), text.size());
}

std::string BoundedQuote(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return fmt::format("\"{}\"", text);
  return fmt::format("\"{}...\" ({} bytes)", text.substr(0, CutAt(text, max_bytes)), text.size());
}

std::string DescribeValue(const JsonValue& value) {
  if (value.is_string()) return BoundedQuote(value.get_ref<const std::string&>());
  if (value.is_array()) return fmt::format("an array of {} elements", value.size());
  if (value.is_object()) return fmt::format("an object of {} fields", value.size());
  // A number, a boolean or null prints in a few bytes (a double in at most ~25).
  return value.dump(-1, ' ', false, JsonValue::error_handler_t::replace);
}

}  // namespace kvl::server
