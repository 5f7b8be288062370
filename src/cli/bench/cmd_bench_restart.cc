// kvl bench turns --restart: does the KV store survive a restart? One long prompt's TTFT in a
// fresh process with a new persistent disk tier (cold), then in another fresh process on the
// same file (the first process's pages, reloaded from disk), and whether the output is the same.
// With --redis, the same through a Redis tier (two processes sharing one server). Each phase is
// this binary run again with the internal --restart-phase flag, so the second one is a new process
// that shares nothing with the first but the tier.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_turns.h"
#include "kvl/engine.h"
#include "kvl/model.h"

extern char** environ;

namespace kvl::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The phase's flags, passed on to the child: every engine flag bench turns takes.
std::vector<std::string> PhaseArgv(const std::string& self, const BenchTurnsArgs& args,
                                   const std::string& phase, const std::string& tier) {
  const EngineOptions& e = args.engine;
  std::vector<std::string> v = {self, "bench", "turns", "--restart-phase", phase,
                                "--restart-tier", tier, "-m", e.model_path,
                                "--restart-tokens", std::to_string(args.restart_tokens),
                                "--reply", std::to_string(args.reply_tokens),
                                "--seed", std::to_string(args.seed),
                                "-t", std::to_string(e.num_threads),
                                "-c", std::to_string(e.context_length),
                                "-b", std::to_string(e.batch_size), "--isa", e.isa,
                                "--cache-type-k", e.cache_type_k, "--cache-type-v", e.cache_type_v,
                                "--kv-sink", std::to_string(e.kv_sink_tokens),
                                "--kv-recent", std::to_string(e.kv_recent_tokens),
                                "--kv-stream-reserve", fmt::format("{}", e.kv_stream_reserve)};
  if (!e.profile_path.empty()) v.insert(v.end(), {"--kv-profile", e.profile_path});
  if (!e.calibrate) v.push_back("--no-calibrate");
  return v;
}

// What one phase measured, read back from the child's last stdout line.
struct PhaseResult {
  double ttft_ms = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, prefilled_tokens = 0;
  std::vector<int32_t> output;
  nlohmann::json tiers;
  std::string error;
};

constexpr std::string_view kPhaseTag = "KVL_RESTART_PHASE ";

PhaseResult RunPhase(const std::string& self, const BenchTurnsArgs& args, const std::string& phase,
                     const std::string& tier) {
  PhaseResult r;
  std::string out;
  StatusOr<int> rc = RunChildProcess(PhaseArgv(self, args, phase, tier), &out);
  if (!rc.ok()) {
    r.error = rc.status().ToString();
    return r;
  }
  const size_t at = out.rfind(kPhaseTag);
  if (*rc != 0 || at == std::string::npos) {
    r.error = fmt::format("the {} phase exited with {}", phase, *rc);
    return r;
  }
  const nlohmann::json j = nlohmann::json::parse(out.substr(at + kPhaseTag.size()), nullptr, false);
  if (j.is_discarded()) {
    r.error = fmt::format("the {} phase printed no result", phase);
    return r;
  }
  r.ttft_ms = j.value("ttft_ms", 0.0);
  r.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  r.cached_tokens = j.value("cached_tokens", int64_t{0});
  r.prefilled_tokens = j.value("prefilled_tokens", int64_t{0});
  r.output = j.value("output", std::vector<int32_t>{});
  r.tiers = j.value("tiers", nlohmann::json::array());
  r.error = j.value("error", std::string());
  return r;
}

// A port nothing listens on now (the kernel's pick for port 0).
StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return IoError(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port < 0) return IoError("no free loopback port");
  return port;
}

