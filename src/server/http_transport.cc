// HTTP/1.x on Boost.Beast's parser over a few Boost.Asio I/O threads (epoll): a connection, idle,
// trickling its request or waiting for the engine, costs a socket and a few buffers, never a
// thread. Handlers run on the connection's loop (/health, small bodies) or on a small worker
// pool (large bodies) and answer through an Exchange, whose bytes the loop writes in order.
//
// Why Beast/Asio (libboost-dev, already on Debian 12 build machines), after probing it (the
// tests in tests/server/http_transport_test.cc) and reading libmicrohttpd 0.9.75's documented
// behaviour (not installed here, so not probed):
// - Limits are the parser's own: header_limit bounds the request line and headers together,
//   body_limit is checked against Content-Length at the header (413 before any body is read)
//   and against each chunk as it arrives, so a chunked body over --max-body is refused without
//   being buffered. The overall receive deadline is a timer of ours from the first byte to the
//   last; libmicrohttpd's timeout is an idle timeout that a slowloris client resets forever.
// - A request waiting for the engine keeps a read posted on its socket, so a client that closes
//   or resets is noticed at once, in any engine state, streaming or not. libmicrohttpd does not
//   poll a suspended connection: a client gone while its request waits is seen only on resume.
//   A FIN alone does not end the request: a client that half-closes (shutdown(SHUT_WR)) after
//   its request still gets its answer (see OnClientDoneSending for how a closed one is told).
// - Pipelined requests stay in the connection's buffer and are read one after the other, each
//   answered in order; an HTTP/1.0 request gets a 1.0 answer (Content-Length, or a stream that
//   the closed connection ends) because the framing is written here, not by a library default.
// The cost is compile time: this one file holds every Beast/Asio include.
#include "http_transport.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cctype>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

