// `kvl bench serve`'s flags and their validation (the command: cmd_bench_serve.cc).
#include <fmt/format.h>

#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareBenchServeFlags(CLI::App* bench, BenchServeArgs* bs) {
  CLI::App* cmd = bench->add_subcommand(
      "serve", "load generator against a running server's /v1/completions (vllm bench serve style)");
  cmd->add_option("--host", bs->host, "server host")->capture_default_str();
  cmd->add_option("--port", bs->port, "server port")->capture_default_str();
  cmd->add_option("--api-key", bs->api_key, "sent as Authorization: Bearer KEY");
  cmd->add_option("-n,--num-requests", bs->num_requests, "requests in all")->capture_default_str();
  CLI::Option* concurrency =
      cmd->add_option("--concurrency", bs->concurrency, "requests in flight at once (default 1)");
  cmd->add_option("--rate", bs->rate, "requests per second, Poisson arrivals")->excludes(concurrency);
  cmd->add_option("--prompt-tokens", bs->prompt_tokens, "words per prompt (about a token each)")
      ->capture_default_str();
  cmd->add_option("--shared-prefix", bs->shared_prefix,
                  "words at the start of every prompt that are the same (prefix cache)")
      ->capture_default_str();
  cmd->add_flag("--random-ids", bs->random_ids,
                "prompts as random token ids (as vllm's random dataset): --prompt-tokens and "
                "--shared-prefix count tokens exactly");
  cmd->add_option("--max-tokens", bs->max_tokens, "max_tokens of each request")
      ->capture_default_str();
  cmd->add_flag("--stream", bs->stream, "stream (SSE): TTFT at the first token frame, ITL");
  cmd->add_option("-o,--output", bs->output, "md | json")->capture_default_str();
  cmd->add_option("--model", bs->model, "model name sent (default: the server's)");
  cmd->add_option("--timeout", bs->timeout_s, "per-request limit in seconds")
      ->capture_default_str();
  std::function<Status()> seed = AddSeedFlag(cmd, "--seed", "prompts and arrivals seed", &bs->seed);
  return {cmd, ParsedCommand::Kind::kBenchServe, [bs, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            return ValidateBenchServeArgs(*bs);
          }};
}

Status ValidateBenchServeArgs(const BenchServeArgs& args) {
  if (args.host.empty()) return InvalidArgumentError("--host must not be empty");
  KVL_RETURN_IF_ERROR(CheckRange("--port", args.port, 1, 65535));
  KVL_RETURN_IF_ERROR(CheckRange("-n", args.num_requests, 1, 1000000));
  KVL_RETURN_IF_ERROR(CheckRange("--concurrency", args.concurrency, 0, 1024));
  if (!(args.rate >= 0 && args.rate <= 1e6)) {
    return InvalidArgumentError(fmt::format("--rate must be in [0, 1e6], got {}", args.rate));
  }
  KVL_RETURN_IF_ERROR(CheckRange("--prompt-tokens", args.prompt_tokens, 1, kMaxContextTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--shared-prefix", args.shared_prefix, 0, kMaxContextTokens));
  if (args.shared_prefix > args.prompt_tokens) {
    return InvalidArgumentError(fmt::format(
        "--shared-prefix ({}) is part of each prompt, so at most --prompt-tokens ({})",
        args.shared_prefix, args.prompt_tokens));
  }
  KVL_RETURN_IF_ERROR(CheckRange("--max-tokens", args.max_tokens, 1, kMaxContextTokens));
  if (!(args.timeout_s > 0 && args.timeout_s <= 86400)) {
    return InvalidArgumentError(fmt::format("--timeout must be in (0, 86400], got {}", args.timeout_s));
  }
  return CheckOutputFormat(args.output, {"md", "json"});
}

}  // namespace kvl::cli