bool Connects(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// A redis-server of the bench's own (no persistence, loopback only), stopped by its destructor.
class OwnRedis {
 public:
  ~OwnRedis() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  Status Start() {
    KVL_ASSIGN_OR_RETURN(port_, FreeLoopbackPort());
    const std::string port = std::to_string(port_);
    std::vector<std::string> argv = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                                     "--loglevel", "warning"};
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const int err = posix_spawnp(&pid_, "redis-server", &actions, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      pid_ = -1;
      return IoError(fmt::format("cannot start redis-server: {}", std::strerror(err)));
    }
    for (int i = 0; i < 100; ++i) {  // up to 5 s
      if (Connects(port_)) return Status::Ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return IoError(fmt::format("redis-server did not listen on port {}", port_));
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

struct RestartRow {
  std::string tier;  // "disk", "redis"
  std::string spec;
  PhaseResult cold, warm;
};

nlohmann::json TierMetricsJson(const KvTierMetrics& t) {
  return {{"name", t.name},           {"bytes_used", t.bytes_used},
          {"pages", t.pages},         {"lookups", t.lookups},
          {"hit_blocks", t.hit_blocks}, {"hit_tokens", t.hit_tokens},
          {"blocks_promoted", t.blocks_promoted},
          {"promote_ms_predicted", t.promote_ms_predicted},
          {"promote_ms_measured", t.promote_ms_measured},
          {"pages_in", t.pages_in},   {"bytes_in", t.bytes_in},
          {"pages_out", t.pages_out}, {"bytes_out", t.bytes_out},
          {"errors", t.errors},       {"checksum_failures", t.checksum_failures}};
}

nlohmann::json PhaseJson(const PhaseResult& p) {
  return {{"ttft_ms", p.ttft_ms},           {"prompt_tokens", p.prompt_tokens},
          {"cached_tokens", p.cached_tokens}, {"prefilled_tokens", p.prefilled_tokens},
          {"output", p.output},             {"tiers", p.tiers},
          {"error", p.error}};
}

}  // namespace

StatusOr<std::string> SelfExecutable() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return IoError(fmt::format("cannot read /proc/self/exe: {}", ec.message()));
  return p.string();
}

StatusOr<int> RunChildProcess(const std::vector<std::string>& argv, std::string* out,
                              bool with_stderr) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return IoError(fmt::format("pipe: {}", std::strerror(errno)));
  std::vector<std::string> copy = argv;
  std::vector<char*> cargv;
  for (std::string& a : copy) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (with_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    return IoError(fmt::format("cannot run {}: {}", argv[0], std::strerror(err)));
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    return InternalError(fmt::format("{} died of signal {}", argv[0], WTERMSIG(status)));
  }
  return WEXITSTATUS(status);
}

// In the child: one engine with the phase's tier, a short untimed request to page the weights
// in, then the long prompt timed to its first token. The result is one tagged JSON line.
int BenchRestartPhase(const BenchTurnsArgs& args) {
  nlohmann::json result = {{"phase", args.restart_phase}};
  auto fail = [&](const Status& s) {
    result["error"] = s.ToString();
    fmt::print("{}{}\n", kPhaseTag, result.dump());
    return 1;
  };
  EngineOptions options = args.engine;
  options.max_seqs = 1;
  options.prefix_cache = true;
  options.kv_policy = "auto";
  options.kv_tiers = {args.restart_tier};
  if (options.context_length == 0) {
    options.context_length = args.restart_tokens + args.reply_tokens + options.block_tokens;
  }
  StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  if (!engine.ok()) return fail(engine.status());
  Engine& e = **engine;
  std::mt19937_64 rng(args.seed * 7919u + 17);
  std::vector<int32_t> prompt = {e.tokenizer().bos()};
  const std::vector<int32_t> words = ScriptedTokens(e.tokenizer(), args.restart_tokens - 1, &rng);
  prompt.insert(prompt.end(), words.begin(), words.end());
  {
    // Shorter than a block: it pages the weights in and stores nothing.
    Request warm;
    warm.prompt_ids = {prompt[0], prompt[1], prompt[2]};
    warm.max_new_tokens = 2;
    warm.ignore_eos = true;
    warm.sampling.temperature = 0;
    const StatusOr<RequestId> id = e.Submit(std::move(warm), [](const TokenEvent&) {});
    if (!id.ok()) return fail(id.status());
    e.RunUntilIdle();
  }
  const int64_t prefilled_before = e.Metrics().tokens_prefilled;
  Request r;
  r.prompt_ids = prompt;
  r.max_new_tokens = args.reply_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  std::vector<int32_t> output;
  int64_t cached = 0;
  Status error;
  const Clock::time_point start = Clock::now();
  Clock::time_point first = start;
  const StatusOr<RequestId> id = e.Submit(std::move(r), [&](const TokenEvent& ev) {
    if (ev.token >= 0) {
      if (output.empty()) first = Clock::now();
      output.push_back(ev.token);
    }
    if (ev.finished) {
      cached = ev.cached_prompt_tokens;
      error = ev.error;
    }
  });
  if (!id.ok()) return fail(id.status());
  e.RunUntilIdle();
  if (!error.ok()) return fail(error);
  const EngineMetrics m = e.Metrics();
  nlohmann::json tiers = nlohmann::json::array();
  for (const KvTierMetrics& t : m.kv_tiers) tiers.push_back(TierMetricsJson(t));
  result["ttft_ms"] = std::chrono::duration<double, std::milli>(first - start).count();
  result["prompt_tokens"] = prompt.size();
  result["cached_tokens"] = cached;
  result["prefilled_tokens"] = m.tokens_prefilled - prefilled_before;
  result["output"] = output;
  result["tiers"] = tiers;
  engine->reset();  // closes the tiers (the disk tier's lock) before the parent goes on
  fmt::print("{}{}\n", kPhaseTag, result.dump());
  return 0;
}

