// The HTTP side of `kvl serve`: one handler that routes, authenticates and answers every error as
// OpenAI's error JSON, over the event-driven transport (http_transport.h), and the engine's
// background step loop behind it. A completion holds no thread while it waits: the engine's
// thread turns each event into the answer's bytes and hands them to the request's responder.
#include "kvl/server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "api_key.h"
#include "api_request.h"
#include "api_response.h"
#include "http_transport.h"
#include "llama_routes.h"
#include "json_body.h"
#include "kvl/chat_template.h"
#include "reply_splitter.h"
#include "request_fields.h"
#include "server_metrics.h"
#include "template_routes.h"
#include "tokenize_routes.h"
#include "webui_routes.h"

namespace kvl {
namespace server {
namespace {

using Clock = std::chrono::steady_clock;

// Requests whose body is at most this are handled on the transport's I/O thread.
constexpr size_t kInlineBodyBytes = 16 << 10;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One event's share of a response: the text it released and, where asked for, its token's
// log-probabilities.
struct Piece {
  std::string text;
  int32_t token = -1;  // -1: text with no token (what a stop filter held back, at the end)
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// Token texts for log-probabilities, each decoded after the token before it (the tokenizer drops
// the leading space of a text's first piece), and where each starts in the completion's text.
class LogprobDecoder {
 public:
  LogprobDecoder(const Tokenizer& tokenizer, int32_t prev_token)
      : tokenizer_(tokenizer), prev_(prev_token) {}

  // Appends the logprobs of the pieces that carry a token to *out.
  void Add(const Piece& piece, Logprobs* out) {
    if (piece.token < 0) return;
    if (out->tokens.empty()) out->text_offset = offset_;
    TokenLogprobText& t = out->tokens.emplace_back();
    t.token = tokenizer_.DecodeToken(prev_, piece.token);
    t.logprob = piece.logprob;
    for (const TokenLogprob& alt : piece.top) {
      t.top.emplace_back(tokenizer_.DecodeToken(prev_, alt.token), alt.logprob);
    }
    prev_ = piece.token;
    offset_ += static_cast<int64_t>(t.token.size());
  }

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_;
  int64_t offset_ = 0;
};

// One submitted completion: what its answer needs, from submission to the last event. The
// engine's thread only hands each event over (under `mu`, held also while the request is
// submitted and its stream started, so that no event overtakes the stream's head); turning them
// into bytes is the drain's work, on the connection's I/O thread, so that the one thread that
// steps every sequence formats no JSON (and a client whose thread lags gets its frames in one
// write).
struct LiveRequest {
  LiveRequest(ResponseHead h, bool streamed, std::shared_ptr<HttpResponder> responder,
              const Tokenizer& tokenizer, int32_t prompt_last_token)
      : head(std::move(h)),
        stream(streamed),
        out(std::move(responder)),
        decoder(tokenizer, prompt_last_token) {}

  const ResponseHead head;
  const bool stream;
  RequestId id = 0;  // the engine's, set under mu before any event is handled
  const std::shared_ptr<HttpResponder> out;
  std::atomic<bool> finished{false};  // the engine sent its last event

  std::mutex mu;
  std::vector<Piece> arrived;      // under mu: handed over, not yet drained
  std::optional<TokenEvent> last;  // under mu: the finishing event, until drained
  bool drain_posted = false;       // under mu

  // The drain's own (one drain runs at a time, on the I/O thread).
  LogprobDecoder decoder;
  // A chat reply split into reasoning, content and tool calls (reply_splitter.h); empty: all
  // of it is content. A stream's splitter is fed as text arrives; a plain answer's reads the
  // whole text at the end.
  ReplyOptions reply;
  std::optional<ReplySplitter> splitter;
  std::vector<Piece> draining;
  std::vector<Piece> pieces;          // a plain answer's, until the last event
  std::vector<int32_t> held_ids;      // a stream's token ids whose text was held back
  bool text_sent = false;             // a stream's first frame with content went out
  bool head_sent = false;             // a stream's 200 and headers went out

