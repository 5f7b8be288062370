#include "template_routes.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvl::server {
namespace {

// The text of a special token, or "" where the vocabulary has none.
std::string TokenText(const Tokenizer& tokenizer, int32_t id) {
  return id >= 0 && id < tokenizer.vocab_size() ? tokenizer.token_text(id) : "";
}

}  // namespace

StatusOr<std::shared_ptr<const ChatFormatter>> LoadChatFormatter(const ServeOptions& options, const Engine& engine) {
  if (!options.chat_template.empty()) {
    KVL_ASSIGN_OR_RETURN(ChatTemplate builtin, ParseChatTemplateName(options.chat_template));
    return std::make_shared<const ChatFormatter>(ChatFormatter::Builtin(builtin));
  }
  ChatFormatterOptions formatter_options;
  formatter_options.bos_token = TokenText(engine.tokenizer(), engine.tokenizer().bos());
  formatter_options.eos_token = TokenText(engine.tokenizer(), engine.tokenizer().eos());
  // The engine tokenizes a chat prompt with its BOS added (Request::add_bos).
  formatter_options.strip_bos = true;
  if (!options.chat_template_file.empty()) {
    std::ifstream in(options.chat_template_file, std::ios::binary);
    if (!in) return NotFoundError(fmt::format("cannot read --chat-template-file '{}'", options.chat_template_file));
    std::stringstream source;
    source << in.rdbuf();
    KVL_ASSIGN_OR_RETURN(ChatFormatter formatter,
                         ChatFormatter::FromJinja(source.str(), options.chat_template_file, formatter_options));
    return std::make_shared<const ChatFormatter>(std::move(formatter));
  }
  StatusOr<std::string> gguf = engine.model().file().GetString("tokenizer.chat_template");
  std::string reason;
  ChatFormatter formatter = ChatFormatter::ForModel(gguf.ok() ? *gguf : "", formatter_options, &reason);
  if (!reason.empty()) {
    fmt::print(stderr, "kvl serve: {}; using the built-in chat template '{}'\n", reason, formatter.description());
  }
  return std::make_shared<const ChatFormatter>(std::move(formatter));
}

void HandleApplyTemplate(const ApiContext& context, const httplib::Request& req, httplib::Response& res) {
  std::string prompt;
  if (std::optional<ApiError> error = ParseApplyTemplateRequest(req.body, context, &prompt)) {
    res.status = error->http_status;
    return res.set_content(ErrorBody(*error), "application/json");
  }
  const nlohmann::json body = {{"prompt", std::move(prompt)}};
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

}  // namespace kvl::server
