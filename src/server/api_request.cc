// Every field is checked for its type and range before anything reaches the engine; the first
// problem found is the answer, naming the field as OpenAI's `param`.
#include "api_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "field_reader.h"
#include "json_body.h"
#include "request_fields.h"
#include "sampling_fields.h"
#include "kvl/jinja_json.h"
#include "structured_output.h"
#include "tool_request.h"

namespace kvl::server {
namespace {

using json = JsonValue;

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxMessages = 4096;

// kvlattice's extension (as vLLM accepts its own): the request's tolerance for loss in its KV
// pages, "lossless" | "balanced" | "aggressive". Absent or null: the server's --kv-quality.
std::optional<ApiError> ReadKvQuality(const FieldReader& fields, const ApiContext& context,
                                      Request* request) {
  const json* v = fields.Find("kv_quality");
  if (v == nullptr) return std::nullopt;
  // Both branches string_view: a ternary of `const std::string&` and "" would make a temporary
  // std::string copy, and the view would outlive it (ASan: stack-use-after-scope).
  const std::string_view text =
      v->is_string() ? std::string_view(v->get_ref<const std::string&>()) : std::string_view();
  if (!v->is_string() || text.empty() || !ParseKvQuality(text).ok()) {
    return BadField("kv_quality", fmt::format("'kv_quality' must be \"lossless\", \"balanced\" "
                                              "or \"aggressive\", got {}",
                                              DescribeValue(*v)));
  }
  request->kv_quality = *ParseKvQuality(text);
  if (*request->kv_quality != KvQuality::kLossless && !context.accepts_lossy_kv) {
    return BadField("kv_quality",
                    fmt::format("'kv_quality' \"{}\" lets KV pages be compressed, but this server "
                                "was started lossless (no buffers reserved for compressed pages); "
                                "start it with --kv-quality balanced or aggressive",
                                text));
  }
  return std::nullopt;
}

std::optional<ApiError> CheckModel(const FieldReader& fields, const ApiContext& context) {
  const json* model = fields.Find("model");
  if (model == nullptr) return std::nullopt;  // the one model served
  if (!model->is_string()) return BadField("model", "'model' must be a string");
  const std::string& name = model->get_ref<const std::string&>();
  if (name == context.model_name || name == context.model_path) return std::nullopt;
  return ApiError{404,
                  fmt::format("The model {} does not exist; this server serves '{}'",
                              BoundedQuote(name), context.model_name),
                  "invalid_request_error", "model", "model_not_found"};
}

// A prompt: a non-empty string, an array holding one string, or an array of token ids.
std::optional<ApiError> ReadPrompt(const FieldReader& fields, Request* request) {
  const json* prompt = fields.Find("prompt");
  if (prompt == nullptr) return BadField("prompt", "'prompt' is required");
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    prompt = &(*prompt)[0];
  }
  if (prompt->is_string()) {
    request->prompt = prompt->get<std::string>();
    if (request->prompt.empty()) return BadField("prompt", "'prompt' must not be empty");
    return std::nullopt;
  }
  if (!prompt->is_array()) {
    return BadField("prompt", "'prompt' must be a string or an array of token ids");
  }
  if (prompt->empty()) return BadField("prompt", "'prompt' must not be empty");
  for (const json& id : *prompt) {
    if (id.is_string()) return BadField("prompt", "only one prompt per request is supported");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return BadField("prompt", "'prompt' as an array must hold token ids (integers)");
    }
    request->prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return std::nullopt;
}

// Content as a string or as an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> ReadContent(const json& content, size_t index, std::string* out) {
  const std::string param = fmt::format("messages[{}].content", index);
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return BadField(param, fmt::format("'{}' must be a string", param));
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return BadField(param, fmt::format("'{}' parts must be {{\"type\": \"text\", \"text\": "
                                         "string}}",
                                         param));
    }
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

