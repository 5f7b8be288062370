// A `kvl serve` child process on a free loopback port and the helpers the server tests share:
// JSON posts, the frames of an SSE body and the greedy reference every served output must equal.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl::testing {

inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A `kvl serve` child process, killed (by its pid) when the object goes. It is started with
// --port 0 and the port it bound is read from its log: a port picked here and passed to it could
// be taken by another process in between (tests run in parallel).
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra_args)
      : ServerProcess(Stories260KPath(), std::move(extra_args)) {}
  ServerProcess(const std::string& model_path, std::vector<std::string> extra_args) {
    static std::atomic<int> count{0};
    std::vector<std::string> args = {KVL_KVL_BINARY,  "serve", "-m", model_path,
                                     "--port",        "0",     "-t", "1",
                                     "--no-calibrate"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    log_path_ = ::testing::TempDir() + "kvl_serve_" + std::to_string(::getpid()) + "_" +
                std::to_string(count++) + ".log";
    pid_ = ::fork();
    if (pid_ == 0) {
      std::freopen(log_path_.c_str(), "w", stderr);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::remove(log_path_.c_str());
  }

  // Reads the port from the log ("listening on http://127.0.0.1:PORT"), then polls /health until
  // it answers 200; false after 30 s or when the process exited.
  bool WaitReady() {
    const std::string key = "listening on http://127.0.0.1:";
    for (int i = 0; i < 600; ++i) {
      if (port_ <= 0) {
        const std::string log = Log();
        const size_t at = log.find(key);
        if (at != std::string::npos && log.find('\n', at) != std::string::npos) {
          port_ = std::atoi(log.c_str() + at + key.size());
        }
      }
      if (port_ > 0) {
        httplib::Client client("127.0.0.1", port_);
        if (auto res = client.Get("/health"); res && res->status == 200) return true;
      }
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        reaped_ = true;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // SIGTERM, then the exit status (-1: not an exit, or it took longer than `seconds`).
  int Terminate(int seconds) {
    ::kill(pid_, SIGTERM);
    return WaitExit(seconds);
  }
  // The exit status once the process ends by itself (-1: not an exit, or not within `seconds`).
  int WaitExit(int seconds) {
    for (int i = 0; i < seconds * 50; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // What the server wrote on stderr so far (for failure messages).
  std::string Log() const {
    std::string text;
    if (FILE* f = std::fopen(log_path_.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
      std::fclose(f);
    }
    return text;
  }

 private:
  int port_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

inline httplib::Result PostJson(httplib::Client& client, const std::string& path,
                                const std::string& body, const httplib::Headers& headers = {}) {
  return client.Post(path.c_str(), headers, body, "application/json");
}

// The text Engine::Generate gives for `prompt` under `sampling`, in-process: the reference a
// served output must equal.
inline std::string EngineReference(const std::string& prompt, int max_tokens,
                                   const SamplingParams& sampling) {
  static std::unique_ptr<Engine> engine = [] {
    EngineOptions options;
    options.model_path = Stories260KPath();
    options.num_threads = 1;
    options.calibrate = false;
    auto e = Engine::Create(options);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }();
  GenerateRequest request;
  request.prompt = prompt;
  request.max_new_tokens = max_tokens;
  request.sampling = sampling;
  auto result = engine->Generate(request);
  EXPECT_TRUE(result.ok());
  return result.ok() ? result->text : "";
}

// The greedy text, the reference every served greedy output must equal.
inline std::string GreedyReference(const std::string& prompt, int max_tokens) {
  SamplingParams greedy;
  greedy.temperature = 0;
  return EngineReference(prompt, max_tokens, greedy);
}

// The frames of an SSE body ("data: ..." lines), in order.
inline std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> frames;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    frames.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end == std::string::npos ? body.size() : end;
  }
  return frames;
}

}  // namespace kvl::testing
