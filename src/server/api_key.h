// --api-key: which routes it guards and how a request shows the key. Every route needs the key
// except /health (load balancers probe it), /v1/models (as llama-server), the web page and its assets (the page asks for the
// key itself) and the routes the operator opened with --api-key-open (e.g. /metrics for a
// Prometheus without credentials), as llama-server guards all but its health and model routes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "api_request.h"
#include "http_transport.h"

namespace kvl::server {

// "Authorization: Bearer KEY": the scheme in any case (RFC 9110 makes it case-insensitive), one
// or more spaces, then the key exactly (compared in time independent of where it differs).
bool CarriesApiKey(const HttpRequest& request, std::string_view key);

// The 401 a request without the key gets.
ApiError MissingApiKeyError();

// Thread-safe (immutable after construction).
class ApiKeyGate {
 public:
  // `key` empty: every request passes. `open_routes`: paths that need no key (validated by the
  // command line against kvl::kApiKeyOpenableRoutes).
  ApiKeyGate(std::string key, std::vector<std::string> open_routes)
      : key_(std::move(key)), open_routes_(std::move(open_routes)) {}
  // Whether a request for one of the server's own routes (not the page's) may be answered.
  bool Admits(const HttpRequest& request) const;

 private:
  std::string key_;
  std::vector<std::string> open_routes_;
};

}  // namespace kvl::server
