// `kvl bench`'s own flags (llama-bench's) and their validation (the command: cmd_bench.cc). The
// bench subcommands hang off the app this returns, each from its own *_flags.cc.
#include <fmt/format.h>

#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareBenchFlags(CLI::App* app, BenchArgs* bench) {
  CLI::App* cmd = app->add_subcommand("bench", "llama-bench style prompt and decode speed");
  // Not required by CLI11: `bench serve` has no model (ValidateBenchArgs asks for it).
  cmd->add_option("-m,--model", bench->model_paths, "GGUF model file(s)");
  cmd->add_option("-p,--n-prompt", bench->prompt_lengths, "prompt lengths (pp tests)")
      ->delimiter(',');
  cmd->add_option("-n,--n-gen", bench->gen_lengths, "generated lengths (tg tests)")
      ->delimiter(',');
  cmd->add_option("-d,--n-depth", bench->depths,
                  "context depths: tokens already in the KV cache before each test")
      ->delimiter(',');
  cmd->add_option("-r,--repetitions", bench->repetitions, "repetitions per test")
      ->capture_default_str();
  cmd->add_option("-t,--threads", bench->threads, "thread counts")->delimiter(',');
  cmd->add_option("-b,--batch-size", bench->batch_size, "prompt tokens per step")
      ->capture_default_str();
  cmd->add_option("-o,--output", bench->output, "md | json")->capture_default_str();
  cmd->add_option("--isa", bench->isa, "kernels: auto | avx512 | avx2 | scalar")
      ->capture_default_str();
  cmd->add_option("--parallel", bench->parallel, "sequences decoding together (tg tests)")
      ->delimiter(',');
  cmd->add_option("--prefix", bench->prefix_tokens,
                  "prefix-cache test: shared prompt tokens (0 = off)");
  cmd->add_option("--suffix", bench->suffix_tokens, "prefix-cache test: unique suffix tokens")
      ->capture_default_str();
  // Lists, as llama-bench takes them: every (k, v) pair is a separate engine and table row.
  cmd->add_option("--cache-type-k", bench->cache_types_k, "KV cache types for keys (-ctk)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--cache-type-v", bench->cache_types_v, "KV cache types for values (-ctv)")
      ->delimiter(',')
      ->capture_default_str();
  return {cmd, ParsedCommand::Kind::kBench, [bench] { return ValidateBenchArgs(*bench); }};
}

Status ValidateBenchArgs(const BenchArgs& args) {
  if (args.model_paths.empty()) return InvalidArgumentError("give a model with -m");
  // Sizes end up as prompt tokens plus a few, so they stay well inside a context.
  constexpr int64_t kMaxTokens = kMaxContextTokens / 4;
  bool any_test = false;
  for (int64_t p : args.prompt_lengths) {
    KVL_RETURN_IF_ERROR(CheckRange("-p (--n-prompt)", p, 0, kMaxTokens));
    any_test |= p > 0;
  }
  for (int64_t n : args.gen_lengths) {
    KVL_RETURN_IF_ERROR(CheckRange("-n (--n-gen)", n, 0, kMaxTokens));
    any_test |= n > 0;
  }
  for (int64_t d : args.depths) KVL_RETURN_IF_ERROR(CheckRange("-d (--n-depth)", d, 0, kMaxTokens));
  if (args.depths.empty()) return InvalidArgumentError("-d needs at least one depth");
  KVL_RETURN_IF_ERROR(CheckRange("-r (--repetitions)", args.repetitions, 1, 100000));
  for (int t : args.threads) KVL_RETURN_IF_ERROR(CheckRange("-t (--threads)", t, 0, kMaxThreads));
  KVL_RETURN_IF_ERROR(CheckRange("-b (--batch-size)", args.batch_size, 1, kMaxContextTokens));
  for (int np : args.parallel) KVL_RETURN_IF_ERROR(CheckRange("-np (--parallel)", np, 1, kMaxSeqs));
  KVL_RETURN_IF_ERROR(CheckRange("--prefix", args.prefix_tokens, 0, kMaxTokens));
  if (args.prefix_tokens > 0) {
    // With no unique suffix the second request is the first again: there is nothing to compare.
    KVL_RETURN_IF_ERROR(CheckRange("--suffix (with --prefix)", args.suffix_tokens, 1, kMaxTokens));
    any_test = true;
  } else {
    KVL_RETURN_IF_ERROR(CheckRange("--suffix", args.suffix_tokens, 0, kMaxTokens));
  }
  if (!any_test) {
    return InvalidArgumentError("nothing to measure: give -p or -n sizes above 0, or --prefix");
  }
  KVL_RETURN_IF_ERROR(CheckOutputFormat(args.output, {"md", "json"}));
  for (const std::string& t : args.cache_types_k) KVL_RETURN_IF_ERROR(ParseKvCacheType(t).status());
  for (const std::string& t : args.cache_types_v) KVL_RETURN_IF_ERROR(ParseKvCacheType(t).status());
  return Status::Ok();
}

}  // namespace kvl::cli
