// `kvl bench frontier`'s flags and their validation (the command: cmd_bench_frontier.cc).
#include <fmt/format.h>

#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareBenchFrontierFlags(CLI::App* bench, BenchFrontierArgs* bf) {
  CLI::App* cmd = bench->add_subcommand(
      "frontier", "recompute vs transfer of a KV page, measured per page tokens x depth x tier x "
                  "phase, beside the cost model's prediction, with the crossover points");
  cmd->add_option("-m,--model", bf->model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", bf->num_threads, "threads; 0 = every core");
  cmd->add_option("--tiers", bf->tiers, "ram, disk[:DIR] (O_DIRECT scratch file), redis://HOST[:PORT]")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--page-tokens", bf->page_tokens, "page sizes in tokens")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--depths", bf->depths, "layers of the page (from the first); default 1, L/4, L/2, L")
      ->delimiter(',');
  cmd->add_option("--position", bf->position,
                  "tokens of context before the page; at most the model's context less the "
                  "128-token run of the decode idle fraction (clamped there, with a message)")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", bf->repetitions, "runs per timing (the median is kept)")
      ->capture_default_str();
  cmd->add_option("-o,--output", bf->output, "table | json")->capture_default_str();
  cmd->add_option("--json", bf->json_path, "write every point as JSON");
  cmd->add_option("--kv-profile", bf->profile_path, "calibration profile (default: the engine's)");
  cmd->add_flag("!--no-calibrate", bf->calibrate,
                "without a profile, predict with analytic defaults instead of measuring");
  return {cmd, ParsedCommand::Kind::kBenchFrontier, [bf] { return ValidateBenchFrontierArgs(*bf); }};
}

Status ValidateBenchFrontierArgs(const BenchFrontierArgs& args) {
  // The bench allocates a forward run's activations for the largest page and a cache for the
  // context before it: bounds that keep a typo from asking for terabytes.
  KVL_RETURN_IF_ERROR(CheckRange("-t", args.num_threads, 0, 1024));
  KVL_RETURN_IF_ERROR(CheckRange("--position", args.position, 0, int64_t{1} << 20));
  KVL_RETURN_IF_ERROR(CheckRange("-r", args.repetitions, 1, 1000));
  if (args.page_tokens.empty()) return InvalidArgumentError("--page-tokens must not be empty");
  for (int64_t t : args.page_tokens) {
    KVL_RETURN_IF_ERROR(CheckRange("--page-tokens", t, 1, 65536));
  }
  for (int64_t d : args.depths) KVL_RETURN_IF_ERROR(CheckRange("--depths", d, 1, 100000));
  if (args.tiers.empty()) return InvalidArgumentError("--tiers must not be empty");
  for (const std::string& tier : args.tiers) {
    const bool known = tier == "ram" || tier == "disk" || tier.rfind("disk:", 0) == 0 ||
                       tier.rfind("redis://", 0) == 0;
    if (!known) {
      return InvalidArgumentError(
          fmt::format("--tiers '{}': use ram, disk[:DIR] or redis://HOST[:PORT]", tier));
    }
  }
  return CheckOutputFormat(args.output, {"table", "json"});
}

}  // namespace kvl::cli
