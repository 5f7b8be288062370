#include "webui_routes.h"

#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>

#include "api_key.h"
#include "api_request.h"
#include "webui_assets.h"

namespace kvl::server {
namespace {

// The page builds every node from text and loads nothing from elsewhere; the policy makes an
// injected <script> or inline handler inert even if a bug let one into the DOM.
constexpr std::string_view kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

HttpResponse AssetResponse(const WebUiAsset& asset) {
  return HttpResponse{200,
                      std::string(asset.content_type),
                      {{"Cache-Control", "no-cache"},
                       {"X-Content-Type-Options", "nosniff"},
                       {"Content-Security-Policy", std::string(kContentSecurityPolicy)}},
                      std::string(asset.body)};
}

HttpResponse ErrorResponse(const ApiError& error) {
  return HttpResponse{error.http_status, "application/json", {}, ErrorBody(error)};
}

// An asset name as the page links them: letters, digits and "_.-" only.
bool IsAssetName(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

nlohmann::json PredictionErrorJson(const KvPredictionError& e) {
  return {{"samples", e.samples},
          {"median_pct", e.median_pct},
          {"p90_pct", e.p90_pct},
          {"median_ratio", e.median_ratio}};
}

}  // namespace

std::string KvStateJson(const EngineMetrics& m, int64_t block_tokens, double now_ms) {
  const KvStats& kv = m.kv;
  const int64_t block_bytes = kv.blocks_total > 0 ? kv.kv_bytes_total / kv.blocks_total : 0;
  // The pool's blocks by state: every block is in exactly one of the four (blocks_raw are lent
  // out as compressed slabs and counted in blocks_used; cached blocks are free ones still
  // findable by prefix).
  const nlohmann::json pool = {{"blocks_total", kv.blocks_total},
                               {"blocks_free", kv.blocks_free - kv.blocks_cached},
                               {"blocks_cached", kv.blocks_cached},
                               {"blocks_in_use", kv.blocks_used - kv.blocks_raw},
                               {"blocks_compressed", kv.blocks_raw},
                               {"block_tokens", block_tokens},
                               {"block_bytes", block_bytes},
                               {"bytes_used", kv.kv_bytes_used},
                               {"bytes_capacity", kv.kv_bytes_total},
                               {"staging_bytes", m.kv_stream_staging_bytes},
                               {"resident_bytes_peak", m.kv_resident_bytes_peak}};
  const nlohmann::json prefix = {{"queries", kv.prefix_queries},
                                 {"query_tokens", kv.prefix_query_tokens},
                                 {"hit_tokens", kv.prefix_hit_tokens}};
  nlohmann::json tiers = nlohmann::json::array();
  for (const KvTierMetrics& t : m.kv_tiers) {
    tiers.push_back({{"name", t.name},
                     {"bytes_used", t.bytes_used},
                     {"bytes_capacity", t.capacity_bytes},
                     {"pages", t.pages},
                     {"pages_in", t.pages_in},
                     {"pages_out", t.pages_out},
                     {"lookups", t.lookups},
                     {"hit_blocks", t.hit_blocks},
                     {"hit_tokens", t.hit_tokens},
                     {"blocks_promoted", t.blocks_promoted},
                     {"promote_ms_predicted", t.promote_ms_predicted},
                     {"promote_ms_measured", t.promote_ms_measured},
                     {"promote_error", PredictionErrorJson(t.promote_error)}});
  }
  nlohmann::json actions = nlohmann::json::object();
  for (int a = 0; a < kNumKvActions; ++a) {
    const KvActionCounter& c = m.kv_actions[static_cast<size_t>(a)];
    actions[std::string(KvActionName(static_cast<KvAction>(a)))] = {
        {"pages", c.pages},
        {"bytes", c.bytes},
        {"pages_restored", c.pages_restored},
        {"predicted_ms", c.predicted_ms},
        {"measured_ms", c.measured_ms},
        {"error", PredictionErrorJson(c.error)}};
  }
  const nlohmann::json pages_now = {{"compressed", m.kv_pages_compressed},
                                    {"streamed", m.kv_pages_streamed},
                                    {"evicted", m.kv_pages_evicted},
                                    {"rebuilt", m.kv_pages_rebuilt},
                                    {"promoted_back", m.kv_pages_promoted_back}};
  auto page_maps = [](const std::vector<KvSequencePageMap>& maps) {
    nlohmann::json out = nlohmann::json::array();
    for (const KvSequencePageMap& s : maps) {
      nlohmann::json pages = nlohmann::json::array();
      for (KvPageLocation where : s.pages) pages.push_back(KvPageLocationName(where));
      out.push_back({{"request", s.request},
                     {"prompt_tokens", s.prompt_tokens},
                     {"tokens", s.tokens},
                     {"cached_prompt_tokens", s.cached_prompt_tokens},
                     {"pages", std::move(pages)}});
    }
    return out;
  };
  const nlohmann::json body = {{"time_ms", now_ms},
                               {"pool", pool},
                               {"prefix", prefix},
                               {"tiers", std::move(tiers)},
                               {"actions", std::move(actions)},
                               {"pages_now", pages_now},
                               {"requests",
                                {{"submitted", m.requests_submitted},
                                 {"running", m.requests_running},
                                 {"waiting", m.requests_waiting},
                                 {"finished", m.requests_finished},
                                 {"preemptions", m.preemptions},
                                 {"steps", m.steps},
                                 {"tokens_prefilled", m.tokens_prefilled},
                                 {"tokens_generated", m.tokens_generated}}},
                               {"sequences", page_maps(m.kv_sequences)},
                               {"sequences_ended", page_maps(m.kv_sequences_ended)}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<HttpResponse> WebUiRoutes::Answer(const HttpRequest& request) const {
  if (request.method != "GET" && request.method != "HEAD") return std::nullopt;
  if (request.path == "/v1/kv/state") return KvState(request);
  if (request.path == "/v1/kv/blocks") return KvBlocks(request);
  if (!options_.serve_page) return std::nullopt;
  std::string_view asset_name;
  constexpr std::string_view kAssetPrefix = "/webui/";
  if (request.path == "/") {
    asset_name = "index.html";
  } else if (request.path.starts_with(kAssetPrefix) &&
             IsAssetName(std::string_view(request.path).substr(kAssetPrefix.size()))) {
    asset_name = std::string_view(request.path).substr(kAssetPrefix.size());
  } else {
    return std::nullopt;
  }
  const WebUiAsset* asset = FindWebUiAsset(asset_name);
  if (asset == nullptr) {
    return ErrorResponse(ApiError{404, fmt::format("no web page asset {}", asset_name),
                                  "invalid_request_error", "", "not_found"});
  }
  return AssetResponse(*asset);
}

HttpResponse WebUiRoutes::KvState(const HttpRequest& request) const {
  if (!options_.api_key.empty() && !CarriesApiKey(request, options_.api_key)) {
    return ErrorResponse(MissingApiKeyError());
  }
  const Engine* engine = options_.engine();
  if (engine == nullptr) {
    return ErrorResponse(ApiError{503, "the model is loading", "server_error", "", "unavailable"});
  }
  const double now_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  return HttpResponse{200,
                      "application/json",
                      {{"Cache-Control", "no-store"}},
                      KvStateJson(engine->Metrics(), engine->options().block_tokens, now_ms)};
}

std::string KvBlocksJson(const KvEventsReport& r) {
  const nlohmann::json body = {
      {"block_size", r.block_size},
      {"events_through", r.events_through},
      {"media", {{r.medium, r.hashes}}},
      {"events",
       {{"queued", r.events_queued},
        {"dropped", r.events_dropped},
        {"batches_sent", r.batches_sent},
        {"replays_served", r.replays_served}}}};
  return body.dump();
}

HttpResponse WebUiRoutes::KvBlocks(const HttpRequest& request) const {
  if (!options_.api_key.empty() && !CarriesApiKey(request, options_.api_key)) {
    return ErrorResponse(MissingApiKeyError());
  }
  if (!options_.kv_events) {
    return ErrorResponse(ApiError{404, "no KV events: start kvl serve with --kv-events ADDRESS",
                                  "invalid_request_error", "", "not_found"});
  }
  if (options_.engine() == nullptr) {
    return ErrorResponse(ApiError{503, "the model is loading", "server_error", "", "unavailable"});
  }
  return HttpResponse{200,
                      "application/json",
                      {{"Cache-Control", "no-store"}},
                      KvBlocksJson(options_.kv_events())};
}

}  // namespace kvl::server
