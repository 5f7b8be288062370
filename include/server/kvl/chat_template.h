// Chat messages -> one prompt string, through the model's chat template. The common templates are
// recognised by their markers in the GGUF's `tokenizer.chat_template` (as llama.cpp does) and
// written out here in C++: no Jinja interpreter runs a model's template.
//
// A pure function of its inputs; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

}  // namespace kvl
