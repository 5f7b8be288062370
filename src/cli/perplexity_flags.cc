// `kvl perplexity`'s flags and their validation (the command itself: cmd_perplexity.cc). The
// flags are llama-perplexity's, so a user's command line carries over.
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclarePerplexityFlags(CLI::App* app, PerplexityArgs* ppl) {
  CLI::App* cmd = app->add_subcommand(
      "perplexity", "a text's perplexity under the model, measured as llama-perplexity does");
  CLI::Option* model = cmd->add_option("-m,--model", ppl->model_path, "GGUF model file")->required();
  CLI::Option* text =
      cmd->add_option("-f,--file", ppl->text_path, "the text, read whole")->required();
  cmd->add_option("-c,--ctx-size", ppl->context_length,
                  "tokens per chunk; 0 = 512, or the model's context where that is smaller")
      ->capture_default_str();
  cmd->add_option("-b,--batch-size", ppl->batch_size, "tokens per forward step")
      ->capture_default_str();
  cmd->add_option("-t,--threads", ppl->num_threads, "threads; 0 = every core");
  cmd->add_option("--cache-type-k", ppl->cache_type_k,
                  "KV cache type for keys (-ctk): f16 | f32 | bf16 | q8_0 | q4_0 | q8_0r | q4_0r")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", ppl->cache_type_v,
                  "KV cache type for values (-ctv): f16 | f32 | bf16 | q8_0 | q4_0 | q8_0r | q4_0r")
      ->capture_default_str();
  return {cmd, ParsedCommand::Kind::kPerplexity, [ppl, model, text]() -> Status {
            // CLI11 takes `-m ""` as given; an empty path would fail only once loading began.
            if (model->count() > 0 && ppl->model_path.empty()) {
              return InvalidArgumentError("-m must name a GGUF model file, got ''");
            }
            if (text->count() > 0 && ppl->text_path.empty()) {
              return InvalidArgumentError("-f must name a text file, got ''");
            }
            return ValidatePerplexityArgs(*ppl);
          }};
}

Status ValidatePerplexityArgs(const PerplexityArgs& args) {
  KVL_RETURN_IF_ERROR(CheckRange("-t (--threads; 0 = every core)", args.num_threads, 0, kMaxThreads));
  // At least one scored token per chunk: positions n_ctx/2 .. n_ctx-2.
  if (args.context_length != 0) {
    KVL_RETURN_IF_ERROR(CheckRange("-c (--ctx-size; 0 = default)", args.context_length, 3,
                                   int64_t{1} << 24));
  }
  return CheckRange("-b (--batch-size)", args.batch_size, 1, int64_t{1} << 24);
}

}  // namespace kvl::cli
