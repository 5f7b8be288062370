// The server's chat template: chosen once at start-up (a --chat-template-file, a forced
// built-in, or the GGUF's own template with the built-ins as its fallback) and served at
// POST /apply-template.
#pragma once

#include <memory>
#include <string_view>

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

// Whether a request to `path` renders the chat template (a chat completion, /apply-template).
// Those are handled on the transport's worker threads, never on an event loop: a render may take
// up to its deadline (ChatFormatterOptions::limits), and /health must answer meanwhile.
bool RendersChatTemplate(std::string_view path);

// POST /apply-template: {"messages": [...]} -> {"prompt": "..."}, the text a chat completion
// would run on (llama-server's endpoint); an error the template raises is a 400 naming it.
HttpResponse AnswerApplyTemplate(const ApiContext& context, std::string_view body);

}  // namespace kvl::server
