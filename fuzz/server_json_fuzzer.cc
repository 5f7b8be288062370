// libFuzzer target for the JSON every `kvl serve` route reads: the request parsers behind
// /v1/completions, /v1/chat/completions, /apply-template, /tokenize and /detokenize, fed bodies
// built from the input by a generator that knows the fields each route reads, so that mutations
// reach deep into the request (a tool call's arguments, logit_bias, stop lists) instead of dying
// at the first brace. What it makes on purpose: nesting far past the depth bound (in the body
// and inside a string of JSON), long strings, wrong types, numbers past every range, bad UTF-8.
// Every answer must come back without a crash (ASan, UBSan), and every error body must be
// bounded JSON naming the problem, whatever the body held.
//
// Input: byte 0 picks the route and the chat template (plain built-in or Jinja); bit 7 of byte 1
// sends the rest of the input as the body, raw; else the rest drives the generator.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "api_request.h"
#include "json_body.h"
#include "kvl/chat_template.h"
#include "kvl/tokenizer.h"
#include "tokenize_routes.h"

namespace {

using kvl::server::ApiContext;
using kvl::server::ApiError;

// What an error body may reach: the longest fixed message, a field path and a quoted snippet.
constexpr size_t kMaxErrorBodyBytes = 1024;

// A SentencePiece vocab with byte fallback, as a model's.
std::unique_ptr<kvl::Tokenizer> Vocab() {
  kvl::TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {kvl::TokenType::kUnknown, kvl::TokenType::kControl, kvl::TokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    char text[8];
    std::snprintf(text, sizeof(text), "<0x%02X>", b);
    v.tokens.push_back(text);
    v.types.push_back(kvl::TokenType::kByte);
  }
  for (const char* piece : {"\xE2\x96\x81", "a", "b",
                            "\xE2\x96\x81"
                            "a",
                            "ab", "aa", "\xC3\xA9"}) {
    v.tokens.push_back(piece);
    v.types.push_back(kvl::TokenType::kNormal);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 0; i < v.scores.size(); ++i) v.scores[i] = -static_cast<float>(i % 5);
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  auto tok = kvl::Tokenizer::FromVocab(std::move(v));
  if (!tok.ok()) std::abort();
  return std::move(*tok);
}

// A template that walks what a request can put in front of one: each message's fields, its tool
// calls' arguments as a mapping, the tools and a keyword argument.
constexpr std::string_view kJinjaTemplate =
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{% endfor %}{% endif %}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if flag is defined %}{{ flag }}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

struct Fixture {
  std::unique_ptr<kvl::Tokenizer> tokenizer = Vocab();
  ApiContext plain;
  ApiContext jinja;
  Fixture() {
    plain.model_name = "stories";
    plain.model_path = "/models/stories.gguf";
    plain.context_length = 512;
    plain.vocab_size = tokenizer->vocab_size();
    plain.accepts_lossy_kv = false;
    jinja = plain;
    jinja.accepts_lossy_kv = true;
    auto formatter = kvl::ChatFormatter::FromJinja(kJinjaTemplate, "fuzz", {});
    if (!formatter.ok()) {
      std::fprintf(stderr, "server_json_fuzzer: %s\n", formatter.status().ToString().c_str());
      std::abort();
    }
    jinja.chat = std::make_shared<const kvl::ChatFormatter>(std::move(*formatter));
  }
};

// Builds JSON text from the input. Recursion here is bounded by kMaxGeneratorDepth; deep nesting
// is made by repetition (one string of brackets), never by recursing that deep.
class BodyGenerator {
 public:
  explicit BodyGenerator(FuzzedDataProvider& in) : in_(in) {}

