// The one door every JSON text a client sends comes in by: request bodies of every route and the
// JSON nested inside them (a tool call's `arguments` string). Nesting is bounded before any value
// is built, so that nothing downstream that walks a value recursively (printing it, converting
// it for a chat template, comparing it) can run out of stack on a hostile body; the body's size
// is bounded before it gets here, by the transport (--max-body, 413). Error texts quote what a
// client sent only through BoundedQuote / DescribeValue, which never print more than a snippet.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "api_request.h"

namespace kvl::server {

// Ordered: a chat template that prints the tools or a tool call's arguments as JSON prints their
// keys in the order the client sent them, as the reference renderer does.
using JsonValue = nlohmann::ordered_json;

// Arrays and objects nested deeper than this are refused before parsing: no request needs it.
inline constexpr int kMaxJsonDepth = 32;

// The deepest nesting of arrays and objects in `text`, counting brackets outside strings, stopped
// early at `limit` + 1. One pass, no recursion: safe on any bytes (invalid JSON included).
int JsonNestingDepth(std::string_view text, int limit);

// A request body as a JSON object, or the 400 to answer: nested deeper than kMaxJsonDepth (said
// before anything is parsed), not valid JSON, or not an object. Never throws.
std::optional<ApiError> ParseJsonBody(std::string_view body, JsonValue* doc);

// JSON found inside a request (a string holding JSON), under the same depth bound. nullopt when
// it nests too deep or does not parse. Never throws.
std::optional<JsonValue> ParseNestedJson(std::string_view text);

// `text` cut after `max_bytes` (at a UTF-8 character's start) with its full size said, e.g. an
// error another layer wrote that may quote the request (a template's raise_exception).
std::string Truncated(std::string_view text, size_t max_bytes = 512);

// `text` as an error message may quote it: in double quotes, Truncated, so a 6 MiB value costs an
// error body 60 bytes.
std::string BoundedQuote(std::string_view text, size_t max_bytes = 48);

// What a value is, for "got ..." in an error message: a number or literal as written, a string as
// BoundedQuote, an array or object by its kind and size (never printed: printing is recursive and
// unbounded).
std::string DescribeValue(const JsonValue& value);

}  // namespace kvl::server
