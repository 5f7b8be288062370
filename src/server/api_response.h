// The OpenAI response bodies and server-sent-event frames, as JSON text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api_request.h"
#include "reply_splitter.h"

namespace kvl::server {

// What every body or chunk of one response repeats.
struct ResponseHead {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;        // cmpl-... / chatcmpl-...
  int64_t created = 0;   // unix seconds
  std::string model;
  bool include_usage = false;  // streaming: usage null on each chunk, then a usage chunk
  bool logprobs = false;       // choices carry log-probabilities (else "logprobs": null)
  // vLLM's return_token_ids: the body's prompt_token_ids and each choice's token_ids (streamed:
  // the prompt's ids on the first frame, each frame's own ids on it).
  bool token_ids = false;
  std::vector<int32_t> prompt_token_ids;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
};

// One generated token's log-probability and the most likely tokens at its step, as text.
struct TokenLogprobText {
  std::string token;
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;  // most likely first
};

// The log-probabilities of a run of generated tokens: the whole completion, or one chunk's.
struct Logprobs {
  std::vector<TokenLogprobText> tokens;
  int64_t text_offset = 0;  // where the first token starts in the completion's text
};

// The engine's finish reason as OpenAI names it: stop, length, abort or error; kv_pressure (a
// sequence cut where it outgrew the KV budget and tiers) is passed through as kvlattice's own.
std::string_view OpenAiFinishReason(std::string_view engine_reason);
std::string NewResponseId(Endpoint endpoint);

// `logprobs` is read only when head.logprobs is set. Legacy completions carry
// {tokens, token_logprobs, top_logprobs: [{token: logprob}] (the sampled token always among
// them), text_offset}; chat carries {content: [{token, logprob, bytes, top_logprobs: [{token,
// logprob, bytes}]}]}.
std::string CompletionBody(const ResponseHead& head, std::string_view text,
                           std::string_view finish_reason, const Usage& usage,
                           const Logprobs& logprobs = {},
                           const std::vector<int32_t>& token_ids = {});

// A chat completion whose reply was split (reply_splitter.h): the message's reasoning_content
// (where there is any), content (null when the reply is only calls) and tool_calls.
std::string SplitChatBody(const ResponseHead& head, const ReplyDelta& reply,
                          std::string_view finish_reason, const Usage& usage,
                          const Logprobs& logprobs = {},
                          const std::vector<int32_t>& token_ids = {});

// "data: {...}\n\n" frames. A chunk carries the role (chat, first frame), text, or a finish
// reason; the usage frame has no choices.
std::string RoleFrame(const ResponseHead& head);
// `first`: the stream's first frame with content (a completion's; chat's comes after the role).
std::string TextFrame(const ResponseHead& head, std::string_view text,
                      const Logprobs& logprobs = {}, const std::vector<int32_t>& token_ids = {},
                      bool first = false);
// A split chat reply's delta as frames: reasoning_content, content, and each call as OpenAI
// streams it (index, id, type and name with empty arguments, then the arguments). The
// log-probabilities and token ids ride on the first frame; with nothing else to say they get a
// frame of their own (an empty delta), as a held-back token's do.
std::string DeltaFrames(const ResponseHead& head, const ReplyDelta& delta,
                        const Logprobs& logprobs = {}, const std::vector<int32_t>& token_ids = {});
std::string FinishFrame(const ResponseHead& head, std::string_view finish_reason);
std::string UsageFrame(const ResponseHead& head, const Usage& usage);
std::string ErrorFrame(const ApiError& error);
inline constexpr std::string_view kDoneFrame = "data: [DONE]\n\n";

}  // namespace kvl::server
