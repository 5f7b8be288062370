// The web page's files, embedded in the binary at build time (CMake writes webui_assets.cc from
// src/server/webui/), so that `kvl serve` needs no network and no files beside it.
#pragma once

#include <span>
#include <string_view>

namespace kvl::server {

struct WebUiAsset {
  std::string_view name;          // file name in src/server/webui/, e.g. "app.js"
  std::string_view content_type;  // "text/javascript; charset=utf-8", ...
  std::string_view body;
};

std::span<const WebUiAsset> WebUiAssets();
// The asset named `name`, or nullptr.
const WebUiAsset* FindWebUiAsset(std::string_view name);

}  // namespace kvl::server
