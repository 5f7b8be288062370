// The HTTP side of `kvl serve`: cpp-httplib with a fixed pool of connection threads, one catch-all
// handler per method that routes, authenticates and answers every error as OpenAI's error JSON,
// and the engine's background step loop behind it. Engine events are handed to the connection
// thread that waits for them through one small queue per request.
#include "kvl/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "api_request.h"
#include "api_response.h"
#include "kvl/chat_template.h"
#include "server_metrics.h"
#include "template_routes.h"
#include "tokenize_routes.h"
#include "webui_routes.h"

namespace kvl {
namespace server {
namespace {

using Clock = std::chrono::steady_clock;

// Connections the kernel queues before the listener accepts them (capped by net.core.somaxconn).
constexpr int kListenBacklog = 1024;

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

// One request's events, filled by the engine's thread and drained by its connection's thread.
struct PendingRequest {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Piece> pieces;  // each token's share, not yet taken
  bool finished = false;
  TokenEvent last;  // the finished event
  Clock::time_point submitted = Clock::now();
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
                             {kTokenizePath, "POST"},     {kDetokenizePath, "POST"}};

class OpenAiServer {
 public:
  explicit OpenAiServer(const ServeOptions& options) : options_(options) {}
  Status Run();

 private:
  void Configure();
  void Dispatch(const httplib::Request& req, httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  void HandleModels(httplib::Response& res);
  void HandleCompletion(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void OnEvent(PendingRequest& p, const TokenEvent& ev);
  void Stream(const ResponseHead& head, RequestId id, std::shared_ptr<PendingRequest> p,
              std::shared_ptr<LogprobDecoder> decoder, httplib::Response& res);
  void Forget(RequestId id);
  Status LoadEngine();
  void CancelAll();
  // Returns once every submitted request was answered (its response written or its client
  // gone), or at `deadline`.
  void WaitUntilAnswered(Clock::time_point deadline);

  static void SendError(httplib::Response& res, const ApiError& error) {
    res.status = error.http_status;
    res.set_content(ErrorBody(error), "application/json");
  }

  ServeOptions options_;
  httplib::Server http_;
  std::atomic<ServerState> state_{ServerState::kLoading};
  std::unique_ptr<Engine> engine_;  // set before state_ becomes kReady
  ApiContext context_;
  ServerMetrics metrics_;
  std::mutex active_mu_;
  std::set<RequestId> active_;  // submitted and not yet answered: cancelled at shutdown
  int listen_fd_ = -1;          // the listening socket, once bound
};

void OpenAiServer::Configure() {
  const int threads =
      options_.http_threads > 0 ? options_.http_threads : options_.engine.max_seqs + 4;
  http_.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  // Streamed frames are small: without TCP_NODELAY each waits for the delayed ACK of the last.
  http_.set_tcp_nodelay(true);
  // The listening socket gets SO_REUSEADDR (a restarted server binds at once, past TIME_WAIT) but
  // not httplib's default SO_REUSEPORT, under which a second server started on the same port binds
  // too and silently takes part of the connections. Its fd is kept to widen the backlog (Run).
  http_.set_socket_options([this](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  http_.set_keep_alive_max_count(1000);
  http_.set_keep_alive_timeout(options_.keep_alive_seconds);
  http_.set_read_timeout(30, 0);
  http_.set_write_timeout(30, 0);
  http_.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  auto dispatch = [this](const httplib::Request& req, httplib::Response& res) {
    Dispatch(req, res);
  };
  RegisterWebUiRoutes({options_.webui, options_.api_key,
                       [this]() -> const Engine* {
                         return state_.load() == ServerState::kLoading ? nullptr : engine_.get();
                       }},
                      &http_);
  http_.Get(".*", dispatch);
  http_.Post(".*", dispatch);
  http_.Put(".*", dispatch);
  http_.Patch(".*", dispatch);
  http_.Delete(".*", dispatch);
  http_.Options(".*", dispatch);
  // Errors httplib answers itself (a body over the limit, a malformed request line) get an
  // OpenAI error body too; every error response is counted here.
  http_.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    metrics_.CountHttpError(res.status);
    if (!res.body.empty()) return;
    std::string message = fmt::format("HTTP error {}", res.status);
    if (res.status == 400) message = "malformed HTTP request";
    if (res.status == 413) {
      message = fmt::format("the request body exceeds {} bytes", options_.max_body_bytes);
    }
    if (res.status == 414) message = "the request URI is too long";
    SendError(res, ApiError{res.status, message, "invalid_request_error", "", ""});
  });
  http_.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, ApiError{500, "internal error", "server_error", "", ""});
      });
}

void OpenAiServer::Dispatch(const httplib::Request& req, httplib::Response& res) {
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (r.path == req.path) route = &r;
  }
  if (route == nullptr) {
    return SendError(res, ApiError{404, fmt::format("Invalid URL ({} {})", req.method, req.path),
                                   "invalid_request_error", "", "not_found"});
  }
  const std::string_view method = req.method == "HEAD" ? "GET" : std::string_view(req.method);
  if (method != route->method) {
    res.set_header("Allow", std::string(route->method));
    return SendError(res, ApiError{405,
                                   fmt::format("Method {} not allowed on {}; use {}", req.method,
                                               req.path, route->method),
                                   "invalid_request_error", "", "method_not_allowed"});
  }
  if (!options_.api_key.empty() &&
      (req.path.starts_with("/v1/") || req.path == "/apply-template") &&
      req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
    return SendError(res,
                     ApiError{401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                              "invalid_request_error", "", "invalid_api_key"});
  }
  try {
    if (req.path == "/health") return HandleHealth(res);
    if (state_.load() != ServerState::kReady) {
      return SendError(
          res, ApiError{503,
                        state_.load() == ServerState::kLoading ? "the model is loading"
                                                               : "the server is shutting down",
                        "server_error", "", "unavailable"});
    }
    if (req.path == "/metrics") {
      return res.set_content(metrics_.Render(engine_->Metrics()),
                             "text/plain; version=0.0.4; charset=utf-8");
    }
    if (req.path == "/apply-template") return HandleApplyTemplate(context_, req, res);
    if (req.path == "/v1/models") return HandleModels(res);
    if (req.path == kTokenizePath || req.path == kDetokenizePath) {
      TokenRouteAnswer answer = AnswerTokenRoute(req.path, req.body, engine_->tokenizer());
      if (answer.error) return SendError(res, *answer.error);
      return res.set_content(answer.body, "application/json");
    }
    HandleCompletion(
        req.path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions, req,
        res);
  } catch (const std::exception& e) {
    SendError(res,
              ApiError{500, fmt::format("internal error: {}", e.what()), "server_error", "", ""});
  }
}

void OpenAiServer::HandleHealth(httplib::Response& res) {
  switch (state_.load()) {
    case ServerState::kReady:
      return res.set_content(R"({"status":"ok"})", "application/json");
    case ServerState::kLoading:
      res.status = 503;
      return res.set_content(R"({"status":"loading model"})", "application/json");
    case ServerState::kDraining:
      res.status = 503;
      return res.set_content(R"({"status":"shutting down"})", "application/json");
  }
}

void OpenAiServer::HandleModels(httplib::Response& res) {
  const nlohmann::json body = {{"object", "list"},
                               {"data",
                                {{{"id", context_.model_name},
                                  {"object", "model"},
                                  {"created", static_cast<int64_t>(std::time(nullptr))},
                                  {"owned_by", "kvlattice"},
                                  {"max_model_len", context_.context_length}}}}};
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void OpenAiServer::OnEvent(PendingRequest& p, const TokenEvent& ev) {
  const Clock::time_point now = Clock::now();
  // Counted before the waiting thread can answer: a client that reads /metrics right after its
  // response finds its request there.
  if (ev.finished) {
    metrics_.ObserveFinished(SecondsBetween(p.submitted, now), ev.prompt_tokens,
                             ev.cached_prompt_tokens, ev.generated_tokens,
                             std::string(OpenAiFinishReason(ev.finish_reason)));
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (ev.token >= 0) {
      if (!p.first_token_seen) {
        metrics_.ObserveTimeToFirstToken(SecondsBetween(p.submitted, now));
      } else {
        metrics_.ObserveInterTokenLatency(SecondsBetween(p.last_token, now));
      }
      p.first_token_seen = true;
      p.last_token = now;
    }
    if (!ev.text.empty() || ev.token >= 0) {
      p.pieces.push_back(Piece{ev.text, ev.token, ev.logprob, ev.top_logprobs});
    }
    if (ev.finished) {
      p.finished = true;
      p.last = ev;
    }
  }
  p.cv.notify_all();
}

void OpenAiServer::Forget(RequestId id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  active_.erase(id);
}

void OpenAiServer::HandleCompletion(Endpoint endpoint, const httplib::Request& req,
                                    httplib::Response& res) {
  CompletionParams params;
  if (auto error = ParseCompletionRequest(req.body, endpoint, context_, &params)) {
    return SendError(res, *error);
  }
  // Log-probabilities name each token's text after the one before it: the prompt is tokenized
  // here to know its last token (the engine takes the ids as they are).
  Request& request = params.request;
  const bool logprobs = request.top_logprobs >= 0;
  if ((logprobs || params.return_token_ids) && request.prompt_ids.empty()) {
    request.prompt_ids = engine_->tokenizer().Encode(
        request.prompt, EncodeOptions{request.add_bos, request.parse_special});
  }
  auto decoder = std::make_shared<LogprobDecoder>(
      engine_->tokenizer(), request.prompt_ids.empty() ? -1 : request.prompt_ids.back());
  // Kept before the request moves into the engine.
  std::vector<int32_t> prompt_token_ids;
  if (params.return_token_ids) prompt_token_ids = request.prompt_ids;
  auto pending = std::make_shared<PendingRequest>();
  StatusOr<RequestId> id = InternalError("not submitted");
  {
    // Registered under the lock, so a shutdown's CancelAll sees every submitted request.
    std::lock_guard<std::mutex> lock(active_mu_);
    id = engine_->Submit(std::move(params.request),
                         [this, pending](const TokenEvent& ev) { OnEvent(*pending, ev); });
    if (id.ok()) active_.insert(*id);
  }
  // The engine's number for the request: the web page's KV view follows exactly its pages.
  if (id.ok()) res.set_header("X-Request-Id", std::to_string(*id));
  if (!id.ok()) {
    const std::string param = endpoint == Endpoint::kCompletions ? "prompt" : "messages";
    return SendError(res, ApiError{400, id.status().message(), "invalid_request_error", param, ""});
  }
  ResponseHead head{endpoint,
                    NewResponseId(endpoint),
                    static_cast<int64_t>(std::time(nullptr)),
                    context_.model_name,
                    params.include_usage,
                    logprobs,
                    params.return_token_ids,
                    std::move(prompt_token_ids)};
  if (params.stream) return Stream(head, *id, std::move(pending), std::move(decoder), res);

  std::unique_lock<std::mutex> lock(pending->mu);
  pending->cv.wait(lock, [&] { return pending->finished; });
  Forget(*id);
  const TokenEvent& last = pending->last;
  if (last.finish_reason == "error") {
    return SendError(res, ApiError{500, last.error.message(), "server_error", "", ""});
  }
  std::string text;
  Logprobs token_logprobs;
  std::vector<int32_t> token_ids;
  for (const Piece& piece : pending->pieces) {
    text += piece.text;
    if (piece.token >= 0) token_ids.push_back(piece.token);
    if (logprobs) decoder->Add(piece, &token_logprobs);
  }
  res.set_content(
      CompletionBody(head, text, OpenAiFinishReason(last.finish_reason),
                     Usage{last.prompt_tokens, last.cached_prompt_tokens, last.generated_tokens},
                     token_logprobs, token_ids),
      "application/json");
}

void OpenAiServer::Stream(const ResponseHead& head, RequestId id,
                          std::shared_ptr<PendingRequest> pending,
                          std::shared_ptr<LogprobDecoder> decoder, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  auto role_sent = std::make_shared<bool>(false);
  auto text_sent = std::make_shared<bool>(false);
  auto held_ids = std::make_shared<std::vector<int32_t>>();
  res.set_chunked_content_provider(
      "text/event-stream",
      [head, pending, decoder, role_sent, text_sent, held_ids](size_t, httplib::DataSink& sink) {
        auto send = [&sink](const std::string& frame) {
          return sink.write(frame.data(), frame.size());
        };
        if (!*role_sent) {
          *role_sent = true;
          if (head.endpoint == Endpoint::kChatCompletions && !send(RoleFrame(head))) return false;
        }
        std::vector<Piece> pieces;
        bool finished = false;
        {
          std::unique_lock<std::mutex> lock(pending->mu);
          // A bounded wait, so a provider never blocks a shutdown forever.
          pending->cv.wait_for(lock, std::chrono::milliseconds(200),
                               [&] { return pending->finished || !pending->pieces.empty(); });
          pieces.swap(pending->pieces);
          finished = pending->finished;
        }
        // One frame per token (a token whose text is held back near a stop string sends a frame
        // only for its log-probabilities).
        for (const Piece& piece : pieces) {
          Logprobs token_logprobs;
          if (head.logprobs) decoder->Add(piece, &token_logprobs);
          if (piece.token >= 0) held_ids->push_back(piece.token);
          if (piece.text.empty() && token_logprobs.tokens.empty()) continue;
          // A token whose text was held back (near a stop string) goes out with the next frame.
          const bool first = !*text_sent;
          *text_sent = true;
          if (!send(TextFrame(head, piece.text, token_logprobs, *held_ids, first))) {
            return false;  // the client left
          }
          held_ids->clear();
        }
        if (!finished) return true;
        const TokenEvent& last = pending->last;
        if (last.finish_reason == "error") {
          if (!send(ErrorFrame(ApiError{500, last.error.message(), "server_error", "", ""}))) {
            return false;
          }
        } else {
          if (!send(FinishFrame(head, OpenAiFinishReason(last.finish_reason)))) return false;
          if (head.include_usage &&
              !send(UsageFrame(head, Usage{last.prompt_tokens, last.cached_prompt_tokens,
                                           last.generated_tokens}))) {
            return false;
          }
        }
        if (!send(std::string(kDoneFrame))) return false;
        sink.done();
        return true;
      },
      // Called when the response ends, written or not: a client that went away cancels its
      // request at once, so its sequence stops and its KV pages are freed or cached.
      [this, id, pending](bool) {
        bool finished;
        {
          std::lock_guard<std::mutex> lock(pending->mu);
          finished = pending->finished;
        }
        if (!finished) {
          engine_->Cancel(id);
          metrics_.CountDisconnectCancel();
        }
        Forget(id);
      });
}

Status OpenAiServer::LoadEngine() {
  KVL_ASSIGN_OR_RETURN(engine_, Engine::Create(options_.engine));
  const std::filesystem::path path(options_.engine.model_path);
  context_.model_name = path.stem().string();
  context_.model_path = options_.engine.model_path;
  context_.context_length = engine_->context_length();
  context_.accepts_lossy_kv = engine_->accepts_lossy_kv();
  KVL_ASSIGN_OR_RETURN(context_.chat, LoadChatFormatter(options_, *engine_));
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
  Configure();
  int port = options_.port;
  if (port == 0) {
    port = http_.bind_to_any_port(options_.host);
  } else if (!http_.bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port < 0) {
    return IoError(fmt::format("cannot listen on {}:{}", options_.host, options_.port));
  }
  // cpp-httplib as Debian builds it listens with a backlog of 5: sixteen clients connecting at
  // once overflow it, and each dropped SYN is retried by the client 1 s later (then 3 s, 7 s...),
  // which showed as 1 s outliers in TTFT and in the 16-client test. listen() on the bound socket
  // only resizes its queue.
  if (listen_fd_ >= 0 && ::listen(listen_fd_, kListenBacklog) != 0) {
    fmt::print(stderr, "kvl serve: cannot widen the listen backlog: {}\n", strerror(errno));
  }
  fmt::print(stderr, "kvl serve: listening on http://{}:{}\n", options_.host, port);
  std::atomic<bool> listener_done{false};
  std::thread listener([&] {
    http_.listen_after_bind();
    listener_done = true;
  });
  // httplib's stop() does nothing until the listener thread has entered its accept loop: a load
  // that failed at once on a busy CPU stopped a listener not yet started, which then ran forever
  // (503 "loading model" to every client, the signals blocked). So the stop waits for the loop.
  auto stop_accepting = [&] {
    while (!listener_done && !http_.is_running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    http_.stop();
  };
  // /health answers 503 while the model loads.
  if (Status loaded = LoadEngine(); !loaded.ok()) {
    stop_accepting();
    listener.join();
    return loaded;
  }
  state_ = ServerState::kReady;
  fmt::print(stderr, "kvl serve: ready\n");

  int signal_number = 0;
  while (signal_number <= 0 && !listener_done) {
    const timespec tick{0, 200 * 1000 * 1000};
    signal_number = sigtimedwait(&signals, nullptr, &tick);
  }
  fmt::print(stderr, "kvl serve: {}, shutting down (grace {} s)\n",
             signal_number > 0 ? strsignal(signal_number) : "listener stopped",
             options_.shutdown_grace_seconds);
  // Draining: new requests get 503 while the running ones (streams included) go on for the
  // grace period. The listener is stopped only after that: httplib's stop() also ends every
  // chunked response at its next write, which cut streams without their finish frame and [DONE].
  state_ = ServerState::kDraining;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.shutdown_grace_seconds));
  WaitUntilAnswered(deadline);
  // Whatever still runs after the grace period is cancelled: a stream then sends its finish
  // frame (reason "abort") and [DONE], a plain request its text so far.
  CancelAll();
  WaitUntilAnswered(Clock::now() + std::chrono::seconds(2));
  stop_accepting();
  listener.join();
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