namespace kvl::server {

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const HttpHeader& h : headers) {
    if (h.name.size() == name.size() && std::equal(h.name.begin(), h.name.end(), name.begin(),
                                                   [](unsigned char a, unsigned char b) {
                                                     return std::tolower(a) == std::tolower(b);
                                                   })) {
      return h.value;
    }
  }
  return {};
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Bytes a connection reads ahead while its request is handled (a pipelined request, or the
// close it waits to notice); past this it stops reading until the answer is out.
constexpr size_t kMaxReadAhead = 1 << 20;
// How long a closing connection reads what the client still sends before closing, so that the
// close does not reset the answer away before the client read it.
constexpr double kLingerSeconds = 1;

class Connection;

// What the I/O threads need from the server: shared by every connection.
struct Shared {
  HttpServerOptions options;
  HttpHandler handler;
  // One event loop per I/O thread; a connection lives on one of them, so that its state is
  // touched by one thread only.
  std::vector<std::unique_ptr<asio::io_context>> loops;
  asio::thread_pool workers;
  std::mutex live_mu;
  std::unordered_set<std::shared_ptr<Connection>> live;  // under live_mu
  std::atomic<bool> stopping{false};

  Shared(HttpServerOptions o, HttpHandler h)
      : options(std::move(o)),
        handler(std::move(h)),
        workers(static_cast<size_t>(std::max(1, options.worker_threads))) {
    for (int i = 0; i < std::max(1, options.io_threads); ++i) {
      // Concurrency hint 1: one thread runs each loop, so a post from that thread (a handler's
      // answer, a drain of engine events) joins the loop's private queue without a wake-up.
      loops.push_back(std::make_unique<asio::io_context>(1));
    }
  }
};

// The status line and headers of an answer, through the blank line. `framing`: the
// Content-Length or Transfer-Encoding line, or "" for a body the closed connection ends.
std::string SerializeHead(const HttpResponse& r, int version, bool keep_alive,
                          const std::vector<HttpHeader>& every, std::string_view framing) {
  const auto status = http::int_to_status(static_cast<unsigned>(r.status));
  std::string out = fmt::format("HTTP/1.{} {} {}\r\n", version == 10 ? 0 : 1, r.status,
                                static_cast<std::string>(http::obsolete_reason(status)));
  if (!r.content_type.empty()) out += fmt::format("Content-Type: {}\r\n", r.content_type);
  for (const HttpHeader& h : r.headers) out += fmt::format("{}: {}\r\n", h.name, h.value);
  for (const HttpHeader& h : every) out += fmt::format("{}: {}\r\n", h.name, h.value);
  out += framing;
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (version == 10) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  return out;
}

// One request's answer: the HttpResponder its handler holds. Calls from any thread become
// bytes posted, in call order, to the connection's I/O thread.
class Exchange : public HttpResponder, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<Connection> connection, Shared& shared, int version, bool keep_alive,
           bool head_only)
      : connection_(std::move(connection)),
        shared_(shared),
        version_(version),
        keep_alive_(keep_alive),
        head_only_(head_only) {}

  void Send(HttpResponse r) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (answer_ != Answer::kNone) return;
    answer_ = Answer::kComplete;
    std::string bytes =
        SerializeHead(r, version_, keep_alive_, shared_.options.headers_on_every_response,
                      fmt::format("Content-Length: {}\r\n", r.body.size()));
    if (!head_only_) bytes += r.body;
    Post(std::move(bytes), true);
  }

  void StartStream(HttpResponse head) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (answer_ != Answer::kNone) return;
    answer_ = Answer::kStreaming;
    // HTTP/1.0 has no chunked encoding: the stream ends when the connection closes.
    chunked_ = version_ == 11;
    if (!chunked_) keep_alive_ = false;
    Post(SerializeHead(head, version_, keep_alive_, shared_.options.headers_on_every_response,
                       chunked_ ? "Transfer-Encoding: chunked\r\n" : ""),
         false);
  }

  void Write(std::string chunk) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (answer_ != Answer::kStreaming || chunk.empty()) return;
    if (chunked_) chunk = fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk);
    Post(std::move(chunk), false);
  }

  void End() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (answer_ != Answer::kStreaming) return;
    answer_ = Answer::kComplete;
    Post(chunked_ ? "0\r\n\r\n" : "", true);
  }

  void OnDone(std::function<void(bool)> done) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!over_) {
      done_ = std::move(done);
      return;
    }
    const bool written = written_;
    lock.unlock();
    done(written);
  }

  void Run(std::function<void()> task) override;

  // I/O thread: the exchange is over, its answer written whole or its client gone.
  void Finish(bool written) {
    std::function<void(bool)> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (over_) return;
      over_ = true;
      written_ = written;
      done.swap(done_);
      connection_.reset();  // nothing more to post
    }
    if (done) done(written);
  }

  // Read on the I/O thread once the last bytes were posted (the post orders it after the write).
  bool keep_alive() const {
    std::lock_guard<std::mutex> lock(mu_);
    return keep_alive_;
  }

 private:
  enum class Answer { kNone, kStreaming, kComplete };
  void Post(std::string bytes, bool last);  // under mu_

  mutable std::mutex mu_;
  std::shared_ptr<Connection> connection_;  // null once over
  Shared& shared_;
  const int version_;
  bool keep_alive_;
  const bool head_only_;
  bool chunked_ = false;
  Answer answer_ = Answer::kNone;
  bool over_ = false;
  bool written_ = false;
  std::function<void(bool)> done_;
};

