// `kvl bench quality`'s flags and their validation (the command: cmd_bench_quality.cc).
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareBenchQualityFlags(CLI::App* bench, BenchQualityArgs* bq) {
  CLI::App* cmd = bench->add_subcommand(
      "quality", "each lossy KV representation (cache types, rotated ones, int8/int4 pages) "
                 "against an f16 cache, teacher-forced over a text at 512 tokens and the model's "
                 "context: mean / p99 KLD, top-1 agreement, q.k error, bits per value");
  CLI::Option* model = cmd->add_option("-m,--model", bq->model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", bq->num_threads, "threads; 0 = every core");
  CLI::Option* text = cmd->add_option("-f,--file", bq->text_path, "the text (default: the built-in one)");
  cmd->add_option("--ctx", bq->ctx,
                  "tokens per chunk; 0 = both 512 and the model's context")->capture_default_str();
  cmd->add_option("--chunks", bq->chunks, "chunks of the text per context; 0 = every one")
      ->capture_default_str();
  cmd->add_option("-o,--output", bq->output, "table | json")->capture_default_str();
  cmd->add_option("--json", bq->json_path, "write every configuration as JSON");
  return {cmd, ParsedCommand::Kind::kBenchQuality, [bq, model, text]() -> Status {
            // CLI11 takes `-m ""` as given; an empty path would fail only once loading began.
            if (model->count() > 0 && bq->model_path.empty()) {
              return InvalidArgumentError("-m must name a GGUF model file, got ''");
            }
            if (text->count() > 0 && bq->text_path.empty()) {
              return InvalidArgumentError(
                  "-f must name a text file, got '' (leave it out for the built-in text)");
            }
            return ValidateBenchQualityArgs(*bq);
          }};
}

Status ValidateBenchQualityArgs(const BenchQualityArgs& args) {
  KVL_RETURN_IF_ERROR(CheckRange("-t (--threads; 0 = every core)", args.num_threads, 0, kMaxThreads));
  if (args.ctx != 0) {
    KVL_RETURN_IF_ERROR(CheckRange("--ctx (tokens per chunk; 0 = 512 and the model's context)",
                                   args.ctx, int64_t{32}, int64_t{1} << 20));
  }
  KVL_RETURN_IF_ERROR(CheckRange("--chunks (0 = every one)", args.chunks, int64_t{0},
                                 int64_t{1} << 20));
  KVL_RETURN_IF_ERROR(CheckOutputFormat(args.output, {"table", "json"}));
  return CheckOutputFile("--json", args.json_path);
}

}  // namespace kvl::cli
