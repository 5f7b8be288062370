// `kvl bench replay`'s flags and their validation (the command: cmd_bench_replay.cc).
#include <fmt/format.h>

#include "command_flags.h"
#include "kvl/engine.h"

namespace kvl::cli {

CommandFlags DeclareBenchReplayFlags(CLI::App* bench, BenchReplayArgs* br) {
  CLI::App* cmd = bench->add_subcommand(
      "replay", "replay a --kv-trace against the reuse forecast, LRU, LFU and Belady's optimal");
  cmd->add_option("trace", br->trace_path, "trace file (written by --kv-trace)")->required();
  cmd->add_option("--capacity-pages", br->capacity_pages,
                  "resident set sizes in pages (default: the engine's pool, x1/2, x2; through "
                  "the engine's KV manager: the most blocks one step's requests hold, x5/4, "
                  "x3/2, x2)")
      ->delimiter(',');
  cmd->add_option("--miss-ms", br->miss_ms,
                  "price of one missed page (default: the trace's cheapest lossless "
                  "bring-back price)");
  cmd->add_option("--miss-action", br->miss_action,
                  "price misses at the trace's price of this action (demote-ram, demote-disk, "
                  "recompute-residual, recompute-tokens)");
  cmd->add_option("-o,--output", br->output, "md | json")->capture_default_str();
  return {cmd, ParsedCommand::Kind::kBenchReplay, [br] { return ValidateBenchReplayArgs(*br); }};
}

Status ValidateBenchReplayArgs(const BenchReplayArgs& args) {
  if (args.trace_path.empty()) return InvalidArgumentError("give a trace file (--kv-trace FILE)");
  for (int64_t n : args.capacity_pages) {
    KVL_RETURN_IF_ERROR(CheckRange("--capacity-pages", n, 1, int64_t{1} << 30));
  }
  if (!(args.miss_ms >= 0 && args.miss_ms <= 1e9)) {
    return InvalidArgumentError(fmt::format("--miss-ms must be in [0, 1e9], got {}", args.miss_ms));
  }
  if (!args.miss_action.empty()) {
    KVL_ASSIGN_OR_RETURN(const KvPolicyChoice choice, ParseKvPolicy(args.miss_action));
    if (choice.automatic || !IsLossless(choice.fixed) || choice.fixed == KvAction::kKeep) {
      return InvalidArgumentError(fmt::format(
          "--miss-action '{}': use demote-ram, demote-disk, recompute-residual or recompute-tokens",
          args.miss_action));
    }
    if (args.miss_ms > 0) return InvalidArgumentError("give --miss-ms or --miss-action, not both");
  }
  return CheckOutputFormat(args.output, {"md", "json"});
}

}  // namespace kvl::cli
