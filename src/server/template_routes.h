// The server's chat template: chosen once at start-up (a --chat-template-file, a forced
// built-in, or the GGUF's own template with the built-ins as its fallback) and served at
// POST /apply-template.
#pragma once

#include <memory>

#include "api_request.h"
#include "http_transport.h"
#include "kvl/chat_template.h"
#include "kvl/engine.h"
#include "kvl/server.h"

namespace kvl::server {

// INVALID_ARGUMENT or NOT_FOUND for a --chat-template-file that cannot be read, parsed or
// rendered, or an unknown --chat-template name. A GGUF template that fails is not an error: the
// built-in its markers name stands in, said once on stderr with the reason.
StatusOr<std::shared_ptr<const ChatFormatter>> LoadChatFormatter(const ServeOptions& options,
                                                                 const Engine& engine);

// POST /apply-template: {"messages": [...]} -> {"prompt": "..."}, the text a chat completion
// would run on (llama-server's endpoint); an error the template raises is a 400 naming it.
HttpResponse AnswerApplyTemplate(const ApiContext& context, std::string_view body);

}  // namespace kvl::server
