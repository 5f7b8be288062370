// ChatFormatter: a model's chat template rendered as Jinja, or a built-in format.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "kvl/chat_template.h"

namespace kvl {
namespace {

// Every template must render this: one user turn with the assistant's turn opened. A template
// that cannot (an unsupported construct, a variable it requires and nothing sets) is not used.
jinja::Value ProbeMessages() {
  jinja::ValueMap message;
  message.Set("role", jinja::Value::String("user"));
  message.Set("content", jinja::Value::String("Hello"));
  return jinja::Value::Array({jinja::Value::Object(std::move(message))});
}

std::string TextOf(const jinja::Value& v) { return v.is_string() ? v.str() : ""; }

// The text of a special token, or "" where the vocabulary has none.
std::string TokenText(const Tokenizer& tokenizer, int32_t id) {
  return id >= 0 && id < tokenizer.vocab_size() ? tokenizer.token_text(id) : "";
}

}  // namespace

ChatFormatter ChatFormatter::Builtin(ChatTemplate t) {
  ChatFormatter f;
  f.builtin_ = t;
  f.description_ = std::string(ChatTemplateName(t));
  return f;
}

StatusOr<ChatFormatter> ChatFormatter::FromJinja(std::string_view source, std::string_view origin,
                                                 ChatFormatterOptions options) {
  StatusOr<jinja::Template> parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) {
    return InvalidArgumentError(fmt::format("chat template {}: {}", origin, parsed.status().message()));
  }
  ChatFormatter f;
  f.jinja_ = std::make_shared<const jinja::Template>(std::move(*parsed));
  f.options_ = std::move(options);
  f.description_ = fmt::format("jinja ({})", origin);
  f.source_ = std::string(source);
  ChatInputs probe;
  probe.messages = ProbeMessages();
  if (StatusOr<std::string> out = f.Apply(probe); !out.ok()) {
    return InvalidArgumentError(fmt::format("chat template {} fails on a one-message conversation: {}", origin,
                                            out.status().message()));
  }
  return f;
}

ChatFormatter ChatFormatter::ForModel(std::string_view gguf_template, ChatFormatterOptions options,
                                      std::string* fallback_reason) {
  fallback_reason->clear();
  if (gguf_template.empty()) {
    *fallback_reason = "the model has no tokenizer.chat_template";
    return Builtin(ChatTemplate::kPlain);
  }
  StatusOr<ChatFormatter> jinja = FromJinja(gguf_template, "the GGUF's tokenizer.chat_template", std::move(options));
  if (jinja.ok()) return std::move(*jinja);
  *fallback_reason = jinja.status().message();
  return Builtin(DetectChatTemplate(gguf_template));
}

StatusOr<std::string> ChatFormatter::Apply(const ChatInputs& inputs) const {
  if (!inputs.messages.is_array() || inputs.messages.items().empty()) {
    return InvalidArgumentError("messages must not be empty");
  }
  if (jinja_ == nullptr) {
    if (!inputs.tools.is_undefined()) {
      return InvalidArgumentError(fmt::format(
          "the built-in chat template '{}' cannot write tools (the model has no Jinja template that "
          "renders them)",
          description_));
    }
    std::vector<ChatMessage> messages;
    for (const jinja::Value& m : inputs.messages.items()) {
      const jinja::Value* role = m.is_object() ? m.map().Find("role") : nullptr;
      const jinja::Value* content = m.is_object() ? m.map().Find("content") : nullptr;
      messages.push_back({role ? TextOf(*role) : "", content ? TextOf(*content) : ""});
    }
    return ApplyChatTemplate(builtin_, messages);
  }
  jinja::Context context = {{"messages", inputs.messages}};
  if (!inputs.tools.is_undefined()) context.emplace_back("tools", inputs.tools);
  context.emplace_back("add_generation_prompt", jinja::Value::Bool(inputs.add_generation_prompt));
  context.emplace_back("bos_token", jinja::Value::String(options_.bos_token));
  context.emplace_back("eos_token", jinja::Value::String(options_.eos_token));
  for (const auto& kv : inputs.kwargs) context.push_back(kv);
  jinja::RenderOptions limits = options_.limits;
  limits.cancel = cancelled_.get();
  StatusOr<std::string> out = jinja_->Render(context, limits);
  if (!out.ok()) return InvalidArgumentError(fmt::format("chat template: {}", out.status().message()));
  if (options_.strip_bos && !options_.bos_token.empty() && out->starts_with(options_.bos_token)) {
    out->erase(0, options_.bos_token.size());
  }
  return out;
}

StatusOr<std::string> ApplyChatTemplate(const ChatFormatter& formatter, const std::vector<ChatMessage>& messages) {
  std::vector<jinja::Value> values;
  for (const ChatMessage& m : messages) {
    jinja::ValueMap message;
    message.Set("role", jinja::Value::String(m.role));
    message.Set("content", jinja::Value::String(m.content));
    values.push_back(jinja::Value::Object(std::move(message)));
  }
  ChatInputs inputs;
  inputs.messages = jinja::Value::Array(std::move(values));
  return formatter.Apply(inputs);
}

StatusOr<ChatFormatter> LoadChatFormatter(const Engine& engine, const ChatTemplateChoice& choice,
                                          std::string* fallback_reason) {
  fallback_reason->clear();
  if (!choice.name.empty()) {
    KVL_ASSIGN_OR_RETURN(ChatTemplate builtin, ParseChatTemplateName(choice.name));
    return ChatFormatter::Builtin(builtin);
  }
  ChatFormatterOptions options;
  options.limits = choice.limits;
  options.bos_token = TokenText(engine.tokenizer(), engine.tokenizer().bos());
  options.eos_token = TokenText(engine.tokenizer(), engine.tokenizer().eos());
  // Chat prompts are tokenized with BOS added (Request::add_bos, GenerateRequest's default).
  options.strip_bos = true;
  if (!choice.file.empty()) {
    std::ifstream in(choice.file, std::ios::binary);
    if (!in) return NotFoundError(fmt::format("cannot read --chat-template-file '{}'", choice.file));
    std::stringstream source;
    source << in.rdbuf();
    return ChatFormatter::FromJinja(source.str(), choice.file, std::move(options));
  }
  StatusOr<std::string> gguf = engine.model().file().GetString("tokenizer.chat_template");
  return ChatFormatter::ForModel(gguf.ok() ? *gguf : "", std::move(options), fallback_reason);
}

}  // namespace kvl
