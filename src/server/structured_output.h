// Structured output (issue 42): the request fields that constrain a reply to a grammar, read into
// Request::grammar: OpenAI's response_format ({"type": "json_object"}, {"type": "json_schema",
// "json_schema": {"schema": ..., "strict": ...}}) and llama-server's `json_schema` (a schema) and
// `grammar` (GBNF text). At most one of them; each refused, naming the field and the keyword,
// when it cannot be honoured. Nothing here touches the engine.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "api_request.h"
#include "kvl/engine.h"

namespace kvl::server {

// Sets request->grammar from the body's structured-output fields (none: left empty).
std::optional<ApiError> ReadStructuredOutput(const nlohmann::ordered_json& body, Request* request);

}  // namespace kvl::server
