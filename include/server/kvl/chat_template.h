// Chat messages -> one prompt string, through the model's chat template.
//
// By default the GGUF's own `tokenizer.chat_template` is rendered as Jinja (kvl/jinja.h), as HF
// transformers and llama.cpp render it. The built-in formats below, recognised by their markers
// in the template text as llama.cpp does, remain as the fallback for a model without a template
// or with one that fails to render, and for `--chat-template NAME`.
//
// Pure functions and immutable objects; thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/engine.h"
#include "kvl/jinja.h"
#include "kvl/status.h"

namespace kvl {

enum class ChatTemplate {
  // No template in the model (stories260K, base models): the messages' contents joined by "\n",
  // with no role markers and nothing after them, so one user message is its text as it is.
  kPlain,
  kLlama2,   // [INST] <<SYS>>\n..\n<</SYS>>\n\nuser [/INST] assistant </s><s>[INST] ...
  kChatMl,   // <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
  kZephyr,   // <|role|>\ncontent</s>\n ... <|assistant|>\n
  kMistral,  // [INST] system\n\nuser [/INST] assistant</s>[INST] ...
  kLlama3,   // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...
  kGemma,    // <start_of_turn>user\ncontent<end_of_turn>\n ... <start_of_turn>model\n
};

struct ChatMessage {
  std::string role;  // system | user | assistant ("developer" is read as system)
  std::string content;
};

// "plain", "llama2", "chatml", "zephyr", "mistral", "llama3", "gemma".
std::string_view ChatTemplateName(ChatTemplate t);
// The names above; INVALID_ARGUMENT listing them for anything else.
StatusOr<ChatTemplate> ParseChatTemplateName(std::string_view name);
// The template a Jinja source text is, by its markers; kPlain for an empty or unknown one.
ChatTemplate DetectChatTemplate(std::string_view jinja_source);

// The prompt for `messages`, ending with the assistant's turn opened (where the template has
// one). INVALID_ARGUMENT for an unknown role or no messages.
StatusOr<std::string> ApplyChatTemplate(ChatTemplate t, const std::vector<ChatMessage>& messages);

// What a chat template is rendered with, besides the special tokens' texts.
struct ChatInputs {
  // [{role, content, ...}] as the client sent them (tool_calls, tool_call_id, name kept), with
  // a content given as text parts joined into one string.
  jinja::Value messages;
  jinja::Value tools;  // undefined: no tools
  bool add_generation_prompt = true;
  jinja::Context kwargs;  // chat_template_kwargs (enable_thinking, ...), passed as variables
};

struct ChatFormatterOptions {
  std::string bos_token;  // the texts `bos_token` and `eos_token` print in the template
  std::string eos_token;
  // Drop a bos_token the template printed at the start: the tokenizer adds BOS itself, and the
  // prompt is tokenized as text (llama.cpp drops it for the same reason).
  bool strip_bos = false;
  // What each render of a Jinja template may spend (steps, bytes, seconds), the test render at
  // load included; passing it is an error naming the limit.
  jinja::RenderOptions limits;
};

// A model's chat format: a Jinja template or a built-in one.
class ChatFormatter {
 public:
  static ChatFormatter Builtin(ChatTemplate t);
  // `source` as Jinja; INVALID_ARGUMENT (naming `origin`, the line and the construct) for one
  // that does not parse or fails to render a one-message conversation.
  static StatusOr<ChatFormatter> FromJinja(std::string_view source, std::string_view origin,
                                           ChatFormatterOptions options);
  // A model's default: its GGUF template as Jinja, or where it has none or that one fails, the
  // built-in its markers name, with *fallback_reason saying why (empty when Jinja is used).
  static ChatFormatter ForModel(std::string_view gguf_template, ChatFormatterOptions options,
                                std::string* fallback_reason);

  // INVALID_ARGUMENT for messages the template refuses (raise_exception, an error it hits, a
  // role or tools a built-in cannot write), naming the cause.
  StatusOr<std::string> Apply(const ChatInputs& inputs) const;
  // "jinja (<origin>)" or the built-in's name.
  const std::string& description() const { return description_; }
  bool is_jinja() const { return jinja_ != nullptr; }
  // The Jinja template's text ("" for a built-in): the server reads which tool-call and
  // reasoning markers the model writes from it.
  const std::string& source() const { return source_; }
  // Stops the renders in progress (each at its next check) and refuses new ones, in this
  // formatter and its copies: for a server whose shutdown must not wait on a template.
  void CancelRenders() const { cancelled_->store(true); }

 private:
  std::shared_ptr<const jinja::Template> jinja_;
  ChatTemplate builtin_ = ChatTemplate::kPlain;
  ChatFormatterOptions options_;
  std::string description_;
  std::string source_;
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

// `messages` (role and text only) through `formatter`, the assistant's turn opened.
StatusOr<std::string> ApplyChatTemplate(const ChatFormatter& formatter, const std::vector<ChatMessage>& messages);

// The chat format a command line asked for: a built-in by name, a Jinja file, or (both empty)
// the model's own template.
struct ChatTemplateChoice {
  std::string name;  // --chat-template
  std::string file;  // --chat-template-file
  jinja::RenderOptions limits;  // --chat-template-steps, --chat-template-timeout
};

// The formatter for `engine`'s model: bos/eos texts from its vocabulary, a leading BOS dropped
// (the engine adds it). An unknown name, or a file that cannot be read, parsed or rendered, is
// an error; a GGUF template that fails (it does not parse, or its test render fails or passes
// the limits) is not: the built-in its markers name stands in, with *fallback_reason saying why
// (for the caller to print once).
StatusOr<ChatFormatter> LoadChatFormatter(const Engine& engine, const ChatTemplateChoice& choice,
                                          std::string* fallback_reason);

}  // namespace kvl
