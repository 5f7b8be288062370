// `kvl synth`'s flags and their validation (the command itself: cmd_synth.cc).
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareSynthFlags(CLI::App* app, SynthArgs* synth) {
  CLI::App* cmd = app->add_subcommand("synth", "write a random-weight GGUF in the shape of a real model");
  cmd->add_option("--shape", synth->shape, "model shape (see --list)");
  cmd->add_option("--type", synth->type,
                  "weight type: f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k | "
                  "q4_k_m | q5_k_m (the usual mix: Q6_K for some tensors)")
      ->capture_default_str();
  cmd->add_option("-o,--output", synth->output, "output GGUF path");
  std::function<Status()> seed = AddSeedFlag(cmd, "--seed", "RNG seed (default 1234)", &synth->seed);
  cmd->add_flag("--list", synth->list, "list the known shapes");
  cmd->add_option("--vocab", synth->vocab,
                  "copy the tokenizer of this vocab-only GGUF (e.g. llama.cpp's "
                  "models/ggml-vocab-llama-bpe.gguf); its size becomes the vocab size");
  return {cmd, ParsedCommand::Kind::kSynth, [synth, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            return ValidateSynthArgs(*synth);
          }};
}

Status ValidateSynthArgs(const SynthArgs& args) {
  if (!args.list && !args.shape.empty() && args.output.empty()) {
    return InvalidArgumentError("give an output file with -o");
  }
  return Status::Ok();
}

}  // namespace kvl::cli