// One client connection, touched only by its event loop's thread. It reads a request (under the limits
// and the receive deadline), hands it to a handler, watches the socket while the handler works
// and writes the answer, then reads the next request (already buffered, when pipelined).
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, Shared& shared)
      : socket_(std::move(socket)),
        shared_(shared),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {}

  asio::any_io_executor executor() { return socket_.get_executor(); }

  void Start() { WaitForRequest(); }

  // Ends the connection at once; a request being handled is over, its client gone.
  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    ++read_deadline_;
    ++write_deadline_;
    read_timer_.cancel();
    write_timer_.cancel();
    beast::error_code ignored;
    socket_.close(ignored);
    if (std::shared_ptr<Exchange> exchange = std::move(exchange_)) exchange->Finish(false);
    std::lock_guard<std::mutex> lock(shared_.live_mu);
    shared_.live.erase(shared_from_this());
  }

  // The bytes an Exchange posted; `last`: its answer is complete with them.
  void Deliver(const Exchange* from, std::string bytes, bool last) {
    if (phase_ == Phase::kClosed || from != exchange_.get()) return;
    if (!bytes.empty()) {
      unsent_bytes_ += bytes.size();
      unsent_.push_back(std::move(bytes));
    }
    if (last) answer_complete_ = true;
    // A client that stops reading a stream is gone: its request is cancelled, not buffered.
    if (!last && static_cast<int64_t>(unsent_bytes_) > shared_.options.max_unsent_bytes) {
      return Close();
    }
    Pump();
  }

 private:
  enum class Phase { kIdle, kReading, kHandling, kClosing, kClosed };

  void WaitForRequest() {
    phase_ = Phase::kIdle;
    if (buffer_.size() > 0) return ReadHeader();  // a pipelined request is already here
    ArmReadDeadline(shared_.options.keep_alive_seconds, [](Connection& c) { c.Close(); });
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](const beast::error_code& ec) {
                         if (self->phase_ != Phase::kIdle) return;
                         if (ec) return self->Close();
                         self->ReadHeader();
                       });
  }

  void ReadHeader() {
    phase_ = Phase::kReading;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(shared_.options.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(shared_.options.max_body_bytes));
    ArmReadDeadline(shared_.options.request_seconds, [](Connection& c) {
      c.Refuse(408, fmt::format("the request was not received within {} s",
                                c.shared_.options.request_seconds));
    });
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (self->phase_ != Phase::kReading) return;
                              if (ec) return self->OnReadError(ec);
                              self->OnHeader();
                            });
  }

  void OnHeader() {
    const auto& header = parser_->get();
    const HttpServerOptions& o = shared_.options;
    if (std::distance(header.begin(), header.end()) > o.max_header_count) {
      return Refuse(431, fmt::format("the request has more than {} headers", o.max_header_count));
    }
    if (static_cast<int64_t>(header.target().size()) > o.max_target_bytes) {
      return Refuse(414, fmt::format("the request URI exceeds {} bytes", o.max_target_bytes));
    }
    if (parser_->is_done()) return OnRequest();
    if (beast::iequals(header[http::field::expect], "100-continue")) {
      unsent_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
      Pump();
    }
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (self->phase_ != Phase::kReading) return;
                       if (ec) return self->OnReadError(ec);
                       self->OnRequest();
                     });
  }

  void OnReadError(const beast::error_code& ec) {
    const HttpServerOptions& o = shared_.options;
    if (ec == http::error::header_limit) {
      return Refuse(431, fmt::format("the request headers exceed {} bytes", o.max_header_bytes));
    }
    if (ec == http::error::body_limit) {
      return Refuse(413, fmt::format("the request body exceeds {} bytes", o.max_body_bytes));
    }
    // The client left (before or in the middle of a request): nobody to answer.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        &ec.category() != &http::make_error_code(http::error::end_of_stream).category()) {
      return Close();
    }
    Refuse(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }

  void OnRequest() {
    ++read_deadline_;
    read_timer_.cancel();
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    auto request = std::make_shared<HttpRequest>();
    request->method = std::string(message.method_string());
    request->target = std::string(message.target());
    request->path = request->target.substr(0, request->target.find('?'));
    request->version = message.version() == 10 ? 10 : 11;
    for (const auto& field : message) {
      request->headers.push_back({std::string(field.name_string()), std::string(field.value())});
    }
    request->body = std::move(message.body());
    exchange_ = std::make_shared<Exchange>(shared_from_this(), shared_, request->version,
                                           message.keep_alive() && !shared_.stopping,
                                           request->method == "HEAD");
    answer_complete_ = false;
    phase_ = Phase::kHandling;
    Watch();
    std::shared_ptr<HttpResponder> responder = exchange_;
    auto run = [&shared = shared_, request, responder] {
      try {
        shared.handler(request, responder);
      } catch (const std::exception& e) {
        responder->Send(
            shared.options.error_response(500, fmt::format("internal error: {}", e.what())));
      }
    };
    if (shared_.options.run_inline && shared_.options.run_inline(*request)) {
      run();
    } else {
      asio::post(shared_.workers, std::move(run));
    }
  }

  // While a request is handled, a read stays posted: it buffers a pipelined request and notices
  // a client that closed or reset its connection, whose request is then over at once.
  void Watch() {
    if (watching_ || buffer_.size() >= kMaxReadAhead) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(16 << 10),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->watching_ = false;
                              if (self->phase_ == Phase::kClosed || self->phase_ == Phase::kClosing)
                                return;
                              if (!ec) self->buffer_.commit(n);
                              if (self->phase_ == Phase::kHandling) {
                                if (ec == asio::error::eof) return self->OnClientDoneSending();
                                if (ec) return self->Close();
                                return self->Watch();
                              }
                              // The answer is out: the read was cancelled for the next request, or
                              // brought its bytes.
                              if (ec && ec != asio::error::operation_aborted) return self->Close();
                              self->WaitForRequest();
                            });
  }

  // The client's end of the connection closed while its request is handled. It may have closed
  // only its sending side (shutdown(SHUT_WR) after its request, as some HTTP/1.0 clients do),
  // still waiting for the answer, or closed the socket and left: the FIN looks the same. One
  // urgent (out-of-band) byte tells them apart without a byte in the answer: a socket still
  // open takes it aside (a reader never sees it in the stream unless it asks for SO_OOBINLINE),
  // a closed one answers any data with a reset, which the wait below sees at once. A client
  // that closes later still is noticed at the next write the reset breaks. One probe per
  // connection: a second urgent byte would push the first, unread, into the stream. Requests the
  // client pipelined before its FIN are still answered, one after the other.
  void OnClientDoneSending() {
    if (!client_done_sending_) {
      client_done_sending_ = true;
      beast::error_code ignored;
      socket_.non_blocking(true, ignored);  // never wait here for room in a full send buffer
      const char probe = 0;
      socket_.send(asio::buffer(&probe, 1), tcp::socket::message_out_of_band, ignored);
    }
    socket_.async_wait(tcp::socket::wait_error,
                       [self = shared_from_this()](const beast::error_code& ec) {
                         if (!ec && self->phase_ == Phase::kHandling) self->Close();
                       });
  }

  // Writes what is queued, in one gather write at a time; when the answer is complete and out,
  // the exchange is over and the connection goes on (or closes).
  void Pump() {
    if (!writing_.empty() || phase_ == Phase::kClosed) return;
    if (unsent_.empty()) {
      if (exchange_ && answer_complete_) return AnswerWritten();
      if (phase_ == Phase::kClosing) return Linger();
      return;
    }
    writing_.swap(unsent_);
    unsent_bytes_ = 0;
    std::vector<asio::const_buffer> buffers;
    for (const std::string& s : writing_) buffers.push_back(asio::buffer(s));
    const uint64_t deadline = ++write_deadline_;
    write_timer_.expires_after(Seconds(shared_.options.write_seconds));
    write_timer_.async_wait([self = shared_from_this(), deadline](beast::error_code ec) {
      if (!ec && deadline == self->write_deadline_) self->Close();
    });
    asio::async_write(socket_, buffers, [self = shared_from_this()](beast::error_code ec, size_t) {
      ++self->write_deadline_;
      self->write_timer_.cancel();
      self->writing_.clear();
      if (self->phase_ == Phase::kClosed) return;
      if (ec) return self->Close();
      self->Pump();
    });
  }

  void AnswerWritten() {
    std::shared_ptr<Exchange> exchange = std::move(exchange_);
    const bool keep_alive = exchange->keep_alive() && !shared_.stopping &&
                            (!client_done_sending_ || buffer_.size() > 0);
    exchange->Finish(true);
    if (!keep_alive) {
      phase_ = Phase::kClosing;
      return Linger();
    }
    phase_ = Phase::kIdle;
    beast::error_code ignored;
    // The watch's read ends (cancelled, or with the next request's bytes) and goes on to it.
    if (watching_) {
      socket_.cancel(ignored);
    } else {
      WaitForRequest();
    }
  }

  // Answers an error the transport found itself, then closes.
  void Refuse(int status, const std::string& message) {
    phase_ = Phase::kClosing;
    ++read_deadline_;
    read_timer_.cancel();
    beast::error_code ignored;
    socket_.cancel(ignored);  // a read still posted (the deadline's case) ends unheard
    const HttpResponse r = shared_.options.error_response(status, message);
    unsent_.push_back(SerializeHead(r, 11, false, shared_.options.headers_on_every_response,
                                    fmt::format("Content-Length: {}\r\n", r.body.size())) +
                      r.body);
    Pump();
  }

  // Closes our side for writing and reads (and drops) what the client still sends, for a
  // moment: closing with unread bytes would reset the connection and could lose the answer.
  void Linger() {
    if (lingering_) return;
    lingering_ = true;
    beast::error_code ignored;
    socket_.cancel(ignored);
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    ArmReadDeadline(kLingerSeconds, [](Connection& c) { c.Close(); });
    Drain();
  }

  void Drain() {
    socket_.async_read_some(asio::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (self->phase_ == Phase::kClosed) return;
                              if (ec && ec != asio::error::operation_aborted) return self->Close();
                              self->Drain();
                            });
  }

  // After `seconds`, `expire` runs unless the deadline was re-armed or disarmed meanwhile.
  template <typename Expire>
  void ArmReadDeadline(double seconds, Expire expire) {
    const uint64_t deadline = ++read_deadline_;
    read_timer_.expires_after(Seconds(seconds));
    read_timer_.async_wait([self = shared_from_this(), deadline, expire](beast::error_code ec) {
      if (ec || deadline != self->read_deadline_ || self->phase_ == Phase::kClosed) return;
      expire(*self);
    });
  }

  tcp::socket socket_;
  Shared& shared_;
  Phase phase_ = Phase::kIdle;
  beast::flat_buffer buffer_;  // read and not yet parsed: the next request's bytes
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Exchange> exchange_;  // the request being handled, until its answer is out
  bool answer_complete_ = false;
  bool watching_ = false;
  bool lingering_ = false;
  bool client_done_sending_ = false;  // its FIN came while a request was handled
  std::vector<std::string> unsent_;  // queued, not yet written
  size_t unsent_bytes_ = 0;
  std::vector<std::string> writing_;  // the write in flight
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  uint64_t read_deadline_ = 0;  // the armed read deadline's number; bumped to disarm
  uint64_t write_deadline_ = 0;
  std::array<char, 4096> scratch_;
};

