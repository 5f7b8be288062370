// `kvl bench quality`'s flags and their validation (the command: cmd_bench_quality.cc).
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareBenchQualityFlags(CLI::App* bench, BenchQualityArgs* bq) {
  CLI::App* cmd = bench->add_subcommand(
      "quality", "each lossy KV representation (cache types, int8/int4 pages) against the f32 "
                 "cache, teacher-forced over a text: KLD and top-1 against the bytes it keeps");
  CLI::Option* model = cmd->add_option("-m,--model", bq->model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", bq->num_threads, "threads; 0 = every core");
  CLI::Option* text = cmd->add_option("-f,--file", bq->text_path, "the text (default: the built-in one)");
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
  KVL_RETURN_IF_ERROR(CheckOutputFormat(args.output, {"table", "json"}));
  return CheckOutputFile("--json", args.json_path);
}

}  // namespace kvl::cli
