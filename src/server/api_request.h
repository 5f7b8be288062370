// The OpenAI request bodies, validated at the boundary: JSON text in, an engine Request (or an
// OpenAI-style error naming the field) out. Nothing here touches the engine or the network.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/chat_template.h"
#include "kvl/engine.h"
#include "reply_splitter.h"
#include "tool_calls.h"

namespace kvl::server {

// An error as OpenAI returns it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
std::string ErrorBody(const ApiError& error);

// What the request parser needs to know about the server.
struct ApiContext {
  std::string model_name;      // the id /v1/models lists
  std::string model_path;      // also accepted as a model name
  std::shared_ptr<const ChatFormatter> chat;  // null: the plain built-in
  int64_t context_length = 0;  // max_tokens may not exceed it
  int64_t vocab_size = 0;      // logit_bias may name only its tokens (0: not checked here)
  // The engine reserved buffers for compressed pages (Engine::accepts_lossy_kv): a request may
  // ask for kv_quality balanced or aggressive.
  bool accepts_lossy_kv = true;
  // Read from the chat template's text: the syntax its model writes tool calls in, and whether
  // it thinks in <think> ... </think> (a reply is then split into reasoning and content).
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  bool template_thinks = false;
  // kvl serve --lenient: fields this server does not honour are ignored (and named in the
  // response) instead of refused (request_fields.h).
  bool lenient = false;
};

// /v1/completions, /v1/chat/completions, and llama-server's native /completion.
enum class Endpoint { kCompletions, kChatCompletions, kLlamaCompletion };

struct CompletionParams {
  Request request;  // prompt (or prompt_ids), max tokens, sampling, stops
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_token_ids = false;  // vLLM's: prompt_token_ids and each choice's token_ids
  // How a chat reply's text is split into reasoning, content and tool calls (inactive: all of
  // it is content).
  ReplyOptions reply;
  // What a lenient server ignored, in the order the body gave them (empty: nothing).
  std::vector<std::string> ignored_fields;
  bool return_tokens = false;  // llama-server's: /completion's "tokens" holds the ids
};

// Parses and validates a request body. Never throws.
std::optional<ApiError> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                               const ApiContext& context, CompletionParams* out);

// POST /apply-template's body ({"messages", "tools", "chat_template_kwargs",
// "add_generation_prompt"}, as llama-server reads it) rendered into *prompt. Never throws.
std::optional<ApiError> ParseApplyTemplateRequest(std::string_view body, const ApiContext& context,
                                                  std::string* prompt);

}  // namespace kvl::server