  std::string Value(int depth = 0) {
    if (depth >= kMaxGeneratorDepth) return Scalar();
    switch (in_.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
        return Scalar();
      case 1:
        return Number();
      case 2:
        return Quote(Text());
      case 3:
        return Quote(LongText());
      case 4: {
        std::string out = "[";
        const int n = in_.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < n; ++i) out += (i ? "," : "") + Value(depth + 1);
        return out + "]";
      }
      case 5: {
        std::string out = "{";
        const int n = in_.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < n; ++i) out += (i ? "," : "") + Quote(Key()) + ":" + Value(depth + 1);
        return out + "}";
      }
      case 6:
        return Deep(Value(kMaxGeneratorDepth));
      case 7:
        return Quote(Escape(Deep("1")));  // JSON nested deep inside a string
      case 8:
        return Quote(Escape(Value(depth + 1)));
      default:
        return std::to_string(in_.ConsumeIntegral<int32_t>());
    }
  }

  // A body of the route's own fields, each usually of its type and sometimes of any.
  std::string Body(const std::vector<std::string_view>& fields) {
    std::string out = "{";
    const int n = in_.ConsumeIntegralInRange<int>(0, 8);
    for (int i = 0; i < n; ++i) {
      const std::string_view key = fields[in_.ConsumeIntegralInRange<size_t>(0, fields.size() - 1)];
      out += (i ? "," : "") + Quote(std::string(key)) + ":" + Field(key);
    }
    return out + "}";
  }

 private:
  static constexpr int kMaxGeneratorDepth = 5;

  std::string Field(std::string_view key) {
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) return Value(1);
    if (key == "messages") {
      std::string out = "[";
      const int n = in_.ConsumeIntegralInRange<int>(0, 3);
      for (int i = 0; i < n; ++i) out += (i ? "," : "") + Message();
      return out + "]";
    }
    if (key == "content" || key == "prompt") {
      if (in_.ConsumeBool()) return Quote(in_.ConsumeBool() ? Text() : LongText());
      std::string out = "[";
      const int n = in_.ConsumeIntegralInRange<int>(0, 4);
      for (int i = 0; i < n; ++i) {
        out += (i ? "," : "") +
               (in_.ConsumeBool() ? Quote(Text()) : std::to_string(in_.ConsumeIntegral<int16_t>()));
      }
      return out + "]";
    }
    if (key == "tokens") {
      std::string out = "[";
      const int n = in_.ConsumeIntegralInRange<int>(0, 8);
      for (int i = 0; i < n; ++i) out += (i ? "," : "") + Number();
      return out + "]";
    }
    if (key == "logit_bias") {
      return "{" + Quote(std::to_string(in_.ConsumeIntegral<int32_t>())) + ":" + Number() + "," +
             Quote(Text()) + ":" + Number() + "}";
    }
    if (key == "stop") return "[" + Quote(Text()) + "," + Quote(LongText()) + "]";
    if (key == "tools") return "[{\"type\":\"function\",\"function\":" + Value(2) + "}]";
    if (key == "chat_template_kwargs") return "{\"flag\":" + Value(2) + "}";
    if (key == "stream_options") return "{\"include_usage\":" + Scalar() + "}";
    if (key == "model" || key == "kv_quality" || key == "tool_choice") return Quote(Text());
    return in_.ConsumeBool() ? Scalar() : Number();
  }

  std::string Message() {
    std::string out = "{\"role\":" + Quote(Text()) + ",\"content\":";
    out += in_.ConsumeBool() ? Quote(Text()) : Value(2);
    if (in_.ConsumeBool()) {
      out += ",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":" + Quote(Text()) +
             ",\"arguments\":" + (in_.ConsumeBool() ? Quote(Escape(Value(1))) : Value(1)) + "}}]";
    }
    return out + "}";
  }

  std::string Scalar() {
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        return "null";
      case 1:
        return "true";
      case 2:
        return "false";
      default:
        return Number();
    }
  }

  std::string Number() {
    static constexpr const char* kEdges[] = {"0",
                                             "-0",
                                             "1",
                                             "-1",
                                             "0.5",
                                             "1.0",
                                             "2",
                                             "16",
                                             "100",
                                             "101",
                                             "-100.5",
                                             "511",
                                             "512",
                                             "2147483647",
                                             "2147483648",
                                             "-2147483649",
                                             "9223372036854775807",
                                             "9223372036854775808",
                                             "-9223372036854775809",
                                             "18446744073709551615",
                                             "18446744073709551616",
                                             "1e308",
                                             "1e999",
                                             "-1e999",
                                             "1e-400",
                                             "4.9e-324",
                                             "123456789012345678901234567890"};
    if (in_.ConsumeBool())
      return kEdges[in_.ConsumeIntegralInRange<size_t>(0, std::size(kEdges) - 1)];
    return std::to_string(in_.ConsumeIntegralInRange<int32_t>(-1000, 100000));
  }

  std::string Key() {
    static constexpr const char* kKeys[] = {"role", "content",   "type",       "text", "function",
                                            "name", "arguments", "tool_calls", "a",    ""};
    return kKeys[in_.ConsumeIntegralInRange<size_t>(0, std::size(kKeys) - 1)];
  }

  std::string Text() {
    static constexpr const char* kWords[] = {
        "user",     "assistant",  "system",   "tool",    "text",    "lossless",
        "balanced", "aggressive", "none",     "auto",    "stories", "/models/stories.gguf",
        "<s>",      "</s>",       "\\u0000",  "\\ud800", "\\\"",    "caf\\u00e9",
        "aab",      "\xC3\xA9",   "\xFF\xFE", "\xE2\x96"};
    if (in_.ConsumeBool())
      return kWords[in_.ConsumeIntegralInRange<size_t>(0, std::size(kWords) - 1)];
    return Escape(in_.ConsumeRandomLengthString(64));
  }

  // Up to 256 KiB of one repeated unit: a long word, a long run of escapes, bad UTF-8.
  std::string LongText() {
    static constexpr const char* kUnits[] = {"a",   "ab",      " ",    "\xC3\xA9",
                                             "\\n", "\\u00e9", "\xFF", "<s>"};
    const std::string unit = kUnits[in_.ConsumeIntegralInRange<size_t>(0, std::size(kUnits) - 1)];
    const size_t length = size_t{1} << in_.ConsumeIntegralInRange<int>(4, 18);
    std::string out;
    out.reserve(length + unit.size());
    while (out.size() < length) out += unit;
    return out;
  }

  // `inner` inside arrays or objects nested from just past the bound to far past it.
  std::string Deep(const std::string& inner) {
    static constexpr int kDepths[] = {31, 32, 33, 64, 1000, 100000};
    const int depth = kDepths[in_.ConsumeIntegralInRange<size_t>(0, std::size(kDepths) - 1)];
    const bool arrays = in_.ConsumeBool();
    std::string out;
    out.reserve(static_cast<size_t>(depth) * 6 + inner.size());
    for (int i = 0; i < depth; ++i) out += arrays ? "[" : "{\"a\":";
    out += inner;
    out.append(static_cast<size_t>(depth), arrays ? ']' : '}');
    return out;
  }

  static std::string Quote(const std::string& text) { return "\"" + text + "\""; }

  // `text` as the inside of a JSON string (bytes >= 0x80 left as they are, valid or not).
  static std::string Escape(const std::string& text) {
    std::string out;
    for (const char c : text) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        out += "\\n";
      } else {
        out += c;
      }
    }
    return out;
  }

  FuzzedDataProvider& in_;
};

