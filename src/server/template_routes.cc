#include "template_routes.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace kvl::server {
StatusOr<std::shared_ptr<const ChatFormatter>> LoadChatFormatter(const ServeOptions& options, const Engine& engine) {
  std::string reason;
  KVL_ASSIGN_OR_RETURN(ChatFormatter formatter,
                       LoadChatFormatter(engine, {options.chat_template, options.chat_template_file}, &reason));
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
