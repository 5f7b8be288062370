// libFuzzer target for the kvl command line: any argument vector must parse and validate into a
// command or a Status, never crash, hang or overflow (UndefinedBehaviorSanitizer checks the
// arithmetic). Nothing is run: ParseCommandLine opens no file and starts no work.
//
// The input is split at NUL bytes into arguments; the first selects the command from a short
// list so the fuzzer spends its time on the flags, not on spelling "run".
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* const kCommands[] = {"run", "bench", "synth", "calibrate", "inspect", ""};
  if (size == 0) return 0;
  std::vector<std::string> args;
  const char* command = kCommands[data[0] % (sizeof(kCommands) / sizeof(kCommands[0]))];
  if (command[0] != '\0') args.emplace_back(command);
  std::string current;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) args.push_back(current);
  kvl::StatusOr<kvl::cli::ParsedCommand> parsed = kvl::cli::ParseCommandLine(args);
  if (parsed.ok() && parsed->kind == kvl::cli::ParsedCommand::Kind::kRun) {
    // What validation let through must be what the engine accepts too.
    kvl::StatusOr<kvl::EngineOptions> options = kvl::cli::RunEngineOptions(parsed->run);
    if (!options.ok() || !kvl::ValidateEngineOptions(*options).ok()) __builtin_trap();
  }
  return 0;
}