// One message as the chat template sees it: the client's object with its content as one string
// (text parts joined) and a tool call's arguments given as a JSON string parsed into a mapping,
// as templates written for HF transformers expect them.
jinja::Value MessageValue(const json& m, std::string content_text, bool has_content) {
  json copy = m;
  // A turn with no content (an assistant's that only calls tools: null, as OpenAI's clients send
  // it) gets "": templates test and split it as a string (Qwen3's `'</think>' in content`
  // fails on none), and "" reads as no content wherever a template asks.
  copy["content"] = has_content ? std::move(content_text) : std::string();
  if (copy.contains("tool_calls") && copy["tool_calls"].is_array()) {
    for (json& call : copy["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        continue;
      json& arguments = call["function"]["arguments"];
      if (!arguments.is_string()) continue;
      // Through the body's depth bound: the string may hold JSON nested without limit, which
      // FromJson below would walk recursively.
      std::optional<json> parsed = ParseNestedJson(arguments.get_ref<const std::string&>());
      if (parsed && parsed->is_object()) arguments = std::move(*parsed);
    }
  }
  return jinja::FromJson(copy);
}

// messages, tools (unless !render_tools: tool_choice "none"), chat_template_kwargs and
// add_generation_prompt: what a chat template renders.
std::optional<ApiError> ReadChatInputs(const FieldReader& fields, ChatInputs* inputs,
                                       bool render_tools = true) {
  const json* messages = fields.Find("messages");
  if (messages == nullptr) return BadField("messages", "'messages' is required");
  if (!messages->is_array()) return BadField("messages", "'messages' must be an array");
  if (messages->empty()) return BadField("messages", "'messages' must not be empty");
  if (messages->size() > kMaxMessages) {
    return BadField("messages", fmt::format("at most {} messages", kMaxMessages));
  }
  std::vector<jinja::Value> values;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) return BadField(param, fmt::format("'{}' must be an object", param));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return BadField(param + ".role", fmt::format("'{}.role' must be a string", param));
    }
    auto tool_calls = m.find("tool_calls");
    if (tool_calls != m.end() && !tool_calls->is_null() && !tool_calls->is_array()) {
      return BadField(param + ".tool_calls",
                      fmt::format("'{}.tool_calls' must be an array", param));
    }
    const bool calls_tools =
        tool_calls != m.end() && tool_calls->is_array() && !tool_calls->empty();
    auto content = m.find("content");
    const bool has_content = content != m.end() && !content->is_null();
    // An assistant turn that only calls tools has no content (null), as OpenAI sends it.
    if (!has_content && !calls_tools) {
      return BadField(param + ".content", fmt::format("'{}.content' is required", param));
    }
    std::string text;
    if (has_content) {
      if (auto e = ReadContent(*content, i, &text)) return e;
    }
    values.push_back(MessageValue(m, std::move(text), has_content));
  }
  inputs->messages = jinja::Value::Array(std::move(values));
  if (const json* tools = fields.Find("tools")) {
    if (!tools->is_array()) return BadField("tools", "'tools' must be an array");
    if (!tools->empty() && render_tools) inputs->tools = jinja::FromJson(*tools);
  }
  if (const json* kwargs = fields.Find("chat_template_kwargs")) {
    if (!kwargs->is_object())
      return BadField("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      inputs->kwargs.emplace_back(it.key(), jinja::FromJson(it.value()));
    }
  }
  if (const json* add = fields.Find("add_generation_prompt")) {
    if (!add->is_boolean())
      return BadField("add_generation_prompt", "'add_generation_prompt' must be a boolean");
    inputs->add_generation_prompt = add->get<bool>();
  }
  return std::nullopt;
}

const ChatFormatter& FormatterOf(const ApiContext& context) {
  static const ChatFormatter kPlain = ChatFormatter::Builtin(ChatTemplate::kPlain);
  return context.chat ? *context.chat : kPlain;
}

std::optional<ApiError> ReadMessages(const FieldReader& fields, const ApiContext& context,
                                     const ToolRequest& tools, Request* request) {
  ChatInputs chat;
  if (auto e = ReadChatInputs(fields, &chat, tools.uses_tools())) return e;
  StatusOr<std::string> prompt = FormatterOf(context).Apply(chat);
  if (!prompt.ok()) return BadField("messages", Truncated(prompt.status().message()));
  if (prompt->empty()) return BadField("messages", "the messages make an empty prompt");
  request->prompt = std::move(*prompt);
  request->parse_special = true;  // the template's control tokens are tokens, not text
  return std::nullopt;
}