int BenchRestart(const BenchTurnsArgs& args) {
  StatusOr<std::string> self = SelfExecutable();
  if (!self.ok()) {
    fmt::print(stderr, "kvl: {}\n", self.status().message());
    return 1;
  }
  StatusOr<std::unique_ptr<Model>> model = Model::Load(args.engine.model_path);
  if (!model.ok()) {
    fmt::print(stderr, "kvl: {}\n", model.status().ToString());
    return 1;
  }
  const ModelConfig& mc = (*model)->config();
  // The disk tier: persistent (not scratch), a new file of this run's own, removed at the end.
  const int64_t layer_page = int64_t{args.engine.block_tokens} * mc.kv_dim() * 2 * 4;
  const int64_t slot = (layer_page + 64 + 4095) / 4096 * 4096;
  const int64_t disk_bytes = (args.restart_tokens / args.engine.block_tokens + 4) *
                                 (mc.num_layers + 1) * slot * 5 / 4 + (16ll << 20);
  const std::filesystem::path disk_path =
      std::filesystem::path(args.disk_dir) / fmt::format("kvl-bench-restart-{}.pages", getpid());
  std::vector<RestartRow> rows;
  rows.push_back({"disk", fmt::format("disk:{}:{}", disk_path.string(), disk_bytes), {}, {}});

  OwnRedis own_redis;
  if (!args.redis.empty()) {
    // A namespace of this run's own, so that the cold phase is cold; pages expire within the hour.
    std::string host = "127.0.0.1";
    int port = 0;
    std::string ns = "kvl";
    if (args.redis == "auto") {
      if (const Status s = own_redis.Start(); !s.ok()) {
        fmt::print(stderr, "kvl: redis skipped: {}\n", s.message());
      } else {
        port = own_redis.port();
      }
    } else {
      const TierSpec spec = ParseTierSpec(args.redis).value();  // validated when parsed
      host = spec.host.find(':') != std::string::npos ? "[" + spec.host + "]" : spec.host;
      port = spec.port;
      ns = spec.name_space;
    }
    if (port > 0) {
      rows.push_back({"redis",
                      fmt::format("redis://{}:{}/{}-bench-{}?ttl=3600", host, port, ns, getpid()),
                      {}, {}});
    }
  }
  fmt::print("model {}, a prompt of {} tokens, {} tokens generated; each phase a fresh process\n",
             mc.name, args.restart_tokens, args.reply_tokens);
  (void)FlushStdout();
  int rc = 0;
  for (RestartRow& row : rows) {
    fmt::print(stderr, "kvl: restart through {}: cold ({})\n", row.tier, row.spec);
    row.cold = RunPhase(*self, args, "cold", row.spec);
    if (row.cold.error.empty()) {
      fmt::print(stderr, "kvl: restart through {}: a fresh process on the same tier\n", row.tier);
      row.warm = RunPhase(*self, args, "warm", row.spec);
    }
    if (!row.cold.error.empty() || !row.warm.error.empty()) rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove(disk_path, ec);

  fmt::print("\n| {:<6} | {:>6} | {:>13} | {:>17} | {:>7} | {:>14} | {:>15} | {:>16} |\n", "tier",
             "prompt", "cold TTFT ms", "restart TTFT ms", "ratio", "cached tokens",
             "prefilled tokens", "output identical");
  fmt::print("| {:-<6} | {:->6} | {:->13} | {:->17} | {:->7} | {:->14} | {:->15} | {:->16} |\n",
             ":", ":", ":", ":", ":", ":", ":", ":");
  nlohmann::json out = {{"model", args.engine.model_path},
                        {"prompt_tokens", args.restart_tokens},
                        {"reply_tokens", args.reply_tokens},
                        {"rows", nlohmann::json::array()}};
  for (const RestartRow& row : rows) {
    if (!row.cold.error.empty() || !row.warm.error.empty()) {
      fmt::print("| {:<6} | failed: {} |\n", row.tier,
                 row.cold.error.empty() ? row.warm.error : row.cold.error);
    } else {
      const bool same = row.cold.output == row.warm.output;
      fmt::print("| {:<6} | {:>6} | {:>13.1f} | {:>17.1f} | {:>6.1f}x | {:>14} | {:>15} | {:>16} |\n",
                 row.tier, row.cold.prompt_tokens, row.cold.ttft_ms, row.warm.ttft_ms,
                 row.warm.ttft_ms > 0 ? row.cold.ttft_ms / row.warm.ttft_ms : 0.0,
                 row.warm.cached_tokens, row.warm.prefilled_tokens, same ? "yes" : "NO");
      if (!same) rc = 1;
    }
    out["rows"].push_back({{"tier", row.tier}, {"spec", row.spec},
                           {"cold", PhaseJson(row.cold)}, {"restart", PhaseJson(row.warm)},
                           {"ratio", row.warm.ttft_ms > 0 ? row.cold.ttft_ms / row.warm.ttft_ms : 0.0},
                           {"identical", row.cold.output == row.warm.output}});
  }
  if (!args.json_path.empty()) {
    std::ofstream f(args.json_path);
    f << out.dump(1) << "\n";
    if (!f.good()) {
      fmt::print(stderr, "kvl: cannot write {}\n", args.json_path);
      return 1;
    }
  }
  return rc;
}

}  // namespace kvl::cli
