// Which fields a completion request may carry: every top-level field is honoured, or refused with
// a 400 naming it. A field for a feature kvlattice does not implement (Mirostat, DRY, beam
// search, ...) passes only at the value that turns the feature off, so that a client sending
// llama-server's or vLLM's full default set is served, and one asking for the feature is told.
// `kvl serve --lenient` ignores such fields instead, naming them in a response header.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api_request.h"
#include "json_body.h"

namespace kvl::server {

// The header a lenient server names the ignored fields in (comma-separated).
inline constexpr std::string_view kIgnoredFieldsHeader = "X-Kvl-Ignored-Fields";

// Checks the top-level fields of `body` (an object) for `endpoint`. A field neither honoured nor
// at its feature's off value is an error naming it, or, with `lenient`, removed from *body and
// appended to *ignored. Null values count as absent.
std::optional<ApiError> CheckRequestFields(JsonValue* body, Endpoint endpoint, bool lenient,
                                           std::vector<std::string>* ignored);

}  // namespace kvl::server
