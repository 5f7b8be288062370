// `kvl serve`: an OpenAI-compatible HTTP server over one Engine. POST /v1/completions and
// /v1/chat/completions (plain or streamed as server-sent events), GET /v1/models, /health and
// /metrics (Prometheus text), POST /apply-template (the chat prompt a request makes), and
// llama-server's own POST /completion, GET /props and /slots. Sees only the engine's public API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/engine.h"
#include "kvl/jinja.h"
#include "kvl/status.h"

namespace kvl {

// --kv-events: what the KV events publisher (kvl/kv_events.h, given by the CLI) reports, for
// GET /v1/kv/blocks and /metrics.
struct KvEventsReport {
  std::string medium;            // the pool's medium name in the events ("GPU")
  int32_t block_size = 0;
  // The prefix index's hashes at the end of the last step that changed it, read from the index
  // itself, and how many events had been queued up to that point.
  std::vector<uint64_t> hashes;
  int64_t events_through = 0;
  int64_t events_queued = 0;
  int64_t events_dropped = 0;
  int64_t batches_sent = 0;
  int64_t replays_served = 0;
};

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (printed on stderr)
  std::string alias;               // --alias: the model's name in replies (empty: the file's stem)
  // --lenient: request fields this server does not honour are ignored, named in an
  // X-Kvl-Ignored-Fields header and a log line, instead of refused with a 400.
  bool lenient = false;
  std::string api_key;             // empty: no key needed
  // Routes that need no key even with api_key set (--api-key-open), each one of
  // kApiKeyOpenableRoutes. /health never needs one; every other route does.
  std::vector<std::string> api_key_open_routes;
  // Threads that run the handlers of requests with large bodies (long prompts to tokenize,
  // templates to render); smaller ones run on the transport's event loops, and connections
  // cost no thread. 0: 4.
  int http_threads = 0;
  std::string chat_template;       // empty: the GGUF's own (Jinja); else a ChatTemplateName
  std::string chat_template_file;  // a Jinja chat template to render instead of the GGUF's
  // What each render of a Jinja chat template may spend (--chat-template-steps,
  // --chat-template-timeout): a request whose render passes it gets a 400 naming the limit.
  jinja::RenderOptions chat_template_limits;
  int64_t max_body_bytes = 8 << 20;
  int keep_alive_seconds = 5;
  // From a request's first byte to its last: a client that trickles it (slowloris) is cut off.
  double request_timeout_seconds = 30;
  // The origin browsers may call the API from ("*": any), sent as Access-Control-Allow-Origin
  // on every response, with CORS preflights (OPTIONS) answered. Empty: no CORS (the default).
  std::string cors_origin;
  double shutdown_grace_seconds = 5;  // running requests may finish this long after a signal
  // The chat page at GET / and its assets (--no-webui: off). GET /v1/kv/state, the KV memory's
  // figures the page shows, is served either way: it is API, not page.
  bool webui = true;
  // Set with --kv-events (the CLI wires the publisher into engine.kv_block_observer too): GET
  // /v1/kv/blocks lists the blocks the events describe. Empty: that route answers 404.
  std::function<KvEventsReport()> kv_events;
};

// The routes --api-key-open may open: read-only ones that run no model (a scraper, a token
// counter). The completions, /apply-template and /v1/kv/state always need the key.
inline constexpr std::string_view kApiKeyOpenableRoutes[] = {"/metrics", "/tokenize",
                                                              "/detokenize"};

// Listens until SIGINT or SIGTERM, then stops accepting, lets running requests finish for the
// grace period (cancelling those still running after it) and returns OK. Errors: the address
// cannot be bound, the model does not load, an unknown chat template.
Status Serve(const ServeOptions& options);

}  // namespace kvl
