// `kvl inspect`'s flags (the command itself: cmd_inspect.cc).
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareInspectFlags(CLI::App* app, InspectArgs* inspect) {
  CLI::App* cmd = app->add_subcommand("inspect", "describe a GGUF model and its KV costs");
  cmd->add_option("model", inspect->model_path, "GGUF model file")->required();
  cmd->add_flag("--tensors", inspect->show_tensors, "list every tensor");
  cmd->add_flag("--json", inspect->json, "print JSON instead of text");
  return {cmd, ParsedCommand::Kind::kInspect};
}

}  // namespace kvl::cli