std::optional<ApiError> ReadStops(const FieldReader& fields, Request* request) {
  const json* stop = fields.Find("stop");
  if (stop == nullptr) return std::nullopt;
  auto add = [&](const json& s) -> std::optional<ApiError> {
    if (!s.is_string() || s.get_ref<const std::string&>().empty()) {
      return BadField("stop", "'stop' must be a non-empty string or a list of them");
    }
    request->stop_strings.push_back(s.get<std::string>());
    return std::nullopt;
  };
  if (!stop->is_array()) return add(*stop);
  if (stop->size() > kMaxStops) {
    return BadField("stop", fmt::format("'stop' may hold at most {} strings", kMaxStops));
  }
  for (const json& s : *stop) {
    if (auto e = add(s)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ReadOptions(FieldReader& f, Endpoint endpoint, const ApiContext& context,
                                    CompletionParams* out) {
  // Fields this server does not implement are refused by name, never silently ignored: a client
  // that asks for a suffix must not get plain text and believe it got one.
  if (const json* best_of = f.Find("best_of");
      best_of != nullptr && !best_of->is_null() && *best_of != 1) {
    return BadField("best_of", "only 'best_of' = 1 is supported");
  }
  if (const json* suffix = f.Find("suffix");
      suffix != nullptr && !suffix->is_null() && *suffix != "") {
    return BadField("suffix", "'suffix' (insertion) is not supported by this server");
  }
  int64_t n = 1;
  if (!f.Integer("n", 1, 1, &n)) {
    return BadField("n", "only 'n' = 1 is supported");
  }
  // Legacy completions default to 16 tokens (as OpenAI's); chat and llama-server's /completion
  // run to EOS or the context.
  int64_t max_tokens = endpoint == Endpoint::kCompletions ? 16 : -1;
  if (!f.Integer("max_tokens", 1, context.context_length, &max_tokens) ||
      !f.Integer("max_completion_tokens", 1, context.context_length, &max_tokens)) {
    return f.error;
  }
  // llama-server's name, which wins over max_tokens there too; -1: no limit. Its 0 (evaluate
  // the prompt only) has no counterpart here.
  if (const json* n_predict = f.Find("n_predict")) {
    if (!n_predict->is_number_integer() || n_predict->get<int64_t>() == 0 ||
        n_predict->get<int64_t>() < -1 || n_predict->get<int64_t>() > context.context_length) {
      return BadField("n_predict", fmt::format("'n_predict' must be -1 (no limit) or in [1, {}], "
                                               "got {}",
                                               context.context_length, DescribeValue(*n_predict)));
    }
    max_tokens = n_predict->get<int64_t>();
  }
  out->request.max_new_tokens = static_cast<int32_t>(max_tokens);
  if (!f.Bool("stream", &out->stream)) return f.error;
  if (!f.Bool("return_token_ids", &out->return_token_ids)) return f.error;
  // vLLM's extension: generate max_tokens even past EOS (load generators want exact counts).
  if (!f.Bool("ignore_eos", &out->request.ignore_eos)) return f.error;
  if (std::optional<ApiError> e = ReadKvQuality(f, context, &out->request)) return e;
  if (const json* options = f.Find("stream_options")) {
    if (!options->is_object()) {
      return BadField("stream_options", "'stream_options' must be an object");
    }
    FieldReader stream_fields(*options);
    if (!stream_fields.Bool("include_usage", &out->include_usage)) {
      return BadField("stream_options.include_usage", "'include_usage' must be a boolean");
    }
  }
  if (endpoint == Endpoint::kLlamaCompletion) {
    // llama-server's n_probs: the most likely tokens beside each generated one (0: none).
    int64_t n_probs = 0;
    if (!f.Integer("n_probs", 0, kMaxTopLogprobs, &n_probs) ||
        !f.Bool("return_tokens", &out->return_tokens)) {
      return f.error;
    }
    out->request.top_logprobs = n_probs > 0 ? static_cast<int32_t>(n_probs) : -1;
  } else if (endpoint == Endpoint::kCompletions) {
    // Legacy completions: `logprobs` is the number of most likely tokens listed beside each
    // generated one (0 lists only the token itself).
    int64_t logprobs = -1;
    if (!f.Integer("logprobs", 0, kMaxTopLogprobs, &logprobs)) return f.error;
    out->request.top_logprobs = static_cast<int32_t>(logprobs);
    bool echo = false;
    if (!f.Bool("echo", &echo)) return f.error;
    if (echo) return BadField("echo", "'echo' is not supported by this server");
  } else {
    // Chat: `logprobs` turns them on, `top_logprobs` asks for alternatives (OpenAI refuses it
    // without `logprobs`, and so does this server).
    bool logprobs = false;
    int64_t top_logprobs = -1;
    if (!f.Bool("logprobs", &logprobs) ||
        !f.Integer("top_logprobs", 0, kMaxTopLogprobs, &top_logprobs)) {
      return f.error;
    }
    if (top_logprobs >= 0 && !logprobs) {
      return BadField("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    }
    if (logprobs) {
      out->request.top_logprobs = static_cast<int32_t>(std::max<int64_t>(0, top_logprobs));
    }
  }
  return std::nullopt;
}

// tool_choice required / named: the grammar of a call; and how the reply's text is split.
std::optional<ApiError> ReadReplyOptions(const ToolRequest& tools, const ApiContext& context,
                                         CompletionParams* out) {
  std::string gbnf;
  if (tools.uses_tools()) {
    if (auto e = ToolCallGrammar(tools, context.tool_format, &gbnf)) return e;
  }
  if (!gbnf.empty()) {
    if (!out->request.grammar.empty()) {
      return BadField("tool_choice",
                      "'tool_choice' forces a tool call, and 'response_format' (or 'grammar', "
                      "'json_schema') constrains the reply too; send one");
    }
    out->request.grammar = std::move(gbnf);
  }
  ReplyOptions& reply = out->reply;
  reply.parse_tools = tools.uses_tools();
  reply.format = context.tool_format;
  if (reply.format == ToolCallFormat::kXmlFunction) reply.parameter_types = ParameterTypes(tools);
  reply.parallel = tools.parallel;
  reply.split_reasoning = tools.split_reasoning && context.template_thinks;
  // A template that opens the reasoning itself (DeepSeek-R1's, Qwen3's thinking variants)
  // leaves the reply inside it from its first token.
  const std::string_view prompt = TrimSpace(out->request.prompt);
  reply.reasoning_open = reply.split_reasoning && prompt.ends_with("<think>");
  return std::nullopt;
}

}  // namespace

std::string ErrorBody(const ApiError& error) {
  using nlohmann::json;  // sorted keys, as the error bodies always printed them
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return json{{"error", std::move(e)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<ApiError> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                               const ApiContext& context, CompletionParams* out) {
  json doc;
  if (auto e = ParseJsonBody(body, &doc)) return e;
  try {
    if (auto e = CheckRequestFields(&doc, endpoint, context.lenient, &out->ignored_fields)) {
      return e;
    }
    FieldReader fields(doc);
    if (auto e = CheckModel(fields, context)) return e;
    ToolRequest tools;
    if (auto e = ReadToolRequest(doc, &tools)) return e;
    if (endpoint != Endpoint::kChatCompletions &&
        (tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed)) {
      return BadField("tool_choice", "'tool_choice' forces a tool call: send it to "
                                     "/v1/chat/completions, whose template renders the tools");
    }
    if (auto e = endpoint != Endpoint::kChatCompletions
                     ? ReadPrompt(fields, &out->request)
                     : ReadMessages(fields, context, tools, &out->request)) {
      return e;
    }
    if (auto e = ReadOptions(fields, endpoint, context, out)) return e;
    // response_format, json_schema, grammar (structured_output.h).
    if (auto e = ReadStructuredOutput(doc, &out->request)) return e;
    if (endpoint == Endpoint::kChatCompletions) {
      if (auto e = ReadReplyOptions(tools, context, out)) return e;
    }
    if (auto e = ReadStops(fields, &out->request)) return e;
    if (auto e = ReadSamplingFields(fields, endpoint, context, &out->request.sampling)) {
      return e;
    }
  } catch (const json::exception& e) {
    // A type this code did not expect; the checks above should make this unreachable.
    return BadField("", fmt::format("bad request body: {}", e.what()));
  }
  return std::nullopt;
}

}  // namespace kvl::server

namespace kvl::server {

std::optional<ApiError> ParseApplyTemplateRequest(std::string_view body, const ApiContext& context,
                                                  std::string* prompt) {
  json doc;
  if (auto e = ParseJsonBody(body, &doc)) return e;
  try {
    ChatInputs chat;
    if (auto e = ReadChatInputs(FieldReader(doc), &chat)) return e;
    StatusOr<std::string> rendered = FormatterOf(context).Apply(chat);
    if (!rendered.ok()) return BadField("messages", Truncated(rendered.status().message()));
    *prompt = std::move(*rendered);
    return std::nullopt;
  } catch (const json::exception& e) {
    return BadField("", fmt::format("bad request body: {}", e.what()));
  }
}

}  // namespace kvl::server
