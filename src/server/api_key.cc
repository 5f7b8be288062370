#include "api_key.h"

#include <algorithm>

namespace kvl::server {

bool CarriesApiKey(const HttpRequest& request, std::string_view key) {
  std::string_view value = request.Header("Authorization");
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() ||
      !std::equal(kScheme.begin(), kScheme.end(), value.begin(), [](char a, char b) {
        return a == (b >= 'A' && b <= 'Z' ? static_cast<char>(b - 'A' + 'a') : b);
      })) {
    return false;
  }
  value.remove_prefix(kScheme.size());
  const size_t key_at = value.find_first_not_of(" \t");
  if (key_at == 0 || key_at == std::string_view::npos) return false;  // "BearerKEY" or no key
  value.remove_prefix(key_at);
  if (value.size() != key.size()) return false;
  // Every byte compared whatever the first difference, so response times do not reveal how
  // much of a guessed key was right.
  unsigned char differ = 0;
  for (size_t i = 0; i < key.size(); ++i) {
    differ |= static_cast<unsigned char>(value[i] ^ key[i]);
  }
  return differ == 0;
}

ApiError MissingApiKeyError() {
  return ApiError{401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                  "invalid_request_error", "", "invalid_api_key"};
}

bool ApiKeyGate::Admits(const HttpRequest& request) const {
  // /v1/models is open as llama-server leaves it: a client lists the model before it has a key.
  if (key_.empty() || request.path == "/health" || request.path == "/v1/models") return true;
  if (std::find(open_routes_.begin(), open_routes_.end(), request.path) != open_routes_.end()) {
    return true;
  }
  return CarriesApiKey(request, key_);
}

}  // namespace kvl::server
