// The chat templates, each written out as llama.cpp's llm_chat_apply_template writes it (roles
// checked first, so every template refuses the same messages).
#include "kvl/chat_template.h"

#include <fmt/format.h>

#include <array>
#include <utility>

namespace kvl {
namespace {

constexpr std::array<std::pair<ChatTemplate, std::string_view>, 7> kNames = {{
    {ChatTemplate::kPlain, "plain"},
    {ChatTemplate::kLlama2, "llama2"},
    {ChatTemplate::kChatMl, "chatml"},
    {ChatTemplate::kZephyr, "zephyr"},
    {ChatTemplate::kMistral, "mistral"},
    {ChatTemplate::kLlama3, "llama3"},
    {ChatTemplate::kGemma, "gemma"},
}};

bool Contains(std::string_view text, std::string_view marker) {
  return text.find(marker) != std::string_view::npos;
}

// "developer" is OpenAI's newer name for the system role.
std::string_view NormalRole(std::string_view role) {
  return role == "developer" ? std::string_view("system") : role;
}

// Templates with no system turn (llama-2 inside the first [INST], Mistral, Gemma) put the system
// text before the first user message.
std::vector<ChatMessage> FoldSystemIntoFirstUser(const std::vector<ChatMessage>& messages,
                                                 std::string_view separator) {
  std::vector<ChatMessage> out;
  std::string system;
  for (const ChatMessage& m : messages) {
    if (NormalRole(m.role) == "system") {
      if (!system.empty()) system += separator;
      system += m.content;
      continue;
    }
    out.push_back({std::string(NormalRole(m.role)), m.content});
    if (!system.empty() && out.back().role == "user") {
      out.back().content = system + std::string(separator) + out.back().content;
      system.clear();
    }
  }
  if (!system.empty()) out.insert(out.begin(), ChatMessage{"user", system});
  return out;
}

std::string ApplyLlama2(const std::vector<ChatMessage>& messages) {
  std::string out;
  std::string system;
  bool first_user = true;
  for (const ChatMessage& m : messages) {
    const std::string_view role = NormalRole(m.role);
    if (role == "system") {
      system += m.content;
    } else if (role == "user") {
      out += first_user ? "[INST] " : "<s>[INST] ";
      if (!system.empty()) {
        out += fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n", system);
        system.clear();
      }
      out += m.content + " [/INST]";
      first_user = false;
    } else {
      out += " " + m.content + " </s>";
    }
  }
  return out;
}

}  // namespace

std::string_view ChatTemplateName(ChatTemplate t) {
  for (const auto& [value, name] : kNames) {
    if (value == t) return name;
  }
  return "plain";
}

StatusOr<ChatTemplate> ParseChatTemplateName(std::string_view name) {
  std::string known;
  for (const auto& [value, text] : kNames) {
    if (text == name) return value;
    known += known.empty() ? "" : ", ";
    known += text;
  }
  return InvalidArgumentError(
      fmt::format("unknown chat template '{}' (known: {})", name, known));
}

ChatTemplate DetectChatTemplate(std::string_view src) {
  if (Contains(src, "<|im_start|>")) return ChatTemplate::kChatMl;
  if (Contains(src, "<|start_header_id|>") && Contains(src, "<|end_header_id|>")) {
    return ChatTemplate::kLlama3;
  }
  if (Contains(src, "<start_of_turn>")) return ChatTemplate::kGemma;
  if (Contains(src, "[INST]")) {
    return Contains(src, "<<SYS>>") ? ChatTemplate::kLlama2 : ChatTemplate::kMistral;
  }
  if (Contains(src, "<|user|>") && Contains(src, "<|assistant|>")) return ChatTemplate::kZephyr;
  return ChatTemplate::kPlain;
}

StatusOr<std::string> ApplyChatTemplate(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return InvalidArgumentError("messages must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string_view role = NormalRole(messages[i].role);
    if (role != "system" && role != "user" && role != "assistant") {
      return InvalidArgumentError(fmt::format(
          "messages[{}].role '{}' is not one of system, developer, user, assistant", i,
          messages[i].role));
    }
  }
  std::string out;
  switch (t) {
    case ChatTemplate::kPlain:
      for (const ChatMessage& m : messages) {
        if (!out.empty()) out += "\n";
        out += m.content;
      }
      return out;
    case ChatTemplate::kLlama2:
      return ApplyLlama2(messages);
    case ChatTemplate::kChatMl:
      for (const ChatMessage& m : messages) {
        out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", NormalRole(m.role), m.content);
      }
      return out + "<|im_start|>assistant\n";
    case ChatTemplate::kZephyr:
      for (const ChatMessage& m : messages) {
        out += fmt::format("<|{}|>\n{}</s>\n", NormalRole(m.role), m.content);
      }
      return out + "<|assistant|>\n";
    case ChatTemplate::kMistral:
      for (const ChatMessage& m : FoldSystemIntoFirstUser(messages, "\n\n")) {
        out += m.role == "user" ? fmt::format("[INST] {} [/INST]", m.content)
                                : fmt::format(" {}</s>", m.content);
      }
      return out;
    case ChatTemplate::kLlama3:
      for (const ChatMessage& m : messages) {
        out += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                           NormalRole(m.role), m.content);
      }
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::kGemma:
      for (const ChatMessage& m : FoldSystemIntoFirstUser(messages, "\n\n")) {
        out += fmt::format("<start_of_turn>{}\n{}<end_of_turn>\n",
                           m.role == "assistant" ? "model" : "user", m.content);
      }
      return out + "<start_of_turn>model\n";
  }
  return InternalError("unhandled chat template");
}

}  // namespace kvl
