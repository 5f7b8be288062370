// The field table: every field llama-server (tools/server/README.md, POST /completion and the
// OpenAI routes) and vLLM (vllm/entrypoints/openai/protocol.py, CompletionRequest and
// ChatCompletionRequest) document, and OpenAI's own, with what kvlattice does with it.
#include "request_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

namespace kvl::server {
namespace {

// Which endpoints a field belongs to.
enum EndpointSet : uint8_t {
  kCmpl = 1,    // /v1/completions
  kChat = 2,    // /v1/chat/completions
  kNative = 4,  // llama-server's /completion
  kOpenAi = kCmpl | kChat,
  kAll = kCmpl | kChat | kNative,
};

uint8_t Bit(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kCompletions:
      return kCmpl;
    case Endpoint::kChatCompletions:
      return kChat;
    case Endpoint::kLlamaCompletion:
      return kNative;
  }
  return 0;
}

struct FieldRule {
  std::string_view name;
  uint8_t endpoints;
  // Empty: honoured (read by api_request.cc). Else the JSON array of the values that leave the
  // unimplemented feature off, the only values accepted.
  std::string_view off_values;
  // A field that only tunes another feature (dry_base tunes dry_multiplier): any value passes
  // while that feature is off.
  std::string_view tunes = {};
  // What the field asks for, in the refusal.
  std::string_view feature = {};
};

constexpr FieldRule kRules[] = {
    // Honoured everywhere: OpenAI's, vLLM's and llama-server's sampling and stopping fields.
    {"model", kAll, ""},
    {"stream", kAll, ""},
    {"stop", kAll, ""},
    {"temperature", kAll, ""},
    {"top_p", kAll, ""},
    {"top_k", kAll, ""},
    {"min_p", kAll, ""},
    {"seed", kAll, ""},
    {"logit_bias", kAll, ""},
    {"frequency_penalty", kAll, ""},
    {"presence_penalty", kAll, ""},
    {"repetition_penalty", kAll, ""},  // vLLM's name
    {"repeat_penalty", kAll, ""},      // llama-server's
    {"repeat_last_n", kAll, ""},
    {"ignore_eos", kAll, ""},
    {"max_tokens", kAll, ""},
    {"n_predict", kAll, ""},
    {"samplers", kAll, ""},
    {"response_format", kAll, ""},
    {"json_schema", kAll, ""},
    {"grammar", kAll, ""},
    {"kv_quality", kAll, ""},
    // An end user's id, for the provider's abuse monitoring: it never changes the output.
    {"user", kAll, ""},
    {"n_probs", kNative, ""},
    {"return_tokens", kNative, ""},
    {"prompt", kCmpl | kNative, ""},
    {"max_completion_tokens", kOpenAi, ""},
    {"stream_options", kOpenAi, ""},
    {"return_token_ids", kOpenAi, ""},
    {"logprobs", kOpenAi, ""},
    {"messages", kChat, ""},
    {"top_logprobs", kChat, ""},
    {"tools", kChat, ""},
    {"tool_choice", kChat, ""},
    {"parallel_tool_calls", kChat, ""},
    {"reasoning_format", kChat, ""},
    {"chat_template_kwargs", kChat, ""},
    {"add_generation_prompt", kChat, ""},
    // Prefixes are always reused, exactly (the same tokens as without the cache).
    {"cache_prompt", kAll, "[true]", {}, "a run without the prefix cache"},
    // Any free sequence takes a request.
    {"id_slot", kAll, "[-1]", {}, "a named slot"},
    {"n", kAll, "[1]", {}, "several choices"},
    {"n_cmpl", kAll, "[1]", {}, "several completions"},
    {"best_of", kOpenAi, "[1]", {}, "best-of sampling"},
    {"echo", kOpenAi, "[false]", {}, "the prompt echoed"},
    {"suffix", kCmpl, "[\"\"]", {}, "insertion (a suffix)"},
    {"n_probs", kOpenAi, "[0]", {}, "llama-server's probabilities (use logprobs)"},
    // A plain prompt renders no tools: only the values that ask for no call pass.
    {"tools", kCmpl | kNative, "[[]]", {}, "tools (send them to /v1/chat/completions)"},
    {"tool_choice", kCmpl | kNative, "[\"none\"]", {},
     "a tool call (send it to /v1/chat/completions)"},
    // llama-server's samplers kvlattice does not have, at their off values.
    {"dynatemp_range", kAll, "[0]", {}, "dynamic temperature"},
    {"dynatemp_exponent", kAll, "[1]", "dynatemp_range"},
    {"typical_p", kAll, "[1]", {}, "locally typical sampling"},
    {"top_n_sigma", kAll, "[-1]", {}, "top-n-sigma sampling"},
    {"xtc_probability", kAll, "[0]", {}, "XTC sampling"},
    {"xtc_threshold", kAll, "[]", "xtc_probability"},
    {"dry_multiplier", kAll, "[0]", {}, "DRY repetition penalty"},
    {"dry_base", kAll, "[]", "dry_multiplier"},
    {"dry_allowed_length", kAll, "[]", "dry_multiplier"},
    {"dry_penalty_last_n", kAll, "[]", "dry_multiplier"},
    {"dry_sequence_breakers", kAll, "[]", "dry_multiplier"},
    {"mirostat", kAll, "[0]", {}, "Mirostat sampling"},
    {"mirostat_tau", kAll, "[]", "mirostat"},
    {"mirostat_eta", kAll, "[]", "mirostat"},
    {"min_keep", kAll, "[0]", {}, "a minimum of candidates kept"},
    {"n_keep", kAll, "[0]", {}, "context shifting"},
    {"n_discard", kAll, "[0]", {}, "context shifting"},
    {"n_indent", kAll, "[0]", {}, "a minimum indentation"},
    {"n_cache_reuse", kAll, "[0]", {}, "KV shifting to reuse chunks"},
    {"t_max_predict_ms", kAll, "[0]", {}, "a time limit on generation"},
    {"timings_per_token", kAll, "[false]", {}, "timings on every chunk"},
    {"return_progress", kAll, "[false]", {}, "prompt progress chunks"},
    {"post_sampling_probs", kAll, "[false]", {}, "probabilities after the sampler chain"},
    {"lora", kAll, "[[]]", {}, "LoRA adapters"},
    // vLLM's extensions.
    {"use_beam_search", kAll, "[false]", {}, "beam search"},
    {"length_penalty", kAll, "[]", "use_beam_search"},
    {"stop_token_ids", kAll, "[[]]", {}, "stop token ids (use stop strings)"},
    {"include_stop_str_in_output", kAll, "[false]", {}, "the stop string in the output"},
    {"min_tokens", kAll, "[0]", {}, "a minimum number of tokens"},
    {"skip_special_tokens", kAll, "[true]", {}, "special tokens printed"},
    {"spaces_between_special_tokens", kAll, "[true]", {}, "special tokens printed"},
    {"allowed_token_ids", kAll, "[]", {}, "an allowed token list (use logit_bias or grammar)"},
    {"bad_words", kAll, "[[]]", {}, "banned words"},
    {"priority", kAll, "[0]", {}, "priority scheduling"},
    {"include_reasoning", kChat, "[true]", {}, "reasoning left out"},
    {"return_tokens_as_token_ids", kAll, "[false]", {}, "tokens named by id"},
    {"continue_final_message", kChat, "[false]", {}, "continuing the last message"},
    {"add_special_tokens", kCmpl, "[true]", {}, "a prompt without BOS"},
    {"add_special_tokens", kChat, "[false]", {}, "BOS added to the template's prompt"},
    // OpenAI's.
    {"store", kOpenAi, "[false]", {}, "stored completions"},
    {"modalities", kChat, "[[\"text\"]]", {}, "output other than text"},
};

const JsonValue& OffValues(const FieldRule& rule) {
  // Parsed once per rule; kRules is constant, so the index is stable.
  static const std::vector<JsonValue> parsed = [] {
    std::vector<JsonValue> all;
    for (const FieldRule& r : kRules) {
      all.push_back(r.off_values.empty() ? JsonValue() : JsonValue::parse(std::string(r.off_values)));
    }
    return all;
  }();
  return parsed[static_cast<size_t>(&rule - kRules)];
}

const FieldRule* FindRule(std::string_view name, uint8_t endpoint) {
  for (const FieldRule& rule : kRules) {
    if (rule.name == name && (rule.endpoints & endpoint) != 0) return &rule;
  }
  return nullptr;
}

bool IsOff(const FieldRule& rule, const JsonValue& value) {
  const JsonValue& off = OffValues(rule);
  return std::find(off.begin(), off.end(), value) != off.end();
}

// Whether a field that tunes `feature` is inert: the feature is absent, null, or off.
bool FeatureIsOff(const JsonValue& body, std::string_view feature, uint8_t endpoint) {
  auto it = body.find(feature);
  if (it == body.end() || it->is_null()) return true;
  const FieldRule* rule = FindRule(feature, endpoint);
  return rule != nullptr && IsOff(*rule, *it);
}

std::string Refusal(std::string_view name, const FieldRule* rule, Endpoint endpoint) {
  constexpr std::string_view kLenient =
      " (kvl serve --lenient ignores such fields, naming them in the X-Kvl-Ignored-Fields "
      "header)";
  if (rule == nullptr) {
    const bool elsewhere = FindRule(name, kAll) != nullptr;
    return fmt::format("unknown field {}{}: kvlattice refuses what it would not honour{}",
                       BoundedQuote(name), elsewhere ? " on this endpoint" : "", kLenient);
  }
  if (!rule->tunes.empty()) {
    const FieldRule& feature = *FindRule(rule->tunes, Bit(endpoint));
    return fmt::format("'{}' tunes '{}' ({}), which kvlattice does not implement; leave both "
                       "out or send '{}': {}{}",
                       name, feature.name, feature.feature, feature.name,
                       OffValues(feature)[0].dump(), kLenient);
  }
  const JsonValue& off = OffValues(*rule);
  if (off.empty()) {
    return fmt::format("'{}' asks for {}, which kvlattice does not implement; leave it out{}",
                       name, rule->feature, kLenient);
  }
  return fmt::format("'{}' asks for {}, which kvlattice does not implement; send {} or leave "
                     "it out{}",
                     name, rule->feature, off.size() == 1 ? off[0].dump() : off.dump(), kLenient);
}

}  // namespace

std::optional<ApiError> CheckRequestFields(JsonValue* body, Endpoint endpoint, bool lenient,
                                           std::vector<std::string>* ignored) {
  if (!body->is_object()) return std::nullopt;  // the parser names that problem
  const uint8_t bit = Bit(endpoint);
  std::vector<std::string> refused;
  for (auto it = body->begin(); it != body->end(); ++it) {
    if (it->is_null()) continue;
    const FieldRule* rule = FindRule(it.key(), bit);
    bool ok = rule != nullptr && rule->off_values.empty();
    if (rule != nullptr && !ok) {
      ok = rule->tunes.empty() ? IsOff(*rule, *it) : FeatureIsOff(*body, rule->tunes, bit);
    }
    if (ok) continue;
    if (!lenient) {
      return ApiError{400, Refusal(it.key(), rule, endpoint), "invalid_request_error",
                      it.key(), "unsupported_field"};
    }
    refused.push_back(it.key());
  }
  for (const std::string& name : refused) body->erase(name);
  ignored->insert(ignored->end(), refused.begin(), refused.end());
  return std::nullopt;
}

}  // namespace kvl::server
