// `kvl serve`'s web page: the chat page and its assets (embedded in the binary at build time),
// and GET /v1/kv/state, the KV memory's figures as JSON that the page polls.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "http_transport.h"
#include "kvl/engine.h"
#include "kvl/server.h"  // KvEventsReport

namespace kvl::server {

struct WebUiRoutesOptions {
  bool serve_page = true;  // false (--no-webui): GET / and the assets fall through to a 404
  std::string api_key;     // required on /v1/kv/state as on every /v1/ route, when set
  // The engine once the model is loaded; nullptr before (the state endpoint answers 503).
  std::function<const Engine*()> engine;
  // --kv-events: the publisher's report for /v1/kv/blocks; empty: not publishing.
  std::function<KvEventsReport()> kv_events;
};

// GET (or HEAD) /, /webui/ASSET, /v1/kv/state and /v1/kv/blocks. Thread-safe.
class WebUiRoutes {
 public:
  explicit WebUiRoutes(WebUiRoutesOptions options)
      : options_(std::move(options)), start_(std::chrono::steady_clock::now()) {}
  // The answer when `request` is one of these routes; nullopt for any other (the server's own).
  std::optional<HttpResponse> Answer(const HttpRequest& request) const;

 private:
  HttpResponse KvState(const HttpRequest& request) const;
  HttpResponse KvBlocks(const HttpRequest& request) const;

  WebUiRoutesOptions options_;
  std::chrono::steady_clock::time_point start_;  // the state's clock starts with the server
};

// The state endpoint's body: the pool's blocks by state, each tier, the prefix cache, the page
// actions with predicted and measured bring-back times, and each running request's page map.
// `now_ms`: the server's clock, so that the page turns counters into rates.
std::string KvStateJson(const EngineMetrics& metrics, int64_t block_tokens, double now_ms);

// /v1/kv/blocks (--kv-events): the blocks held per medium, by the hashes the KV events carry,
// {"block_size": 16, "events_through": N, "media": {"GPU": [hash, ...]}, "events": {...}}:
// a subscriber that has applied the first N events of the stream holds exactly these.
std::string KvBlocksJson(const KvEventsReport& report);

}  // namespace kvl::server
