// `kvl serve`'s HTTP layer against what a hostile or old client sends: bodies and headers past
// the limits, slow and idle connections, pipelining, HTTP/1.0, CORS, and clients that leave
// before their answer. Raw sockets, so that the bytes on the wire are exactly the test's.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server_process.h"

namespace kvl {
namespace {

using Clock = std::chrono::steady_clock;
using testing::ServerProcess;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One TCP connection to the server, closed (or reset) when the object goes.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { Close(); }
  bool connected() const { return connected_; }

  // False once the server closed or reset the connection.
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads until `done(received)` holds, the server closes, or `seconds` pass.
  template <typename Done>
  std::string ReadUntil(Done done, double seconds) {
    std::string received;
    const Clock::time_point start = Clock::now();
    while (!done(received)) {
      const double left = seconds - SecondsSince(start);
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) break;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      received.append(buf, static_cast<size_t>(n));
    }
    return received;
  }
  // Everything until the server closes the connection (or `seconds` pass).
  std::string ReadAll(double seconds) {
    return ReadUntil([](const std::string&) { return false; }, seconds);
  }
  // An abortive close: the server sees a reset, as from a client that crashed.
  void Reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Close();
  }
  // Closes the sending side only (a FIN): the client still reads, as some HTTP/1.0 clients do.
  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string Post(std::string_view path, std::string_view body, std::string_view extra = "") {
  return fmt::format(
      "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{}"
      "Content-Length: {}\r\n\r\n{}",
      path, extra, body.size(), body);
}

int CountOf(const std::string& text, std::string_view what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The time a new client's GET /health takes, on a fresh connection (-1: no answer in 30 s).
double HealthSeconds(int port) {
  const Clock::time_point start = Clock::now();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  auto res = client.Get("/health");
  if (!res || res->status != 200) return -1;
  return SecondsSince(start);
}

double Metric(int port, const std::string& line_prefix) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  if (!res) return -1;
  const size_t pos = res->body.find("\n" + line_prefix + " ");
  if (pos == std::string::npos) return -1;
  return std::stod(res->body.substr(pos + line_prefix.size() + 2));
}

// A chunked body used to skip --max-body: it was buffered whole (up to 100 MiB) and only then
// refused. Now the limit applies to each chunk as it arrives: past the limit the server answers
// 413 naming it, though the body never ends.
TEST(HttpTransportTest, AChunkedBodyOverMaxBodyIsRefusedAsItArrives) {
  ServerProcess server({"--max-body", "64KiB"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  RawConnection c(server.port());
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
             "\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk(16 << 10, ' ');
  // 256 KiB, four times the limit, and no last chunk: a server that waits for the whole body
  // never answers.
  for (int i = 0; i < 16; ++i) {
    if (!c.Send(fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk))) break;
  }
  const std::string answer =
      c.ReadUntil([](const std::string& s) { return s.find("}}") != std::string::npos; }, 10);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 413")) << answer.substr(0, 300);
  EXPECT_NE(answer.find("the request body exceeds 65536 bytes"), std::string::npos) << answer;
}

// Headers had no limit (24 MB of them grew the server by ~215 MB).
TEST(HttpTransportTest, HeadersOverTheLimitAreRefusedWith431) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  {
    RawConnection c(server.port());
    c.Send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(200 << 10, 'a') + "\r\n\r\n");
    EXPECT_TRUE(c.ReadAll(10).starts_with("HTTP/1.1 431"));
  }
  {
    std::string many = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 500; ++i) many += fmt::format("X-H{}: 1\r\n", i);
    RawConnection c(server.port());
    c.Send(many + "\r\n");
    EXPECT_TRUE(c.ReadAll(10).starts_with("HTTP/1.1 431"));
  }
  EXPECT_GE(HealthSeconds(server.port()), 0);
}

// Eight slowloris connections, trickling their headers a byte at a time, used to hold every
// connection thread: other clients waited as long as they trickled.
TEST(HttpTransportTest, SlowlorisConnectionsDoNotDelayOtherClients) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 8; ++i) {
    slow.push_back(std::make_unique<RawConnection>(server.port()));
    slow.back()->Send("GET /health HTTP/1.1\r\nHost: x\r\n");
  }
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    while (trickling) {
      for (auto& c : slow) c->Send("X");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double health = HealthSeconds(server.port());
  trickling = false;
  trickle.join();
  // A behaviour bound, not a benchmark: today's answer is at once; before, tens of seconds.
  EXPECT_GE(health, 0);
  EXPECT_LT(health, 2.0);
}

