// A redis-server of the test's own on a free loopback port (fork/exec, killed by its pid; no
// system service, no mocks), and a raw hiredis client to look at and damage what a tier wrote.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvl {

// A loopback port nobody listens on now: bound to port 0, read back, closed.
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

struct RawReplyDeleter {
  void operator()(redisReply* reply) const {
    if (reply != nullptr) freeReplyObject(reply);
  }
};
using RawReply = std::unique_ptr<redisReply, RawReplyDeleter>;

// Raw commands on a server, for tests to read and damage what a tier stored.
class RawRedis {
 public:
  explicit RawRedis(int port) {
    const timeval timeout{2, 0};
    context_ = redisConnectWithTimeout("127.0.0.1", port, timeout);
    if (context_ != nullptr && context_->err == 0) redisSetTimeout(context_, timeout);
  }
  ~RawRedis() {
    if (context_ != nullptr) redisFree(context_);
  }
  RawRedis(const RawRedis&) = delete;
  RawRedis& operator=(const RawRedis&) = delete;

  bool ok() const { return context_ != nullptr && context_->err == 0; }

  // Null when the connection failed.
  RawReply Command(std::initializer_list<std::string_view> args) {
    if (!ok()) return nullptr;
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (std::string_view arg : args) {
      argv.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    return RawReply(static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
  }
  // A reply's string, or "" when there is none.
  std::string String(std::initializer_list<std::string_view> args) {
    RawReply reply = Command(args);
    if (!reply || (reply->type != REDIS_REPLY_STRING && reply->type != REDIS_REPLY_STATUS))
      return "";
    return std::string(reply->str, reply->len);
  }
  // A reply's integer, or INT64_MIN when it is not one.
  int64_t Integer(std::initializer_list<std::string_view> args) {
    RawReply reply = Command(args);
    if (!reply || reply->type != REDIS_REPLY_INTEGER) return INT64_MIN;
    return reply->integer;
  }
  std::vector<std::string> Keys(std::string_view pattern) {
    std::vector<std::string> keys;
    RawReply reply = Command({"KEYS", pattern});
    if (!reply || reply->type != REDIS_REPLY_ARRAY) return keys;
    for (size_t i = 0; i < reply->elements; ++i) {
      keys.emplace_back(reply->element[i]->str, reply->element[i]->len);
    }
    return keys;
  }

 private:
  redisContext* context_ = nullptr;
};

class RedisServerProcess {
 public:
  // The redis-server binary, or "" when it is not installed.
  static std::string FindBinary() {
    std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
    path += ":/usr/bin:/usr/sbin:/usr/local/bin";
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      if (dir.empty()) continue;
      const std::string candidate = dir + "/redis-server";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return "";
  }

  RedisServerProcess() = default;
  RedisServerProcess(const RedisServerProcess&) = delete;
  RedisServerProcess& operator=(const RedisServerProcess&) = delete;
  // The log stays while the process object lives (a failed start names it), then goes.
  ~RedisServerProcess() {
    Kill();
    RemoveLog();
  }

  // Starts a server on `port` with `extra` arguments (e.g. {"--maxmemory", "8mb"}) and waits
  // until it answers PING. False (with why()) when it exits or stays silent for 10 s.
  bool Start(int port, std::vector<std::string> extra = {}) {
    Kill();
    port_ = port;
    const std::string binary = FindBinary();
    const std::string dir = ::testing::TempDir();
    std::vector<std::string> args = {binary,      "--port",       std::to_string(port),
                                     "--bind",    "127.0.0.1",    "--save",
                                     "",          "--appendonly", "no",
                                     "--daemonize", "no",         "--dir",
                                     dir,         "--loglevel",   "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    RemoveLog();
    log_path_ = dir + "kvl_redis_" + std::to_string(::getpid()) + "_" + std::to_string(port) + ".log";
    const std::string& log = log_path_;
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid_ < 0) {
      why_ = "fork failed";
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        why_ = "redis-server exited at start; its log: " + log;
        return false;
      }
      RawRedis raw(port);
      if (raw.ok() && raw.String({"PING"}) == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    why_ = "redis-server did not answer PING within 10 s; its log: " + log;
    Kill();
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void RemoveLog() {
    if (!log_path_.empty()) std::remove(log_path_.c_str());
    log_path_.clear();
  }
  void Pause() { ::kill(pid_, SIGSTOP); }   // a server that hangs: accepts, never answers
  void Resume() { ::kill(pid_, SIGCONT); }

  int port() const { return port_; }
  const std::string& why() const { return why_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string why_;
  std::string log_path_;
};

}  // namespace kvl
