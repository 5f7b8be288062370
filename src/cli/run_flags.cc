// `kvl run`'s flags and their validation (the command itself: cmd_run.cc).
#include <fmt/format.h>

#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareRunFlags(CLI::App* app, RunArgs* run) {
  CLI::App* cmd = app->add_subcommand("run", "generate text from a prompt");
  cmd->add_option("-m,--model", run->engine.model_path, "GGUF model file")->required();
  cmd->add_option("-p,--prompt", run->prompts,
                  "prompt text (repeat for several prompts; default \"Once upon a time\")");
  cmd->add_option("-f,--file", run->prompt_file,
                  "read the prompt from a file (with -np > 1: one prompt per line)");
  cmd->add_option("--parallel", run->parallel, "sequences generated at once")
      ->capture_default_str();
  AddEngineFlags(cmd, &run->engine, &run->kv_budget);
  cmd->add_option("--stop", run->stop, "stop generating before this text (repeatable)");
  cmd->add_option("-n,--n-predict", run->num_predict, "tokens to generate; -1 = until EOS")
      ->capture_default_str();
  cmd->add_flag("--no-bos", run->no_bos, "do not prepend BOS to the prompt");
  std::function<Status()> seed = AddSamplingFlags(cmd, &run->sampling);
  return {cmd, ParsedCommand::Kind::kRun, [run, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            return ValidateRunArgs(*run);
          }};
}

StatusOr<EngineOptions> RunEngineOptions(const RunArgs& args) {
  return EngineOptionsFor(args.engine, args.parallel, args.kv_budget);
}

Status ValidateRunArgs(const RunArgs& args) {
  if (!args.prompt_file.empty() && !args.prompts.empty()) {
    return InvalidArgumentError("give the prompt with -p or with -f, not both");
  }
  KVL_RETURN_IF_ERROR(CheckRange("-np (--parallel)", args.parallel, 1, kMaxSeqs));
  KVL_RETURN_IF_ERROR(
      CheckRange("-n (--n-predict; -1 = until EOS)", args.num_predict, -1, kMaxContextTokens));
  KVL_RETURN_IF_ERROR(args.sampling.Validate());
  return RunEngineOptions(args).status();
}

}  // namespace kvl::cli