  // llama-server's /completion (Endpoint::kLlamaCompletion): its slot, settings and counts.
  struct Native {
    int32_t slot = -1;
    bool return_tokens = false;
    int64_t prompt_tokens = 0;
    std::string prompt;
    std::vector<std::string> stop_strings;
    JsonValue settings;
    int64_t predicted = 0;             // the drain's: tokens sent so far
    std::vector<int32_t> generated;    // the drain's: every generated id
    int32_t prompt_last = -1;          // the prompt's last token: the first one's text follows it
    int32_t probs_prev = -1;           // the drain's: the token before the next one's probs
    size_t sent_bytes = 0;             // the drain's: text streamed so far
  } native;
  // X-Kvl-Ignored-Fields, where a lenient server ignored some (empty: none).
  std::string ignored_fields;

  // The engine's thread's own.
  Clock::time_point submitted = Clock::now();
  Clock::time_point first_token;
  Clock::time_point last_token;
  bool first_token_seen = false;
};

enum class ServerState { kLoading, kReady, kDraining };

struct Route {
  std::string_view path;
  std::string_view method;
};
constexpr Route kRoutes[] = {{"/apply-template", "POST"}, {"/health", "GET"},
                             {"/metrics", "GET"},         {"/v1/models", "GET"},
                             {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                             {kTokenizePath, "POST"},     {kDetokenizePath, "POST"},
                             {"/completion", "POST"},     {"/props", "GET"},
                             {"/slots", "GET"}};

HttpResponse JsonResponse(std::string body) {
  return HttpResponse{200, "application/json", {}, std::move(body)};
}

class OpenAiServer {
 public:
  explicit OpenAiServer(const ServeOptions& options)
      : options_(options),
        api_key_(options_.api_key, options_.api_key_open_routes),
        webui_({options_.webui, options_.api_key,
                [this]() -> const Engine* {
                  return state_.load() == ServerState::kLoading ? nullptr : engine_.get();
                },
                options_.kv_events}) {}
  Status Run();

 private:
  HttpServerOptions TransportOptions();
  void Dispatch(const HttpRequest& req, const std::shared_ptr<HttpResponder>& out);
  HttpResponse Health() const;
  HttpResponse Models() const;
  // llama-server's /completion: one chunk per token, and the final object.
  void AppendLlamaFrame(LiveRequest& r, const Piece& piece, std::string* frames);
  std::string LlamaFinalBody(LiveRequest& r, const TokenEvent& last, std::string text);
  std::vector<TokenProbs> LlamaProbs(LiveRequest& r, const Piece& piece);
  HttpResponse Preflight(const HttpRequest& req) const;
  void HandleCompletion(Endpoint endpoint, const HttpRequest& req,
                        const std::shared_ptr<HttpResponder>& out);
  void OnEvent(const std::shared_ptr<LiveRequest>& live, const TokenEvent& ev);
  void Drain(LiveRequest& r);
  void AppendFrame(LiveRequest& r, const Piece& piece, std::string* frames);
  void StartStream(LiveRequest& r);
  void Answer(LiveRequest& r, const TokenEvent& last, std::string frames);
  void Forget(RequestId id);
  Status LoadEngine();
  void CancelAll();
  // Returns once every submitted request was answered (its response written or its client
  // gone), or at `deadline`.
  void WaitUntilAnswered(Clock::time_point deadline);

  // Every error answer goes through here, to be counted.
  HttpResponse ErrorResponse(const ApiError& error) {
    metrics_.CountHttpError(error.http_status);
    return HttpResponse{error.http_status, "application/json", {}, ErrorBody(error)};
  }
  void SendError(HttpResponder& out, const ApiError& error) { out.Send(ErrorResponse(error)); }

  ServeOptions options_;
  // Declared before the engine, so destroyed after it: the engine's callbacks hold responders.
  std::unique_ptr<HttpServer> http_;
  std::atomic<ServerState> state_{ServerState::kLoading};
  std::unique_ptr<Engine> engine_;  // set before state_ becomes kReady
  ApiContext context_;
  // Control tokens whose text is a tool-call or reasoning marker (<|python_tag|>, [TOOL_CALLS],
  // <think>, ...), by id: set with the engine.
  std::unordered_map<int32_t, std::string> marker_tokens_;
  int64_t max_tokenize_bytes_ = 0;  // set with the engine
  ServerMetrics metrics_;
  ApiKeyGate api_key_;
  WebUiRoutes webui_;
  std::unique_ptr<SlotTable> slots_;  // set with the engine
  std::mutex active_mu_;
  std::set<RequestId> active_;  // submitted and not yet answered: cancelled at shutdown
};

HttpServerOptions OpenAiServer::TransportOptions() {
  HttpServerOptions o;
  o.host = options_.host;
  o.port = options_.port;
  o.max_body_bytes = options_.max_body_bytes;
  o.keep_alive_seconds = options_.keep_alive_seconds;
  o.request_seconds = options_.request_timeout_seconds;
  if (options_.http_threads > 0) o.worker_threads = options_.http_threads;
  // /health answers on the I/O thread itself: no queue of handlers can delay it. So does every
  // request with a small body: its handler (parse, tokenize, submit) takes well under a
  // millisecond, less than two thread hand-offs cost on a loaded machine. Large bodies (long
  // prompts to tokenize, templates to render) go to the workers, and so does every request that
  // renders the chat template, however small (a template may run until its deadline), so that no
  // handler holds the I/O thread for long.
  o.run_inline = [](const HttpRequest& req) {
    return req.path == "/health" ||
           (req.body.size() <= kInlineBodyBytes && !RendersChatTemplate(req.path));
  };
  if (!options_.cors_origin.empty()) {
    o.headers_on_every_response.push_back({"Access-Control-Allow-Origin", options_.cors_origin});
    // A named origin is one answer among possible others: caches must key on the Origin.
    if (options_.cors_origin != "*") o.headers_on_every_response.push_back({"Vary", "Origin"});
  }
  o.error_response = [this](int status, const std::string& message) {
    return ErrorResponse(ApiError{status, message, "invalid_request_error", "", ""});
  };
  return o;
}

// A browser's CORS preflight (with --cors-origin): which methods and headers the real request
// may use. The allowed origin itself is on every response.
HttpResponse OpenAiServer::Preflight(const HttpRequest& req) const {
  std::string headers(req.Header("Access-Control-Request-Headers"));
  if (headers.empty()) headers = "Authorization, Content-Type";
  return HttpResponse{204,
                      "",
                      {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                       {"Access-Control-Allow-Headers", headers},
                       {"Access-Control-Max-Age", "86400"}},
                      ""};
}

void OpenAiServer::Dispatch(const HttpRequest& req, const std::shared_ptr<HttpResponder>& out) {
  if (req.method == "OPTIONS" && !options_.cors_origin.empty()) return out->Send(Preflight(req));
  if (std::optional<HttpResponse> page = webui_.Answer(req)) {
    if (page->status >= 400) metrics_.CountHttpError(page->status);
    return out->Send(std::move(*page));
  }
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (r.path == req.path) route = &r;
  }
  if (route == nullptr) {
    return SendError(*out, ApiError{404, fmt::format("Invalid URL ({} {})", req.method, req.path),
                                    "invalid_request_error", "", "not_found"});
  }
  const std::string_view method = req.method == "HEAD" ? "GET" : std::string_view(req.method);
  if (method != route->method) {
    HttpResponse response = ErrorResponse(ApiError{
        405,
        fmt::format("Method {} not allowed on {}; use {}", req.method, req.path, route->method),
        "invalid_request_error", "", "method_not_allowed"});
    response.headers.push_back({"Allow", std::string(route->method)});
    return out->Send(std::move(response));
  }
  if (!api_key_.Admits(req)) return SendError(*out, MissingApiKeyError());
  try {
    if (req.path == "/health") return out->Send(Health());
    if (state_.load() != ServerState::kReady) {
      return SendError(
          *out, ApiError{503,
                         state_.load() == ServerState::kLoading ? "the model is loading"
                                                                : "the server is shutting down",
                         "server_error", "", "unavailable"});
    }
    if (req.path == "/metrics") {
      return out->Send(
          HttpResponse{200,
                       "text/plain; version=0.0.4; charset=utf-8",
                       {},
                       metrics_.Render(engine_->Metrics(), engine_->options().block_tokens)});
    }
    if (req.path == "/apply-template") {
      HttpResponse answer = AnswerApplyTemplate(context_, req.body);
      if (answer.status >= 400) metrics_.CountHttpError(answer.status);
      return out->Send(std::move(answer));
    }
    if (req.path == "/v1/models") return out->Send(Models());
    if (req.path == "/props") {
      const JsonValue props = PropsJson(
          {context_.context_length, slots_->size(), context_.model_name, context_.model_path,
           context_.chat->source(), fmt::format("kvlattice ({})", context_.chat->description())});
      return out->Send(
          JsonResponse(props.dump(-1, ' ', false, JsonValue::error_handler_t::replace)));
    }
    if (req.path == "/slots") {
      return out->Send(JsonResponse(slots_->Json(context_.context_length)
                                        .dump(-1, ' ', false, JsonValue::error_handler_t::replace)));
    }
    if (req.path == "/completion") return HandleCompletion(Endpoint::kLlamaCompletion, req, out);
    if (req.path == kTokenizePath || req.path == kDetokenizePath) {
      TokenRouteAnswer answer =
          AnswerTokenRoute(req.path, req.body, {engine_->tokenizer(), max_tokenize_bytes_});
      if (answer.error) return SendError(*out, *answer.error);
      return out->Send(JsonResponse(std::move(answer.body)));
    }
    HandleCompletion(
        req.path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions, req,
        out);
  } catch (const std::exception& e) {
    SendError(*out,
              ApiError{500, fmt::format("internal error: {}", e.what()), "server_error", "", ""});
  }
}

HttpResponse OpenAiServer::Health() const {
  switch (state_.load()) {
    case ServerState::kReady: {
      // The engine's watchdog: a step loop that stopped making progress is unhealthy, with why.
      const EngineHealth health = engine_->Health();
      if (!health.stalled) return JsonResponse(R"({"status":"ok"})");
      return HttpResponse{503, "application/json", {},
                          nlohmann::json{{"status", "stalled"}, {"reason", health.reason}}.dump()};
    }
    case ServerState::kLoading:
      return HttpResponse{503, "application/json", {}, R"({"status":"loading model"})"};
    case ServerState::kDraining:
      break;
  }
  return HttpResponse{503, "application/json", {}, R"({"status":"shutting down"})"};
}

HttpResponse OpenAiServer::Models() const {
  const nlohmann::json body = {{"object", "list"},
                               {"data",
                                {{{"id", context_.model_name},
                                  {"object", "model"},
                                  {"created", static_cast<int64_t>(std::time(nullptr))},
                                  {"owned_by", "kvlattice"},
                                  {"max_model_len", context_.context_length}}}}};
  return JsonResponse(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::vector<TokenProbs> OpenAiServer::LlamaProbs(LiveRequest& r, const Piece& piece) {
  if (!r.head.logprobs || piece.token < 0) return {};
  const int32_t prev = std::exchange(r.native.probs_prev, piece.token);
  return {MakeTokenProbs(engine_->tokenizer(), prev, piece.token, piece.logprob, piece.top)};
}

// One chunk per token whose text is out (a held-back token's id rides with the next chunk).
void OpenAiServer::AppendLlamaFrame(LiveRequest& r, const Piece& piece, std::string* frames) {
  LiveRequest::Native& n = r.native;
  std::vector<TokenProbs> probs = LlamaProbs(r, piece);
  if (piece.token >= 0) {
    r.held_ids.push_back(piece.token);
    n.generated.push_back(piece.token);
    ++n.predicted;
  }
  if (piece.text.empty() && probs.empty()) return;
  n.sent_bytes += piece.text.size();
  *frames += LlamaChunkFrame(piece.text, r.held_ids, n.slot, n.predicted, n.prompt_tokens, probs);
  r.held_ids.clear();
}

// /completion's final object. `text` is the whole completion (unstreamed) or "" (streamed).
std::string OpenAiServer::LlamaFinalBody(LiveRequest& r, const TokenEvent& last,
                                         std::string text) {
  LiveRequest::Native& n = r.native;
  if (!r.stream) {
    for (const Piece& piece : r.pieces) {
      if (piece.token >= 0) n.generated.push_back(piece.token);
    }
  }
  LlamaFinal f;
  f.id_slot = n.slot;
  f.model = context_.model_name;
  f.prompt = n.prompt;
  f.generation_settings = n.settings;
  FillFromLastEvent(last,
                    r.first_token_seen ? 1e3 * SecondsBetween(r.first_token, r.last_token) : 0.0,
                    &f);
  if (f.stop_type == "word") {
    f.stopping_word = StoppingWord(engine_->tokenizer(), n.stop_strings, n.prompt_last,
                                   n.generated, r.stream ? n.sent_bytes : text.size());
  }
  if (!r.stream) {
    f.content = std::move(text);
    if (n.return_tokens) f.tokens = n.generated;
    for (const Piece& piece : r.pieces) {
      std::vector<TokenProbs> probs = LlamaProbs(r, piece);
      f.probs.insert(f.probs.end(), probs.begin(), probs.end());
    }
  }
  return LlamaFinalJson(f).dump(-1, ' ', false, JsonValue::error_handler_t::replace);
}

// One frame per token (a token whose text is held back near a stop string sends a frame only
// for its log-probabilities, and its id goes out with the next frame).
void OpenAiServer::AppendFrame(LiveRequest& r, const Piece& piece, std::string* frames) {
  if (r.head.endpoint == Endpoint::kLlamaCompletion) return AppendLlamaFrame(r, piece, frames);
  Logprobs token_logprobs;
  if (r.head.logprobs) r.decoder.Add(piece, &token_logprobs);
  if (piece.token >= 0) r.held_ids.push_back(piece.token);
  if (r.splitter) {
    const ReplyDelta delta = r.splitter->Add(piece.text);
    if (delta.empty() && token_logprobs.tokens.empty()) return;
    r.text_sent = true;
    *frames += DeltaFrames(r.head, delta, token_logprobs, r.held_ids);
    r.held_ids.clear();
    return;
  }
  if (piece.text.empty() && token_logprobs.tokens.empty()) return;
  const bool first = !r.text_sent;
  r.text_sent = true;
  *frames += TextFrame(r.head, piece.text, token_logprobs, r.held_ids, first);
  r.held_ids.clear();
}

// The engine's thread: timings, then the event handed to the drain.
void OpenAiServer::OnEvent(const std::shared_ptr<LiveRequest>& live, const TokenEvent& ev) {
  LiveRequest& r = *live;
  const Clock::time_point now = Clock::now();
  // Counted before the answer goes out: a client that reads /metrics right after its response
  // finds its request there.
  if (ev.finished) {
    metrics_.ObserveFinished(SecondsBetween(r.submitted, now), ev.prompt_tokens,
                             ev.cached_prompt_tokens, ev.generated_tokens,
                             std::string(OpenAiFinishReason(ev.finish_reason)));
  }
  if (ev.token >= 0) {
    if (!r.first_token_seen) {
      metrics_.ObserveTimeToFirstToken(SecondsBetween(r.submitted, now));
      r.first_token = now;
    } else {
      metrics_.ObserveInterTokenLatency(SecondsBetween(r.last_token, now));
    }
    r.first_token_seen = true;
    r.last_token = now;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  if (SlotTable::Slot* slot = slots_->at(r.native.slot)) {
    if (ev.token >= 0) ++slot->n_decoded;
    if (ev.finished) slots_->Release(r.native.slot);
  }
  if (!ev.text.empty() || ev.token >= 0) {
    r.arrived.push_back(Piece{ev.text, ev.token, ev.logprob, ev.top_logprobs});
  }
  if (ev.finished) {
    r.last = ev;
    r.finished = true;
  }
  // A plain answer waits for the last event: nothing to write before it.
  if (!r.drain_posted && (r.stream || ev.finished)) {
    r.drain_posted = true;
    r.out->Run([this, live] { Drain(*live); });
  }
}

// A failed request's error: one the KV budget cannot hold (a prompt the scheduler found can
// never run, or a resumed one that no longer fits) is the request's size, as a prompt past the
// context is: a 400, which clients' SDKs do not retry (they retry a 5xx twice, doing the same
// work three times).
ApiError FailedRequestError(const TokenEvent& last) {
  if (last.error.code() == StatusCode::kResourceExhausted) {
    return ApiError{400, last.error.message(), "invalid_request_error", "", "kv_budget_exceeded"};
  }
  // The request's grammar allowed no token (a dead end): the request's own doing.
  if (last.error.code() == StatusCode::kInvalidArgument) {
    return ApiError{400, last.error.message(), "invalid_request_error", "", "grammar_dead_end"};
  }
  return ApiError{500, last.error.message(), "server_error", "", ""};
}

// A stream's 200 and headers, with the engine's number for the request: the web page's KV view
// follows exactly its pages.
void OpenAiServer::StartStream(LiveRequest& r) {
  r.head_sent = true;
  HttpResponse head{200,
                    "text/event-stream",
                    {{"Cache-Control", "no-cache"}, {"X-Request-Id", std::to_string(r.id)}},
                    ""};
  if (!r.ignored_fields.empty()) {
    head.headers.push_back({std::string(kIgnoredFieldsHeader), r.ignored_fields});
  }
  r.out->StartStream(std::move(head));
  if (r.head.endpoint == Endpoint::kChatCompletions) r.out->Write(RoleFrame(r.head));
}

// The I/O thread: every event handed over since the last drain, as one write.
void OpenAiServer::Drain(LiveRequest& r) {
  std::optional<TokenEvent> last;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.draining.swap(r.arrived);
    last.swap(r.last);
    r.drain_posted = false;
  }
  if (r.stream && !r.head_sent) {
    // A stream's head waits for its first event, as llama-server's does: a request that fails
    // before its first token (one the scheduler finds the KV budget can never hold) is answered
    // as the same request unstreamed is, with its 4xx, never with 200 and then an error frame.
    if (last && last->finish_reason == "error" && r.draining.empty()) {
      return SendError(*r.out, FailedRequestError(*last));
    }
    StartStream(r);
  }
  std::string frames;
  for (Piece& piece : r.draining) {
    // The control tokens that open a call or reasoning print nothing in the engine's text; the
    // splitter reads them by their text.
    if (r.reply.active() && piece.text.empty() && piece.token >= 0) {
      if (auto marker = marker_tokens_.find(piece.token); marker != marker_tokens_.end()) {
        piece.text = marker->second;
      }
    }
    if (r.stream) {
      AppendFrame(r, piece, &frames);
    } else {
      r.pieces.push_back(std::move(piece));
    }
  }
  r.draining.clear();
  if (last) return Answer(r, *last, std::move(frames));
  if (!frames.empty()) r.out->Write(std::move(frames));
}

// The last event: a stream's closing frames, or the whole plain answer.
void OpenAiServer::Answer(LiveRequest& r, const TokenEvent& last, std::string frames) {
  const bool failed = last.finish_reason == "error";
  const ApiError error = FailedRequestError(last);
  const Usage usage{last.prompt_tokens, last.cached_prompt_tokens, last.generated_tokens};
  std::string_view finish_reason = OpenAiFinishReason(last.finish_reason);
  // A grammar that allowed no token of the vocabulary (the engine's INVALID_ARGUMENT after
  // submission): the text so far is answered, with finish_reason "error" and the error beside
  // it, so that a client sees both where it stopped and why.
  const bool dead_end = failed && last.error.code() == StatusCode::kInvalidArgument;
  const bool native = r.head.endpoint == Endpoint::kLlamaCompletion;
  if (r.stream && native) {
    // llama-server's stream: the final object as the last frame, no [DONE].
    if (failed) {
      frames += ErrorFrame(error);
    } else {
      frames += "data: " + LlamaFinalBody(r, last, "") + "\n\n";
    }
    r.out->Write(std::move(frames));
    return r.out->End();
  }
  if (r.stream) {
    if (dead_end) {
      frames += FinishFrame(r.head, "error");
      frames += ErrorFrame(error);
    } else if (failed) {
      frames += ErrorFrame(error);
    } else {
      if (r.splitter) {
        frames += DeltaFrames(r.head, r.splitter->Finish());
        if (r.splitter->calls_sent() > 0) finish_reason = "tool_calls";
      }
      frames += FinishFrame(r.head, finish_reason);
      if (r.head.include_usage) frames += UsageFrame(r.head, usage);
    }
    frames += kDoneFrame;
    r.out->Write(std::move(frames));
    return r.out->End();
  }
  if (failed && !dead_end) return SendError(*r.out, error);
  std::string text;
  Logprobs token_logprobs;
  std::vector<int32_t> token_ids;
  for (const Piece& piece : r.pieces) {
    text += piece.text;
    if (piece.token >= 0) token_ids.push_back(piece.token);
    if (r.head.logprobs) r.decoder.Add(piece, &token_logprobs);
  }
  std::string body;
  if (native) {
    body = LlamaFinalBody(r, last, std::move(text));
  } else if (r.reply.active()) {
    const ReplyDelta reply = SplitReply(text, r.reply);
    if (!reply.calls.empty()) finish_reason = "tool_calls";
    body = SplitChatBody(r.head, reply, finish_reason, usage, token_logprobs, token_ids);
  } else {
    body = CompletionBody(r.head, text, finish_reason, usage, token_logprobs, token_ids);
  }
  if (dead_end) {
    nlohmann::ordered_json with_error = nlohmann::ordered_json::parse(body);
    with_error["error"] = nlohmann::ordered_json::parse(ErrorBody(error))["error"];
    body = with_error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  HttpResponse answer = JsonResponse(std::move(body));
  answer.headers.push_back({"X-Request-Id", std::to_string(last.request)});
  if (!r.ignored_fields.empty()) {
    answer.headers.push_back({std::string(kIgnoredFieldsHeader), r.ignored_fields});
  }
  r.out->Send(std::move(answer));
}

void OpenAiServer::Forget(RequestId id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  active_.erase(id);
}

void OpenAiServer::HandleCompletion(Endpoint endpoint, const HttpRequest& req,
                                    const std::shared_ptr<HttpResponder>& out) {
  CompletionParams params;
  if (auto error = ParseCompletionRequest(req.body, endpoint, context_, &params)) {
    return SendError(*out, *error);
  }
  // Log-probabilities name each token's text after the one before it: the prompt is tokenized
  // here to know its last token (the engine takes the ids as they are).
  Request& request = params.request;
  const bool logprobs = request.top_logprobs >= 0;
  const bool native = endpoint == Endpoint::kLlamaCompletion;
  // /completion's chunks count the prompt's tokens (tokens_evaluated) from the first one on.
  if ((logprobs || params.return_token_ids || native) && request.prompt_ids.empty()) {
    request.prompt_ids = engine_->tokenizer().Encode(
        request.prompt, EncodeOptions{request.add_bos, request.parse_special});
  }
  const int32_t prompt_last_token = request.prompt_ids.empty() ? -1 : request.prompt_ids.back();
  // Kept before the request moves into the engine.
  std::vector<int32_t> prompt_token_ids;
  if (params.return_token_ids) prompt_token_ids = request.prompt_ids;
  auto live = std::make_shared<LiveRequest>(
      ResponseHead{endpoint, NewResponseId(endpoint), static_cast<int64_t>(std::time(nullptr)),
                   context_.model_name, params.include_usage, logprobs, params.return_token_ids,
                   std::move(prompt_token_ids)},
      params.stream, out, engine_->tokenizer(), prompt_last_token);
  if (endpoint == Endpoint::kChatCompletions && params.reply.active()) {
    live->reply = params.reply;
    if (params.stream) live->splitter.emplace(params.reply);
  }
  if (!params.ignored_fields.empty()) {
    live->ignored_fields = fmt::format("{}", fmt::join(params.ignored_fields, ","));
  }
  LiveRequest::Native& native_state = live->native;
  if (native) {
    native_state.return_tokens = params.return_tokens;
    native_state.prompt_tokens = static_cast<int64_t>(request.prompt_ids.size());
    native_state.prompt =
        request.prompt.empty() ? engine_->tokenizer().Decode(request.prompt_ids) : request.prompt;
    native_state.stop_strings = request.stop_strings;
    native_state.settings = GenerationSettings(request, params.stream);
    native_state.prompt_last = prompt_last_token;
    native_state.probs_prev = prompt_last_token;
  }
  // Held until the request's id and slot are recorded: the engine's first event waits for it.
  std::unique_lock<std::mutex> live_lock(live->mu);
  native_state.slot = slots_->Acquire(0, request, params.stream);
  if (SlotTable::Slot* slot = slots_->at(native_state.slot)) {
    slot->n_prompt_tokens = static_cast<int64_t>(request.prompt_ids.size());
  }
  StatusOr<RequestId> id = InternalError("not submitted");
  {
    // Registered under the lock, so a shutdown's CancelAll sees every submitted request.
    std::lock_guard<std::mutex> lock(active_mu_);
    id = engine_->Submit(std::move(params.request),
                         [this, live](const TokenEvent& ev) { OnEvent(live, ev); });
    if (id.ok()) active_.insert(*id);
  }
  if (!id.ok()) {
    slots_->Release(native_state.slot);
    live_lock.unlock();
    const std::string param = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
    return SendError(
        *out, ApiError{400, Truncated(id.status().message()), "invalid_request_error", param, ""});
  }
  live->id = *id;
  if (SlotTable::Slot* slot = slots_->at(native_state.slot)) slot->id_task = *id;
  if (!params.ignored_fields.empty()) {
    fmt::print(stderr, "kvl serve: request {}: ignored fields {} (--lenient)\n", *id,
               live->ignored_fields);
  }
  live_lock.unlock();
  // When the exchange ends with the request still running, its client is gone (closed, reset,
  // or stopped reading), whatever the request's state: it is cancelled at once, so that its
  // sequence stops and its KV pages are freed or cached.
  out->OnDone([this, id = *id, live](bool) {
    if (!live->finished.load()) {
      engine_->Cancel(id);
      metrics_.CountDisconnectCancel();
    }
    Forget(id);
  });
}

Status OpenAiServer::LoadEngine() {
  KVL_ASSIGN_OR_RETURN(engine_, Engine::Create(options_.engine));
  const std::filesystem::path path(options_.engine.model_path);
  context_.model_name = options_.alias.empty() ? path.stem().string() : options_.alias;
  context_.lenient = options_.lenient;
  slots_ = std::make_unique<SlotTable>(options_.engine.max_seqs);
  context_.model_path = options_.engine.model_path;
  context_.context_length = engine_->context_length();
  context_.vocab_size = engine_->tokenizer().vocab_size();
  max_tokenize_bytes_ = TokenizeContentLimit(engine_->tokenizer(), context_.context_length);
  context_.accepts_lossy_kv = engine_->accepts_lossy_kv();
  KVL_ASSIGN_OR_RETURN(context_.chat, LoadChatFormatter(options_, *engine_));
  const std::string& source = context_.chat->source();
  context_.tool_format = DetectToolCallFormat(source);
  context_.template_thinks = source.find("<think>") != std::string::npos ||
                             source.find("</think>") != std::string::npos;
  const Tokenizer& tokenizer = engine_->tokenizer();
  for (std::string_view marker : {"<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]",
                                  "<think>", "</think>"}) {
    const std::vector<int32_t> ids = tokenizer.Encode(marker, EncodeOptions{false, true});
    if (ids.size() == 1 && tokenizer.DecodeToken(-1, ids[0]).empty()) {
      marker_tokens_.emplace(ids[0], std::string(marker));
    }
  }
  fmt::print(stderr, "kvl serve: model '{}', context {}, chat template {}\n", context_.model_name,
             context_.context_length, context_.chat->description());
  engine_->Start();
  return Status::Ok();
}

void OpenAiServer::WaitUntilAnswered(Clock::time_point deadline) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(active_mu_);
      if (active_.empty()) return;
    }
    if (Clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void OpenAiServer::CancelAll() {
  std::lock_guard<std::mutex> lock(active_mu_);
  for (RequestId id : active_) engine_->Cancel(id);
}

Status OpenAiServer::Run() {
  // SIGINT and SIGTERM are taken by sigtimedwait below, never by a handler: blocked here, before
  // any thread starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client gone away is a failed write, not the end of the server

  if (!options_.chat_template.empty()) {
    KVL_RETURN_IF_ERROR(ParseChatTemplateName(options_.chat_template).status());
  }
  http_ = std::make_unique<HttpServer>(
      TransportOptions(), [this](std::shared_ptr<const HttpRequest> req,
                                 std::shared_ptr<HttpResponder> out) { Dispatch(*req, out); });
  StatusOr<int> port = http_->Listen();
  if (!port.ok()) return port.status();
  fmt::print(stderr, "kvl serve: listening on http://{}:{}\n", options_.host, *port);
  http_->Start();
  // /health answers 503 while the model loads.
  if (Status loaded = LoadEngine(); !loaded.ok()) {
    http_->Stop();
    return loaded;
  }
  state_ = ServerState::kReady;
  fmt::print(stderr, "kvl serve: ready\n");

  int signal_number = 0;
  while (signal_number <= 0) {
    const timespec tick{0, 200 * 1000 * 1000};
    signal_number = sigtimedwait(&signals, nullptr, &tick);
  }
  fmt::print(stderr, "kvl serve: {}, shutting down (grace {} s)\n", strsignal(signal_number),
             options_.shutdown_grace_seconds);
  // Draining: new requests get 503 while the running ones (streams included) go on for the
  // grace period. The transport is stopped only after that: stopping closes every connection.
  state_ = ServerState::kDraining;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.shutdown_grace_seconds));
  WaitUntilAnswered(deadline);
  // Whatever still runs after the grace period is cancelled: a stream then sends its finish
  // frame (reason "abort") and [DONE], a plain request its text so far, and a chat template
  // still rendering stops (its request gets a 400), so that stopping the transport waits on no
  // render.
  CancelAll();
  context_.chat->CancelRenders();
  WaitUntilAnswered(Clock::now() + std::chrono::seconds(2));
  http_->Stop();
  engine_->Stop();
  fmt::print(stderr, "kvl serve: stopped\n");
  return Status::Ok();
}

}  // namespace
}  // namespace server

Status Serve(const ServeOptions& options) {
  server::OpenAiServer server(options);
  return server.Run();
}

}  // namespace kvl
