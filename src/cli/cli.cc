#include "cli.h"

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <new>
#include <system_error>

#include "kvl/temp_files.h"
#include "options.h"

namespace kvl::cli {

std::string FormatParams(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f} M", n / 1e6);
  return fmt::format("{:.2f} K", n / 1e3);
}

std::string FormatBytes(int64_t n) {
  const double b = static_cast<double>(n);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.2f} KiB", b / 1024.0);
}

namespace {

int RunParsed(const ParsedCommand& cmd) {
  switch (cmd.kind) {
    case ParsedCommand::Kind::kPrint:
      std::fputs(cmd.text.c_str(), stdout);
      return 0;
    case ParsedCommand::Kind::kRun: return RunCommand(cmd.run);
    case ParsedCommand::Kind::kChat: return ChatCommand(cmd.chat);
    case ParsedCommand::Kind::kServe: return ServeCommand(cmd.serve);
    case ParsedCommand::Kind::kInspect: return InspectCommand(cmd.inspect);
    case ParsedCommand::Kind::kSynth: return SynthCommand(cmd.synth);
    case ParsedCommand::Kind::kBench: return BenchCommand(cmd.bench);
    case ParsedCommand::Kind::kBenchServe: return BenchServeCommand(cmd.bench_serve);
    case ParsedCommand::Kind::kBenchReplay: return BenchReplayCommand(cmd.bench_replay);
    case ParsedCommand::Kind::kBenchTurns: return BenchTurnsCommand(cmd.bench_turns);
    case ParsedCommand::Kind::kBenchFrontier: return BenchFrontierCommand(cmd.bench_frontier);
    case ParsedCommand::Kind::kBenchQuality: return BenchQualityCommand(cmd.bench_quality);
    case ParsedCommand::Kind::kBenchSpec: return BenchSpecCommand(cmd.bench_spec);
    case ParsedCommand::Kind::kBenchLattice: return BenchLatticeCommand(cmd.bench_lattice);
    case ParsedCommand::Kind::kCalibrate: return CalibrateCommand(cmd.calibrate);
    case ParsedCommand::Kind::kTokenize: return TokenizeCommand(cmd.tokenize);
    case ParsedCommand::Kind::kPerplexity: return PerplexityCommand(cmd.perplexity);
  }
  return 1;
}

int g_stdout_errno = 0;  // the first write error seen on stdout

}  // namespace

Status FlushStdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 && g_stdout_errno == 0) g_stdout_errno = errno != 0 ? errno : EIO;
  if (std::ferror(stdout) == 0) return Status::Ok();
  if (g_stdout_errno == 0) g_stdout_errno = EIO;
  return IoError(
      fmt::format("cannot write to standard output: {}", std::strerror(g_stdout_errno)));
}

int Main(int argc, char** argv) {
  // A closed pipe becomes a write error (EPIPE) that the command reports and exits non-zero on,
  // after removing its temporary files; the other ending signals remove them in the handler.
  std::signal(SIGPIPE, SIG_IGN);
  InstallTempFileCleanup();
  int rc = 1;
  try {
    StatusOr<ParsedCommand> cmd = ParseCommandLine(std::vector<std::string>(argv + 1, argv + argc));
    if (!cmd.ok()) {
      fmt::print(stderr, "kvl: {}\n", cmd.status().message());
      return 1;
    }
    for (const std::string& note : cmd->notes) fmt::print(stderr, "kvl: {}\n", note);
    rc = RunParsed(*cmd);
  } catch (const std::bad_alloc&) {
    // The boundary for allocations the library does not turn into a Status itself.
    std::fputs("kvl: out of memory: the system refused an allocation (lower -c, -np, -b or "
               "--kv-budget)\n", stderr);
    return 1;
  } catch (const std::system_error& e) {
    // Threads that cannot start (a low ulimit -u), or fmt failing to write to stdout.
    if (std::ferror(stdout) != 0) {
      fmt::print(stderr, "kvl: cannot write to standard output: {}\n", e.code().message());
    } else {
      fmt::print(stderr, "kvl: the system refused a resource: {}\n", e.what());
    }
    return 1;
  }
  if (const Status s = FlushStdout(); !s.ok()) {
    fmt::print(stderr, "kvl: {}\n", s.message());
    return 1;
  }
  return rc;
}
}  // namespace kvl::cli
