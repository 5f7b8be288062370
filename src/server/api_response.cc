#include "api_response.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <random>

namespace kvl::server {
namespace {

using nlohmann::json;

// Token text is the tokenizer's bytes: anything not UTF-8 is replaced, never thrown on.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json Envelope(const ResponseHead& head, bool chunk) {
  const bool chat = head.endpoint == Endpoint::kChatCompletions;
  return {
      {"id", head.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", head.created},
      {"model", head.model}};
}

// A token's UTF-8 bytes as numbers (chat's `bytes`, for text that is not valid UTF-8 alone).
json Bytes(std::string_view text) {
  json bytes = json::array();
  for (char c : text) bytes.push_back(static_cast<uint8_t>(c));
  return bytes;
}

json LogprobsJson(const ResponseHead& head, const Logprobs& logprobs) {
  if (!head.logprobs) return nullptr;
  if (head.endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const TokenLogprobText& t : logprobs.tokens) {
      json top = json::array();
      for (const auto& [token, logprob] : t.top) {
        top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", Bytes(token)}});
      }
      content.push_back({{"token", t.token},
                         {"logprob", t.logprob},
                         {"bytes", Bytes(t.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  int64_t offset = logprobs.text_offset;
  for (const TokenLogprobText& t : logprobs.tokens) {
    tokens.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    // A map from text to log-probability, as OpenAI's; where two tokens print the same text the
    // more likely one stays. The sampled token is always there, as OpenAI promises.
    json top = json::object();
    for (const auto& [token, logprob] : t.top) {
      if (!top.contains(token)) top[token] = logprob;
    }
    if (!top.contains(t.token)) top[t.token] = t.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += static_cast<int64_t>(t.token.size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

// One choice of a streamed chunk: a delta for chat, text for completions.
std::string Chunk(const ResponseHead& head, json delta, std::string_view text,
                  const json& finish_reason, json logprobs = nullptr,
                  const std::vector<int32_t>* token_ids = nullptr, bool prompt_ids = false) {
  json choice = {{"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_reason}};
  if (head.endpoint == Endpoint::kChatCompletions) {
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  if (head.token_ids && token_ids != nullptr) choice["token_ids"] = *token_ids;
  json body = Envelope(head, /*chunk=*/true);
  if (head.token_ids && prompt_ids) body["prompt_token_ids"] = head.prompt_token_ids;
  body["choices"] = json::array({std::move(choice)});
  if (head.include_usage) body["usage"] = nullptr;
  return "data: " + Dump(body) + "\n\n";
}

}  // namespace

std::string_view OpenAiFinishReason(std::string_view r) {
  if (r == "eos" || r == "stop") return "stop";
  if (r == "length" || r == "context") return "length";
  if (r == "cancelled") return "abort";
  // A sequence stopped where it got to when it outgrew the KV budget and tiers: its own reason,
  // so that it is not mistaken for max_tokens (OpenAI's clients take any string here).
  if (r == "kv_pressure") return "kv_pressure";
  return "error";
}

std::string NewResponseId(Endpoint endpoint) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}",
                     endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", rng(),
                     static_cast<uint32_t>(rng()));
}

std::string CompletionBody(const ResponseHead& head, std::string_view text,
                           std::string_view finish_reason, const Usage& usage,
                           const Logprobs& logprobs, const std::vector<int32_t>& token_ids) {
  json choice = {
      {"index", 0}, {"logprobs", LogprobsJson(head, logprobs)}, {"finish_reason", finish_reason}};
  if (head.endpoint == Endpoint::kChatCompletions) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  if (head.token_ids) choice["token_ids"] = token_ids;
  json body = Envelope(head, /*chunk=*/false);
  if (head.token_ids) body["prompt_token_ids"] = head.prompt_token_ids;
  body["choices"] = json::array({std::move(choice)});
  body["usage"] = UsageJson(usage);
  return Dump(body);
}

namespace {

json ToolCallsJson(const std::vector<ReplyToolCall>& calls) {
  json out = json::array();
  for (const ReplyToolCall& call : calls) {
    out.push_back({{"id", call.id},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return out;
}

}  // namespace

std::string SplitChatBody(const ResponseHead& head, const ReplyDelta& reply,
                          std::string_view finish_reason, const Usage& usage,
                          const Logprobs& logprobs, const std::vector<int32_t>& token_ids) {
  json message = {{"role", "assistant"}};
  message["content"] =
      reply.content.empty() && !reply.calls.empty() ? json(nullptr) : json(reply.content);
  if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
  if (!reply.calls.empty()) message["tool_calls"] = ToolCallsJson(reply.calls);
  json choice = {{"index", 0},
                 {"logprobs", LogprobsJson(head, logprobs)},
                 {"finish_reason", finish_reason},
                 {"message", std::move(message)}};
  if (head.token_ids) choice["token_ids"] = token_ids;
  json body = Envelope(head, /*chunk=*/false);
  if (head.token_ids) body["prompt_token_ids"] = head.prompt_token_ids;
  body["choices"] = json::array({std::move(choice)});
  body["usage"] = UsageJson(usage);
  return Dump(body);
}

std::string DeltaFrames(const ResponseHead& head, const ReplyDelta& delta,
                        const Logprobs& logprobs, const std::vector<int32_t>& token_ids) {
  std::vector<json> deltas;
  if (!delta.reasoning.empty()) deltas.push_back({{"reasoning_content", delta.reasoning}});
  if (!delta.content.empty()) deltas.push_back({{"content", delta.content}});
  for (const ReplyToolCall& call : delta.calls) {
    deltas.push_back({{"tool_calls",
                       json::array({{{"index", call.index},
                                     {"id", call.id},
                                     {"type", "function"},
                                     {"function", {{"name", call.name}, {"arguments", ""}}}}})}});
    deltas.push_back(
        {{"tool_calls",
          json::array({{{"index", call.index}, {"function", {{"arguments", call.arguments}}}}})}});
  }
  const bool extras = (head.logprobs && !logprobs.tokens.empty()) || (head.token_ids && !token_ids.empty());
  if (deltas.empty() && extras) deltas.push_back(json::object());
  std::string frames;
  for (size_t i = 0; i < deltas.size(); ++i) {
    if (i == 0) {
      frames += Chunk(head, std::move(deltas[i]), "", nullptr, LogprobsJson(head, logprobs),
                      &token_ids);
    } else {
      static const std::vector<int32_t> kNone;
      frames += Chunk(head, std::move(deltas[i]), "", nullptr,
                      head.logprobs ? LogprobsJson(head, Logprobs{}) : json(nullptr), &kNone);
    }
  }
  return frames;
}

std::string RoleFrame(const ResponseHead& head) {
  return Chunk(head, {{"role", "assistant"}, {"content", ""}}, "", nullptr, nullptr, nullptr,
               /*prompt_ids=*/true);
}

std::string TextFrame(const ResponseHead& head, std::string_view text, const Logprobs& logprobs,
                      const std::vector<int32_t>& token_ids, bool first) {
  return Chunk(head, {{"content", text}}, text, nullptr, LogprobsJson(head, logprobs), &token_ids,
               first && head.endpoint == Endpoint::kCompletions);
}

std::string FinishFrame(const ResponseHead& head, std::string_view finish_reason) {
  return Chunk(head, json::object(), "", finish_reason);
}

std::string UsageFrame(const ResponseHead& head, const Usage& usage) {
  json body = Envelope(head, /*chunk=*/true);
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return "data: " + Dump(body) + "\n\n";
}

std::string ErrorFrame(const ApiError& error) { return "data: " + ErrorBody(error) + "\n\n"; }

}  // namespace kvl::server