void Exchange::Post(std::string bytes, bool last) {
  if (!connection_) return;
  asio::post(connection_->executor(),
             [connection = connection_, self = shared_from_this(), bytes = std::move(bytes),
              last]() mutable { connection->Deliver(self.get(), std::move(bytes), last); });
}

void Exchange::Run(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (connection_) asio::post(connection_->executor(), std::move(task));
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : shared_(std::move(options), std::move(handler)),
        acceptor_(*shared_.loops.front()),
        accept_retry_(*shared_.loops.front()) {}

  StatusOr<int> Listen() {
    // Connections cost a descriptor each, not a thread: allow as many as the system lets us.
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    const HttpServerOptions& o = shared_.options;
    beast::error_code ec;
    tcp::resolver resolver(*shared_.loops.front());
    const auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
    if (ec || endpoints.empty()) {
      return IoError(fmt::format("cannot listen on {}:{}: {}", o.host, o.port, ec.message()));
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    // SO_REUSEADDR (a restarted server binds at once, past TIME_WAIT), never SO_REUSEPORT (a
    // second server on the same port would bind too and silently take part of the clients).
    if (acceptor_.open(endpoint.protocol(), ec);
        !ec && !acceptor_.set_option(tcp::acceptor::reuse_address(true), ec) &&
        !acceptor_.bind(endpoint, ec)) {
      // A wide backlog: clients connecting at once are not dropped and retried a second later.
      acceptor_.listen(1024, ec);
    }
    if (ec) return IoError(fmt::format("cannot listen on {}:{}: {}", o.host, o.port, ec.message()));
    return static_cast<int>(acceptor_.local_endpoint().port());
  }

  void Start() {
    Accept();
    for (const auto& loop : shared_.loops) {
      guards_.push_back(asio::make_work_guard(*loop));
      threads_.emplace_back([&loop = *loop] { loop.run(); });
    }
  }

  void Stop() {
    if (threads_.empty()) return;
    shared_.stopping = true;
    for (const auto& loop : shared_.loops) loop->stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    // No I/O thread runs any more: the listener and the connections are closed from here.
    beast::error_code ignored;
    acceptor_.close(ignored);
    std::unordered_set<std::shared_ptr<Connection>> live;
    {
      std::lock_guard<std::mutex> lock(shared_.live_mu);
      live = shared_.live;  // Close erases from the set
    }
    for (const std::shared_ptr<Connection>& c : live) c->Close();
    shared_.workers.join();
  }

 private:
  void Accept() {
    // Connections are dealt to the event loops in turn.
    asio::io_context& loop = *shared_.loops[next_loop_++ % shared_.loops.size()];
    acceptor_.async_accept(loop, [this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor_.is_open()) return;
      if (ec) {
        // Out of descriptors, most likely: try again shortly rather than spin.
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](beast::error_code e) {
          if (!e) Accept();
        });
        return;
      }
      beast::error_code ignored;
      // Streamed frames are small: without TCP_NODELAY each waits for the last one's ACK.
      socket.set_option(tcp::no_delay(true), ignored);
      auto connection = std::make_shared<Connection>(std::move(socket), shared_);
      {
        std::lock_guard<std::mutex> lock(shared_.live_mu);
        shared_.live.insert(connection);
      }
      asio::post(connection->executor(), [connection] { connection->Start(); });
      Accept();
    });
  }

  Shared shared_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  size_t next_loop_ = 0;  // the acceptor's thread only
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  std::vector<std::thread> threads_;
};

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}
HttpServer::~HttpServer() { impl_->Stop(); }
StatusOr<int> HttpServer::Listen() { return impl_->Listen(); }
void HttpServer::Start() { impl_->Start(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace kvl::server