void CheckError(const ApiError& error, std::string_view body) {
  const std::string text = kvl::server::ErrorBody(error);
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (text.size() > kMaxErrorBodyBytes || parsed.is_discarded() || error.message.empty() ||
      error.http_status < 400 || error.http_status > 499) {
    std::fprintf(stderr, "bad error answer (%zu bytes, status %d) to a %zu-byte body: %.300s\n",
                 text.size(), error.http_status, body.size(), text.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture fixture;
  if (size < 2) return 0;
  const int route = data[0] % 5;
  const ApiContext& context = (data[0] / 5) % 2 ? fixture.jinja : fixture.plain;
  std::string body;
  if (data[1] & 0x80) {
    body.assign(reinterpret_cast<const char*>(data + 2), size - 2);
  } else {
    FuzzedDataProvider in(data + 2, size - 2);
    BodyGenerator generate(in);
    static const std::vector<std::string_view> kCompletionFields = {
        "prompt",         "model",
        "max_tokens",     "temperature",
        "top_p",          "top_k",
        "min_p",          "seed",
        "stop",           "stream",
        "logit_bias",     "kv_quality",
        "logprobs",       "n",
        "stream_options", "return_token_ids",
        "ignore_eos",     "repetition_penalty",
        "suffix",         "echo",
        "best_of"};
    static const std::vector<std::string_view> kChatFields = {"messages",
                                                              "model",
                                                              "max_tokens",
                                                              "max_completion_tokens",
                                                              "tools",
                                                              "tool_choice",
                                                              "chat_template_kwargs",
                                                              "add_generation_prompt",
                                                              "logprobs",
                                                              "top_logprobs",
                                                              "response_format",
                                                              "logit_bias",
                                                              "stop",
                                                              "stream",
                                                              "kv_quality"};
    static const std::vector<std::string_view> kTokenizeFields = {
        "content", "add_special", "parse_special", "with_pieces", "tokens"};
    body = generate.Body(route == 0   ? kCompletionFields
                         : route <= 2 ? kChatFields
                                      : kTokenizeFields);
    if (data[1] & 1) body = generate.Value();  // any value, not only an object
  }

  switch (route) {
    case 0:
    case 1: {
      kvl::server::CompletionParams params;
      const auto endpoint = route == 0 ? kvl::server::Endpoint::kCompletions
                                       : kvl::server::Endpoint::kChatCompletions;
      if (auto error = kvl::server::ParseCompletionRequest(body, endpoint, context, &params)) {
        CheckError(*error, body);
      }
      break;
    }
    case 2: {
      std::string prompt;
      if (auto error = kvl::server::ParseApplyTemplateRequest(body, context, &prompt)) {
        CheckError(*error, body);
      }
      break;
    }
    default: {
      const kvl::server::TokenRouteAnswer answer = kvl::server::AnswerTokenRoute(
          route == 3 ? kvl::server::kTokenizePath : kvl::server::kDetokenizePath, body,
          {*fixture.tokenizer, /*max_content_bytes=*/64 << 10});
      if (answer.error) {
        CheckError(*answer.error, body);
      } else if (nlohmann::json::parse(answer.body, nullptr, false).is_discarded()) {
        std::fprintf(stderr, "the answer is not JSON: %.300s\n", answer.body.c_str());
        std::abort();
      }
      break;
    }
  }
  return 0;
}
