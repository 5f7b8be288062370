// `kvl serve`'s web page: the chat page and its assets (embedded in the binary at build time),
// and GET /v1/kv/state, the KV memory's figures as JSON that the page polls.
#pragma once

#include <httplib.h>

#include <functional>
#include <string>
#include <string_view>

#include "kvl/engine.h"

namespace kvl::server {

struct WebUiRoutesOptions {
  bool serve_page = true;  // false (--no-webui): GET / and the assets fall through to a 404
  std::string api_key;     // required on /v1/kv/state as on every /v1/ route, when set
  // The engine once the model is loaded; nullptr before (the state endpoint answers 503).
  std::function<const Engine*()> engine;
};

// Registers the routes on `http`; call it before the server's catch-all handlers, which httplib
// tries after these.
void RegisterWebUiRoutes(WebUiRoutesOptions options, httplib::Server* http);

// The state endpoint's body: the pool's blocks by state, each tier, the prefix cache, the page
// actions with predicted and measured bring-back times, and each running request's page map.
// `now_ms`: the server's clock, so that the page turns counters into rates.
std::string KvStateJson(const EngineMetrics& metrics, int64_t block_tokens, double now_ms);

}  // namespace kvl::server
