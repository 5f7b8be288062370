#include "template_routes.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace kvl::server {
StatusOr<std::shared_ptr<const ChatFormatter>> LoadChatFormatter(const ServeOptions& options,
                                                                 const Engine& engine) {
  std::string reason;
  KVL_ASSIGN_OR_RETURN(
      ChatFormatter formatter,
      LoadChatFormatter(engine, {options.chat_template, options.chat_template_file, options.chat_template_limits},
                        &reason));
  if (!reason.empty()) {
    fmt::print(stderr, "kvl serve: {}; using the built-in chat template '{}'\n", reason,
               formatter.description());
  }
  return std::make_shared<const ChatFormatter>(std::move(formatter));
}

bool RendersChatTemplate(std::string_view path) {
  return path == "/v1/chat/completions" || path == "/apply-template";
}

HttpResponse AnswerApplyTemplate(const ApiContext& context, std::string_view body) {
  std::string prompt;
  if (std::optional<ApiError> error = ParseApplyTemplateRequest(body, context, &prompt)) {
    return HttpResponse{error->http_status, "application/json", {}, ErrorBody(*error)};
  }
  const nlohmann::json answer = {{"prompt", std::move(prompt)}};
  return HttpResponse{200,
                      "application/json",
                      {},
                      answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

}  // namespace kvl::server
