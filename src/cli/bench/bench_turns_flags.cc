// `kvl bench turns`'s flags and their validation (the command: cmd_bench_turns.cc). The engine
// flags it honours are the shared groups of command_flags.h, not declared again here.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "command_flags.h"
#include "kvl/engine.h"

namespace kvl::cli {

CommandFlags DeclareBenchTurnsFlags(CLI::App* bench, BenchTurnsArgs* bt) {
  CLI::App* cmd = bench->add_subcommand(
      "turns", "one scripted chat, the whole history resubmitted each turn, under KV "
               "configurations: per-turn time, TTFT, resident KV, tiers, replies vs keep-all");
  cmd->add_option("-m,--model", bt->engine.model_path, "GGUF model file")->required();
  cmd->add_option("--turns", bt->turns, "turns of the conversation")->capture_default_str();
  cmd->add_option("--reply", bt->reply_tokens, "greedy tokens per reply (EOS ignored)")
      ->capture_default_str();
  cmd->add_option("--user-min", bt->user_min, "fewest tokens in a user message")
      ->capture_default_str();
  cmd->add_option("--user-max", bt->user_max, "most tokens in a user message")
      ->capture_default_str();
  cmd->add_option("--configs", bt->configs,
                  "a (no reuse), b (keep-all), c-ram, c-disk, c-disk-buffered (lossless hierarchy at the "
                  "budget; c-disk-buffered reads through the OS's page cache), "
                  "d (= d-balanced,d-evict), d-compress; b always runs: it is the reference")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--budget-fraction", bt->budget_fraction,
                  "(c) and (d)'s KV budget as a fraction of (b)'s resident peak")
      ->capture_default_str();
  cmd->add_option("--json", bt->json_path, "write every turn of every config as JSON");
  cmd->add_option("--plot", bt->plot_path,
                  "draw per-turn time and resident KV into a PNG (python3-matplotlib)");
  cmd->add_option("--plot-script", bt->plot_script,
                  "the plot script (default: scripts/plot_turns.py beside the build or here)");
  cmd->add_option("--disk-dir", bt->disk_dir, "directory for the disk tiers' files")
      ->capture_default_str();
  std::function<Status()> seed =
      AddSeedFlag(cmd, "--seed", "user messages' seed (default 1)", &bt->seed);
  cmd->add_flag("--restart", bt->restart,
                "measure a restart instead: a long prompt's TTFT cold, then in a fresh process "
                "with the first one's persistent disk tier");
  cmd->add_option("--restart-tokens", bt->restart_tokens, "--restart: the prompt's tokens")
      ->capture_default_str();
  cmd->add_option("--redis", bt->redis,
                  "--restart: the same through a Redis tier, redis://HOST:PORT[/NS], or 'auto' "
                  "to start a redis-server on a free port for the bench");
  cmd->add_option("--restart-phase", bt->restart_phase)->group("");  // internal: the child
  cmd->add_option("--restart-tier", bt->restart_tier)->group("");
  AddComputeFlags(cmd, &bt->engine);
  cmd->get_option("--ctx-size")->description("context length; 0 = what the conversation needs");
  AddCacheTypeFlags(cmd, &bt->engine);
  AddKvProfileFlags(cmd, &bt->engine);
  AddKvReserveFlags(cmd, &bt->engine);
  cmd->add_flag("!--no-kv-window-release", bt->engine.kv_window_release,
                "sliding-window models: every layer's K/V in the pool (no local release)");
  return {cmd, ParsedCommand::Kind::kBenchTurns, [bt, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            return ValidateBenchTurnsArgs(*bt);
          }};
}

Status ValidateBenchTurnsArgs(const BenchTurnsArgs& args) {
  // A conversation's tokens stay well inside a context; each user message has room for its
  // "User: ... Assistant:" frame.
  constexpr int64_t kMaxTokens = kMaxContextTokens / 4;
  KVL_RETURN_IF_ERROR(CheckRange("--turns", args.turns, 1, 100000));
  KVL_RETURN_IF_ERROR(CheckRange("--reply", args.reply_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--user-min", args.user_min, 8, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--user-max", args.user_max, args.user_min, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--restart-tokens", args.restart_tokens, 32, kMaxTokens));
  if (!(args.budget_fraction > 0 && args.budget_fraction <= 1)) {
    return InvalidArgumentError(
        fmt::format("--budget-fraction must be in (0, 1], got {}", args.budget_fraction));
  }
  static constexpr std::string_view kConfigs[] = {"a",          "b",          "c",
                                                  "c-ram",      "c-disk",     "c-disk-buffered",
                                                  "d",          "d-balanced", "d-evict",
                                                  "d-compress"};
  for (const std::string& c : args.configs) {
    if (std::find(std::begin(kConfigs), std::end(kConfigs), c) == std::end(kConfigs)) {
      return InvalidArgumentError(fmt::format(
          "--configs: unknown config '{}' (a, b, c, c-ram, c-disk, d, d-balanced, d-evict, "
          "d-compress)", c));
    }
  }
  if (args.disk_dir.empty()) return InvalidArgumentError("--disk-dir must not be empty");
  // Checked before the first config runs: a missing folder failed the disk configs only after
  // the others had spent minutes.
  if (std::error_code ec; !std::filesystem::is_directory(args.disk_dir, ec)) {
    return InvalidArgumentError(
        fmt::format("--disk-dir '{}' is not an existing directory", args.disk_dir));
  }
  if (!args.redis.empty() && !args.restart) {
    return InvalidArgumentError("--redis is a --restart option");
  }
  if (!args.redis.empty() && args.redis != "auto") {
    KVL_ASSIGN_OR_RETURN(const TierSpec spec, ParseTierSpec(args.redis));
    if (spec.kind != TierKind::kRedis) {
      return InvalidArgumentError(fmt::format(
          "--redis must be redis://HOST:PORT[/NAMESPACE] or auto, got '{}'", args.redis));
    }
  }
  if (!args.restart_phase.empty() && args.restart_phase != "cold" && args.restart_phase != "warm") {
    return InvalidArgumentError("--restart-phase is cold or warm");
  }
  EngineOptions engine = args.engine;
  engine.max_seqs = 1;
  return ValidateEngineOptions(engine);
}

}  // namespace kvl::cli
