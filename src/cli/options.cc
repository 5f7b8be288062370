// The kvl command line, parsed (CLI11) and validated: ParseCommandLine assembles the commands,
// each declared with its flags and checks in its own *_flags.cc (command_flags.h). Nothing here
// opens a file, allocates by a user's number or starts work.
#include "options.h"

#include <fmt/format.h>

#include <charconv>
#include <sstream>
#include <string_view>

#include "command_flags.h"
#include "llama_flags.h"

namespace kvl::cli {
namespace {

// llama.cpp's multi-letter single-dash flags, which CLI11 cannot declare, mapped to long names
// (both "-ctk f16" and "-ctk=f16"). The order stays the user's (CLI11 wants it reversed).
std::vector<std::string> NormalizeArgs(const std::vector<std::string>& in) {
  struct Alias {
    std::string_view short_name, long_name;
  };
  static constexpr Alias kAliases[] = {
      {"-np", "--parallel"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"},
      {"-md", "--model-draft"}};
  std::vector<std::string> args;
  for (const std::string& word : in) {
    std::string a = word;
    for (const Alias& alias : kAliases) {
      if (a == alias.short_name) {
        a = alias.long_name;
      } else if (a.size() > alias.short_name.size() && a.starts_with(alias.short_name) &&
                 a[alias.short_name.size()] == '=') {
        a = std::string(alias.long_name) + a.substr(alias.short_name.size());
      }
    }
    args.push_back(a);
  }
  return args;
}

}  // namespace

StatusOr<uint64_t> ParseSeed(const std::string& text, std::string_view flag) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return InvalidArgumentError(fmt::format(
        "{} must be an integer in [0, 18446744073709551615], got '{}'", flag, text));
  }
  return value;
}

// CLI11 splits a comma list and drops its empty entries, so `-np 1,,2` ran as `-np 1,2`: a
// typo measured something else without a word. Every bench list value is checked whole first.
static Status CheckBenchListValues(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] != "bench") return Status::Ok();  // argv: the words after "kvl"
  for (size_t i = 2; i < argv.size(); ++i) {
    const std::string& flag = argv[i - 1];
    const std::string& value = argv[i];
    if (flag.size() < 2 || flag[0] != '-' || value.find(',') == std::string::npos) continue;
    if (value.find(",,") != std::string::npos || value.front() == ',' || value.back() == ',') {
      return InvalidArgumentError(
          fmt::format("{}: an empty entry in the list '{}' (give values separated by single "
                      "commas)",
                      flag, value));
    }
  }
  return Status::Ok();
}

StatusOr<ParsedCommand> ParseCommandLine(const std::vector<std::string>& user_argv) {
  InertFlagsRemoved inert = RemoveInertLlamaFlags(user_argv);
  KVL_RETURN_IF_ERROR(CheckBenchListValues(inert.args));  // names the flag as the user typed it
  const std::vector<std::string> argv = NormalizeArgs(inert.args);
  ParsedCommand cmd;
  cmd.notes = std::move(inert.notes);
  CLI::App app{"kvlattice: LLM inference with a managed KV memory hierarchy", "kvl"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvl 0.1.0");

  // A bench subcommand before bench itself: naming one names bench too.
  std::vector<CommandFlags> commands;
  commands.push_back(DeclareRunFlags(&app, &cmd.run));
  commands.push_back(DeclareChatFlags(&app, &cmd.chat));
  commands.push_back(DeclareServeFlags(&app, &cmd.serve));
  commands.push_back(DeclareInspectFlags(&app, &cmd.inspect));
  commands.push_back(DeclareTokenizeFlags(&app, &cmd.tokenize));
  commands.push_back(DeclarePerplexityFlags(&app, &cmd.perplexity));
  commands.push_back(DeclareSynthFlags(&app, &cmd.synth));
  const CommandFlags bench = DeclareBenchFlags(&app, &cmd.bench);
  commands.push_back(DeclareBenchServeFlags(bench.app, &cmd.bench_serve));
  commands.push_back(DeclareBenchReplayFlags(bench.app, &cmd.bench_replay));
  commands.push_back(DeclareBenchTurnsFlags(bench.app, &cmd.bench_turns));
  commands.push_back(DeclareBenchFrontierFlags(bench.app, &cmd.bench_frontier));
  commands.push_back(DeclareBenchQualityFlags(bench.app, &cmd.bench_quality));
  commands.push_back(DeclareBenchSpecFlags(bench.app, &cmd.bench_spec));
  commands.push_back(DeclareBenchLatticeFlags(bench.app, &cmd.bench_lattice));
  commands.push_back(bench);
  commands.push_back(DeclareCalibrateFlags(&app, &cmd.calibrate));

  KVL_RETURN_IF_ERROR(CheckFlagsAreKnown(app, argv));
  try {
    std::vector<std::string> args(argv.rbegin(), argv.rend());  // CLI11 wants them reversed
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version end parsing with exit code 0: their text is the command's output.
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    if (code == 0) {
      cmd.kind = ParsedCommand::Kind::kPrint;
      cmd.text = out.str();
      return cmd;
    }
    std::string message = err.str();
    while (!message.empty() && message.back() == '\n') message.pop_back();
    return InvalidArgumentError(message);
  } catch (const CLI::Error& e) {
    return InvalidArgumentError(e.what());
  }
  for (const CommandFlags& command : commands) {
    if (!*command.app) continue;
    cmd.kind = command.kind;
    KVL_RETURN_IF_ERROR(command.finish());
    return cmd;
  }
  return InvalidArgumentError(
      "give a command: run, chat, serve, inspect, tokenize, perplexity, synth, bench or "
      "calibrate");
}

}  // namespace kvl::cli
