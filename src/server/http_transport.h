// The server's HTTP/1.x transport behind an interface of our own: the routes see a whole request
// (method, target, headers, body) and answer through an HttpResponder (a whole body, or a stream
// of chunks), which also tells them when the exchange ended and whether the client was gone
// before it. No route file depends on the library underneath (Boost.Beast/Asio, see the .cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/status.h"

namespace kvl::server {

struct HttpHeader {
  std::string name;
  std::string value;
};

// One request, read whole before any handler runs (the body within the body limit).
struct HttpRequest {
  std::string method;  // as sent: GET, POST, HEAD, OPTIONS...
  std::string target;  // the request target: path and query
  std::string path;    // the target up to '?'
  int version = 11;    // 10 (HTTP/1.0) or 11
  std::vector<HttpHeader> headers;
  std::string body;

  // The first header of that name (case-insensitive), "" when absent.
  std::string_view Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;  // empty: no Content-Type (a 204)
  std::vector<HttpHeader> headers;
  std::string body;  // ignored by StartStream
};

// How a handler answers its request: Send once, or StartStream, Write any number of times and
// End. Every method may be called from any thread and returns at once (the bytes are written by
// the transport's I/O thread); calls after the client is gone, or after the answer is complete,
// do nothing. An HTTP/1.0 client gets a stream close-delimited, a 1.1 client chunked.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Send(HttpResponse response) = 0;
  virtual void StartStream(HttpResponse head) = 0;
  virtual void Write(std::string chunk) = 0;
  virtual void End() = 0;
  // `done(written)` runs once when the exchange is over: written = true once the whole answer is
  // out, false when the client went first (closed or reset its connection, or stopped reading),
  // which is noticed while the request is still being handled, not only at a write. Runs at once
  // (on the calling thread) if the exchange is already over; else on the I/O thread.
  virtual void OnDone(std::function<void(bool written)> done) = 0;
  // Runs `task` on the I/O thread that writes this exchange's bytes, after what was posted
  // before it; tasks run one at a time, in call order. Dropped once the exchange is over. For
  // the work of turning events into bytes, kept off the thread that produces the events.
  virtual void Run(std::function<void()> task) = 0;
};

using HttpHandler =
    std::function<void(std::shared_ptr<const HttpRequest>, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                         // 0: any free port (Listen returns it)
  int64_t max_body_bytes = 8 << 20;     // Content-Length and chunked bodies alike, as they arrive
  int64_t max_header_bytes = 32 << 10;  // the request line and every header together
  int max_header_count = 100;
  int max_target_bytes = 8 << 10;
  double keep_alive_seconds = 5;  // an idle connection between requests
  // From a request's first byte to its last: a client that trickles its headers or body is cut
  // off (408) after this, however steadily it sends.
  double request_seconds = 30;
  double write_seconds = 30;            // one write to a client that does not read
  int64_t max_unsent_bytes = 16 << 20;  // a stream's bytes waiting for a slow client
  // Event loops, each on its thread, among which connections are dealt. More than one keeps a
  // CPU-starved machine (the threads' share of it) from slowing every client at once.
  int io_threads = 2;
  int worker_threads = 4;  // handlers run here, never on an I/O thread...
  // ...except those this says to run inline (cheap ones that must answer under any load).
  std::function<bool(const HttpRequest&)> run_inline;
  std::vector<HttpHeader> headers_on_every_response;  // e.g. CORS
  // The body of an error the transport answers itself (400, 408, 413, 414, 431): the routes'
  // error format. `status` and `message` say what was wrong.
  std::function<HttpResponse(int status, const std::string& message)> error_response;
};

// Thread-safety: Listen, then Start, then Stop, from one thread.
class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; returns the port.
  StatusOr<int> Listen();
  // Starts accepting and serving on the transport's own threads.
  void Start();
  // Closes the listener and every connection, then joins the threads. Responders still held by
  // handlers stay valid (their calls do nothing).
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvl::server
