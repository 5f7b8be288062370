// POST /tokenize and POST /detokenize, answered as llama-server answers them, with the engine's
// tokenizer (thread-safe: these run on any connection thread).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "api_request.h"
#include "kvl/tokenizer.h"

namespace kvl::server {

inline constexpr std::string_view kTokenizePath = "/tokenize";
inline constexpr std::string_view kDetokenizePath = "/detokenize";

// The JSON answer to a body sent to kTokenizePath or kDetokenizePath, or the error to send.
// /tokenize: {"content": string | [string | id, ...], "add_special": false, "parse_special":
// true, "with_pieces": false} -> {"tokens": [ids]} or, with_pieces, [{"id", "piece"}] where a
// piece that is not valid UTF-8 is its bytes. /detokenize: {"tokens": [ids]} -> {"content"}.
struct TokenRouteAnswer {
  std::string body;            // JSON, when error is empty
  std::optional<ApiError> error;
};
struct TokenRouteContext {
  const Tokenizer& tokenizer;
  // The most text /tokenize takes: TokenizeContentLimit, as Engine::Submit bounds a prompt.
  int64_t max_content_bytes = 0;
};
// The body goes through ParseJsonBody (json_body.h), as every route's does.
TokenRouteAnswer AnswerTokenRoute(std::string_view path, std::string_view body,
                                  const TokenRouteContext& context);

// The bytes of the longest text that can be a prompt: `context_length` tokens of the vocab's
// longest token text each. A longer text has more tokens than the context holds.
int64_t TokenizeContentLimit(const Tokenizer& tokenizer, int64_t context_length);

}  // namespace kvl::server
