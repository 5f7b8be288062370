// `kvl calibrate`'s flags and their validation (the command itself: cmd_calibrate.cc).
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareCalibrateFlags(CLI::App* app, CalibrateArgs* calibrate) {
  CLI::App* cmd = app->add_subcommand(
      "calibrate", "measure this machine for the KV cost model and write a profile");
  cmd->add_option("-m,--model", calibrate->model_path, "GGUF model file (its shapes are measured)");
  cmd->add_option("-t,--threads", calibrate->num_threads, "threads; 0 = every core");
  cmd->add_option("--disk", calibrate->disk_dir, "directory for the disk test (default: temp dir)");
  cmd->add_flag("--quick", calibrate->quick, "smaller and fewer measurements (seconds)");
  cmd->add_flag("--explain", calibrate->explain,
                "say for each cost-model input how it was measured or that it is a "
                "named default");
  cmd->add_option("-o,--output", calibrate->output,
                  "profile path (default: $KVL_PROFILE or "
                  "~/.cache/kvlattice/"
                  "profile-<model>-<dim>x<layers>-<type>-<isa>-t<threads>.json)");
  return {cmd, ParsedCommand::Kind::kCalibrate,
          [calibrate] { return ValidateCalibrateArgs(*calibrate); }};
}

Status ValidateCalibrateArgs(const CalibrateArgs& args) {
  return CheckRange("calibrate -t (--threads; 0 = every core)", args.num_threads, 0, kMaxThreads);
}

}  // namespace kvl::cli