// 48 idle keep-alive connections used to hold the thread pool: a new client's /health waited
// for their keep-alive timeouts.
TEST(HttpTransportTest, IdleKeepAliveConnectionsDoNotDelayHealth) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 48; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server.port()));
    idle.back()->Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double health = HealthSeconds(server.port());
  EXPECT_GE(health, 0);
  EXPECT_LT(health, 2.0);
  // Each was answered and stays open (keep-alive), idle.
  int answered = 0;
  for (auto& c : idle) {
    answered += c->ReadUntil([](const std::string& s) { return s.find("\"ok\"") != s.npos; }, 5)
                    .ends_with(R"({"status":"ok"})");
  }
  EXPECT_EQ(answered, 48);
}

// Eight long requests at -np 2 (six of them queued) used to hold every connection thread: a
// new client's /health waited 17 s. Neither /health nor /metrics waits for them now.
TEST(HttpTransportTest, LongRequestsDoNotDelayHealthOrMetrics) {
  ServerProcess server({"-np", "2"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  std::vector<std::unique_ptr<RawConnection>> busy;
  for (int i = 0; i < 8; ++i) {
    busy.push_back(std::make_unique<RawConnection>(server.port()));
    busy.back()->Send(Post("/v1/completions",
                           R"({"prompt":"Once upon","max_tokens":480,"ignore_eos":true,)"
                           R"("logprobs":5,"stream":true})"));
  }
  busy.front()->ReadUntil([](const std::string& s) { return s.find("data: {") != s.npos; }, 20);
  const double health = HealthSeconds(server.port());
  const Clock::time_point start = Clock::now();
  const double running = Metric(server.port(), "kvl:num_requests_running");
  const double metrics = SecondsSince(start);
  EXPECT_GE(health, 0);
  EXPECT_LT(health, 2.0);
  EXPECT_GE(running, 0);
  EXPECT_LT(metrics, 2.0);
}

// /health and /metrics under everything at once: sixteen streams being read as they come and
// eight slowloris connections. Twenty probes of each on fresh connections, their p50 and p99
// printed (scripts/bench_http.py --health measures them longer). The old server's /health took
// 214 ms at the median here, 0.95 s at the worst.
TEST(HttpTransportTest, HealthAndMetricsAnswerUnderStreamsAndSlowloris) {
  ServerProcess server({"-np", "16"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  std::atomic<bool> loaded{true};
  std::vector<std::thread> streams;
  for (int i = 0; i < 16; ++i) {
    streams.emplace_back([&] {
      while (loaded) {
        RawConnection c(server.port());
        c.Send(Post("/v1/completions",
                    R"({"prompt":"Once upon","max_tokens":200,"ignore_eos":true,"stream":true})"));
        c.ReadUntil([&](const std::string& s) { return !loaded || s.ends_with("0\r\n\r\n"); }, 60);
      }
    });
  }
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 8; ++i) {
    slow.push_back(std::make_unique<RawConnection>(server.port()));
    slow.back()->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  }
  std::thread trickle([&] {
    while (loaded) {
      for (auto& c : slow) c->Send("X");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<double> health_ms, metrics_ms;
  for (int i = 0; i < 20; ++i) {
    health_ms.push_back(HealthSeconds(server.port()) * 1000);
    const Clock::time_point start = Clock::now();
    const double running = Metric(server.port(), "kvl:num_requests_running");
    metrics_ms.push_back(running >= 0 ? SecondsSince(start) * 1000 : -1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double generated = Metric(server.port(), "kvl:generation_tokens_total");
  loaded = false;
  trickle.join();
  for (std::thread& t : streams) t.join();
  for (std::vector<double>* ms : {&health_ms, &metrics_ms}) {
    std::sort(ms->begin(), ms->end());
    std::printf("%s: p50 %.2f ms, p99 %.2f ms\n", ms == &health_ms ? "/health" : "/metrics",
                (*ms)[ms->size() / 2], ms->back());
    EXPECT_GE(ms->front(), 0);  // every probe answered
    // The median within the issue's 100 ms (the old server's /health: 214 ms), the worst
    // within a bound a loaded machine keeps.
    EXPECT_LT((*ms)[ms->size() / 2], 100);
    EXPECT_LT(ms->back(), 2000);
  }
  EXPECT_GT(generated, 0);  // the streams were really running
}

// Two requests sent at once on one connection get two answers, in order.
TEST(HttpTransportTest, PipelinedRequestsGetBothAnswersInOrder) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  RawConnection c(server.port());
  c.Send(Post("/v1/completions", R"({"prompt":"Once upon","max_tokens":4,"temperature":0})") +
         "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string answers = c.ReadAll(20);
  EXPECT_EQ(CountOf(answers, "HTTP/1.1 200 OK"), 2) << answers;
  const size_t completion = answers.find("text_completion");
  const size_t models = answers.find("\"owned_by\"");
  ASSERT_NE(completion, std::string::npos) << answers;
  ASSERT_NE(models, std::string::npos) << answers;
  EXPECT_LT(completion, models);
}

// An HTTP/1.0 client cannot read chunked encoding: its stream ends with the connection, and a
// plain answer has a Content-Length.
TEST(HttpTransportTest, Http10GetsNoChunkedEncoding) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  const std::string body = R"({"prompt":"Once upon","max_tokens":6,"stream":true})";
  RawConnection stream(server.port());
  stream.Send(
      fmt::format("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  "Content-Length: {}\r\n\r\n{}",
                  body.size(), body));
  const std::string streamed = stream.ReadAll(20);
  EXPECT_TRUE(streamed.starts_with("HTTP/1.0 200")) << streamed.substr(0, 200);
  EXPECT_EQ(streamed.find("chunked"), std::string::npos) << streamed.substr(0, 300);
  // The frames follow the head as they are, with no chunk sizes between them.
  EXPECT_NE(streamed.find("\r\n\r\ndata: {"), std::string::npos) << streamed.substr(0, 300);
  EXPECT_TRUE(streamed.ends_with("data: [DONE]\n\n")) << streamed;

  RawConnection plain(server.port());
  plain.Send("GET /v1/models HTTP/1.0\r\n\r\n");
  const std::string answer = plain.ReadAll(10);
  EXPECT_TRUE(answer.starts_with("HTTP/1.0 200")) << answer;
  EXPECT_NE(answer.find("Content-Length: "), std::string::npos) << answer;
  EXPECT_EQ(answer.find("chunked"), std::string::npos) << answer;
}

// --cors-origin: a browser's preflight gets 204 with the Allow-* headers, every answer the
// origin. Without it (the default) there is no CORS at all.
TEST(HttpTransportTest, CorsPreflightWhenOnAndNoCorsHeadersWhenOff) {
  const std::string preflight =
      "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n"
      "Access-Control-Request-Method: POST\r\n"
      "Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n";
  {
    ServerProcess server({"--cors-origin", "https://app.example"});
    ASSERT_TRUE(server.WaitReady()) << server.Log();
    RawConnection c(server.port());
    c.Send(preflight);
    const std::string answer = c.ReadAll(10);
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 204")) << answer;
    EXPECT_NE(answer.find("Access-Control-Allow-Origin: https://app.example\r\n"),
              std::string::npos)
        << answer;
    EXPECT_NE(answer.find("Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"),
              std::string::npos)
        << answer;
    EXPECT_NE(answer.find("Access-Control-Allow-Headers: authorization, content-type\r\n"),
              std::string::npos)
        << answer;
    httplib::Client client("127.0.0.1", server.port());
    auto res = client.Get("/v1/models", {{"Origin", "https://app.example"}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  }
  {
    ServerProcess server({});
    ASSERT_TRUE(server.WaitReady()) << server.Log();
    RawConnection c(server.port());
    c.Send(preflight);
    const std::string answer = c.ReadAll(10);
    EXPECT_EQ(answer.find("Access-Control-"), std::string::npos) << answer;
    httplib::Client client("127.0.0.1", server.port());
    auto res = client.Get("/v1/models", {{"Origin", "https://app.example"}});
    ASSERT_TRUE(res);
    EXPECT_FALSE(res->has_header("Access-Control-Allow-Origin"));
  }
}

// Waits until the server counted `cancels` disconnect cancels and as many requests finished as
// aborted (false after 20 s).
bool WaitForCancels(int port, double cancels) {
  for (int i = 0; i < 400; ++i) {
    if (Metric(port, "kvl:request_disconnect_cancels_total") >= cancels &&
        Metric(port, "kvl:request_success_total{finished_reason=\"abort\"}") >= cancels) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// A plain (non-streaming) request whose client reset its connection used to run to its
// max_tokens (400 tokens for nobody). The closed socket is noticed while the request runs and
// cancels it: generation stops far short of max_tokens.
TEST(HttpTransportTest, APlainRequestWhoseClientLeftIsCancelled) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  constexpr int kMaxTokens = 480;
  {
    RawConnection c(server.port());
    // Log-probabilities make each step slower, so that the request is still running.
    c.Send(Post("/v1/completions",
                fmt::format(R"({{"prompt":"Once upon","max_tokens":{},"ignore_eos":true,)"
                            R"("logprobs":5}})",
                            kMaxTokens)));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.Reset();
  }
  ASSERT_TRUE(WaitForCancels(server.port(), 1)) << server.Log();
  EXPECT_EQ(Metric(server.port(), "kvl:request_success_total{finished_reason=\"abort\"}"), 1);
  const double generated = Metric(server.port(), "kvl:generation_tokens_total");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(Metric(server.port(), "kvl:generation_tokens_total"), generated);
  EXPECT_LT(generated, kMaxTokens);
}

// A request still queued behind another (-np 1) whose client leaves is cancelled before it
// runs: it never generates a token, and the running request is not disturbed.
TEST(HttpTransportTest, AQueuedRequestWhoseClientLeftNeverRuns) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  constexpr int kRunningTokens = 300;
  RawConnection running(server.port());
  running.Send(Post("/v1/completions",
                    fmt::format(R"({{"prompt":"Once upon","max_tokens":{},"ignore_eos":true,)"
                                R"("logprobs":5,"stream":true}})",
                                kRunningTokens)));
  // Its first frame: it holds the only sequence.
  running.ReadUntil([](const std::string& s) { return s.find("data: {") != s.npos; }, 20);
  {
    RawConnection queued(server.port());
    queued.Send(
        Post("/v1/completions", R"({"prompt":"Twice upon","max_tokens":200,"ignore_eos":true})"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WaitForCancels(server.port(), 1)) << server.Log();
  const std::string rest =
      running.ReadUntil([](const std::string& s) { return s.find("data: [DONE]") != s.npos; }, 60);
  EXPECT_NE(rest.find("\"finish_reason\":\"length\""), std::string::npos);
  // Only the running request's tokens were generated (the queued one was cancelled before it
  // was admitted, or at worst right after).
  EXPECT_LT(Metric(server.port(), "kvl:generation_tokens_total"), kRunningTokens + 50);
}

// A client that closes its sending side after its request (shutdown(SHUT_WR), as some HTTP/1.0
// clients do) still reads: it gets its whole answer, plain or streamed, with nothing added to
// the bytes. The FIN used to be taken as a client gone: its request was cancelled and the
// connection closed unanswered. (A client that closes its socket is still noticed at once:
// AQueuedRequestWhoseClientLeftNeverRuns.)
TEST(HttpTransportTest, AHalfClosedClientStillGetsItsAnswer) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  const std::string body = R"({"prompt":"Once upon","max_tokens":40,"ignore_eos":true})";
  RawConnection plain(server.port());
  plain.Send(
      fmt::format("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  "Content-Length: {}\r\n\r\n{}",
                  body.size(), body));
  plain.ShutdownWrite();
  const std::string answer = plain.ReadAll(60);
  EXPECT_TRUE(answer.starts_with("HTTP/1.0 200 OK\r\n")) << answer;
  EXPECT_NE(answer.find(R"("finish_reason":"length")"), std::string::npos) << answer;
  EXPECT_NE(answer.find(R"("completion_tokens":40)"), std::string::npos) << answer;

  const std::string stream_body =
      R"({"prompt":"Once upon","max_tokens":40,"ignore_eos":true,"stream":true})";
  RawConnection streamed(server.port());
  streamed.Send(Post("/v1/completions", stream_body));
  streamed.ShutdownWrite();
  const std::string frames = streamed.ReadAll(60);
  EXPECT_TRUE(frames.starts_with("HTTP/1.1 200 OK\r\n")) << frames.substr(0, 200);
  EXPECT_NE(frames.find(R"("finish_reason":"length")"), std::string::npos) << frames;
  EXPECT_TRUE(frames.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n")) << frames;
  // Requests pipelined before the FIN are each answered, in order, before the server closes.
  RawConnection pipelined(server.port());
  pipelined.Send(Post("/v1/completions", body) + "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  pipelined.ShutdownWrite();
  const std::string answers = pipelined.ReadAll(60);
  EXPECT_EQ(CountOf(answers, "HTTP/1.1 200 OK\r\n"), 2) << answers;
  EXPECT_LT(answers.find("text_completion"), answers.find("\"owned_by\"")) << answers;

  EXPECT_EQ(Metric(server.port(), "kvl:request_disconnect_cancels_total"), 0);
  EXPECT_EQ(Metric(server.port(), "kvl:request_success_total{finished_reason=\"length\"}"), 3);
}

}  // namespace
}  // namespace kvl
