// `kvl chat`'s flags and their validation (the command itself: cmd_chat.cc).
#include "command_flags.h"
#include "kvl/chat_template.h"

namespace kvl::cli {

CommandFlags DeclareChatFlags(CLI::App* app, ChatArgs* chat) {
  CLI::App* cmd = app->add_subcommand(
      "chat", "interactive chat through the model's chat template (/reset, /stats, /exit)");
  cmd->add_option("-m,--model", chat->engine.model_path, "GGUF model file")->required();
  cmd->add_option("--chat-template", chat->chat_template,
                  "force a built-in chat template: plain, llama2, chatml, zephyr, mistral, "
                  "llama3, gemma (default: the model's own Jinja template)");
  cmd->add_option("--chat-template-file", chat->chat_template_file,
                  "render this Jinja chat template instead of the model's");
  AddChatTemplateLimitFlags(cmd, &chat->chat_template_limits);
  cmd->add_option("--system", chat->system, "system message that opens the conversation");
  cmd->add_option("-f,--file", chat->turns_file,
                  "read the user's turns from a file, one per line, print each reply and exit");
  AddEngineFlags(cmd, &chat->engine, &chat->kv_budget);
  cmd->add_option("-n,--n-predict", chat->num_predict,
                  "tokens per reply at most; -1 = until EOS or the context is full")
      ->capture_default_str();
  std::function<Status()> seed = AddSamplingFlags(cmd, &chat->sampling);
  return {cmd, ParsedCommand::Kind::kChat, [chat, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            return ValidateChatArgs(*chat);
          }};
}

StatusOr<EngineOptions> ChatEngineOptions(const ChatArgs& args) {
  return EngineOptionsFor(args.engine, 1, args.kv_budget);
}

Status ValidateChatArgs(const ChatArgs& args) {
  if (!args.chat_template.empty()) {
    KVL_RETURN_IF_ERROR(ParseChatTemplateName(args.chat_template).status());
    if (!args.chat_template_file.empty()) {
      return InvalidArgumentError("--chat-template and --chat-template-file exclude each other");
    }
  }
  KVL_RETURN_IF_ERROR(CheckChatTemplateLimits(args.chat_template_limits));
  KVL_RETURN_IF_ERROR(
      CheckRange("-n (--n-predict; -1 = until EOS)", args.num_predict, -1, kMaxContextTokens));
  KVL_RETURN_IF_ERROR(args.sampling.Validate());
  return ChatEngineOptions(args).status();
}

}  // namespace kvl::cli
