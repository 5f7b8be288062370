#include "cli.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string_view>
#include <thread>

namespace kvl::cli {

std::string FormatParams(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f} M", n / 1e6);
  return fmt::format("{:.2f} K", n / 1e3);
}

std::string FormatBytes(int64_t n) {
  const double b = static_cast<double>(n);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.2f} KiB", b / 1024.0);
}

namespace {

void AddSamplingFlags(CLI::App* cmd, SamplingParams* s) {
  cmd->add_option("-s,--seed", s->seed, "RNG seed (same seed, same output)");
  cmd->add_option("--temp", s->temperature, "temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s->top_k, "top-k sampling; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s->top_p, "top-p (nucleus) sampling; 1 = off")->capture_default_str();
  cmd->add_option("--min-p", s->min_p, "min-p sampling; 0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", s->repeat_penalty, "repetition penalty; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", s->repeat_last_n, "tokens the penalty looks back over")
      ->capture_default_str();
}

}  // namespace

// llama.cpp's multi-letter single-dash flags, which CLI11 cannot declare, mapped to long names
// (both "-ctk f16" and "-ctk=f16").
std::vector<std::string> NormalizeArgs(int argc, char** argv) {
  struct Alias {
    std::string_view short_name, long_name;
  };
  static constexpr Alias kAliases[] = {
      {"-np", "--parallel"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}};
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {  // CLI11 wants them reversed
    std::string a = argv[i];
    for (const Alias& alias : kAliases) {
      if (a == alias.short_name) {
        a = alias.long_name;
      } else if (a.size() > alias.short_name.size() && a.starts_with(alias.short_name) &&
                 a[alias.short_name.size()] == '=') {
        a = std::string(alias.long_name) + a.substr(alias.short_name.size());
      }
    }
    args.push_back(a);
  }
  return args;
}

int Main(int argc, char** argv) {
  CLI::App app{"kvlattice: LLM inference with a managed KV memory hierarchy", "kvl"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvl 0.1.0");

  RunArgs run;
  CLI::App* run_cmd = app.add_subcommand("run", "generate text from a prompt");
  run_cmd->add_option("-m,--model", run.engine.model_path, "GGUF model file")->required();
  run_cmd->add_option("-p,--prompt", run.prompts, "prompt text (repeat for several prompts)");
  run_cmd->add_option("-f,--file", run.prompt_file,
                      "read the prompt from a file (with -np > 1: one prompt per line)");
  run_cmd->add_option("--parallel", run.parallel, "sequences generated at once")
      ->capture_default_str();
  run_cmd->add_option("--kv-budget", run.kv_budget, "KV cache memory, e.g. 512MiB (default: enough for -np full contexts, at most 1 GiB)");
  run_cmd->add_option("--stop", run.stop, "stop generating before this text (repeatable)");
  run_cmd->add_flag("!--no-prefix-cache", run.engine.prefix_cache, "do not reuse cached prompt prefixes");
  run_cmd->add_option("--kv-tier", run.engine.kv_tiers,
                      "a tier KV pages can be demoted to: ram:SIZE[:zstd] or disk:PATH:SIZE[:direct] "
                      "(repeatable)");
  run_cmd->add_option("--kv-policy", run.engine.kv_policy,
                      "what happens to cold KV pages when the budget is short: auto (cost model), "
                      "keep, compress, compress-int4, demote, demote-disk, recompute-residual, "
                      "recompute-tokens, evict")
      ->capture_default_str();
  run_cmd->add_option("--kv-quality", run.engine.kv_quality, "lossless | balanced | aggressive")
      ->capture_default_str();
  run_cmd->add_option("--kv-profile", run.engine.profile_path,
                      "calibration profile (default: $KVL_PROFILE or "
                      "~/.cache/kvlattice/profile-<model>.json; measured and saved if missing)");
  run_cmd->add_flag("!--no-calibrate", run.engine.calibrate,
                    "without a profile, price KV actions with analytic defaults instead of "
                    "measuring this machine (nothing is written)");
  run_cmd->add_flag("--explain", run.engine.explain, "print every KV decision with its cost terms");
  run_cmd->add_option("--kv-sink", run.engine.kv_sink_tokens,
                      "first tokens never compressed, demoted or evicted (attention sinks)")
      ->capture_default_str();
  run_cmd->add_option("--kv-recent", run.engine.kv_recent_tokens,
                      "newest tokens always kept resident at full precision")
      ->capture_default_str();
  run_cmd->add_option("--kv-stream-reserve", run.engine.kv_stream_reserve,
                      "fraction of --kv-budget that stages pages streamed back from tiers")
      ->capture_default_str();
  // -ctk / -ctv (see NormalizeArgs), as llama.cpp's --cache-type-k / --cache-type-v.
  run_cmd->add_option("--cache-type-k", run.engine.cache_type_k,
                      "KV cache type for keys (-ctk): f32 | f16 | bf16")
      ->capture_default_str();
  run_cmd->add_option("--cache-type-v", run.engine.cache_type_v,
                      "KV cache type for values (-ctv): f32 | f16 | bf16")
      ->capture_default_str();
  run_cmd->add_option("-n,--n-predict", run.num_predict, "tokens to generate; -1 = until EOS")
      ->capture_default_str();
  run_cmd->add_option("-t,--threads", run.engine.num_threads, "threads; 0 = every core");
  run_cmd->add_option("-c,--ctx-size", run.engine.context_length, "context length; 0 = model's");
  run_cmd->add_option("-b,--batch-size", run.engine.batch_size, "prompt tokens per step")
      ->capture_default_str();
  run_cmd->add_option("--isa", run.engine.isa, "kernels: auto | avx512 | avx2 | scalar")
      ->capture_default_str();
  run_cmd->add_flag("--no-bos", run.no_bos, "do not prepend BOS to the prompt");
  AddSamplingFlags(run_cmd, &run.sampling);

  InspectArgs inspect;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "describe a GGUF model and its KV costs");
  inspect_cmd->add_option("model", inspect.model_path, "GGUF model file")->required();
  inspect_cmd->add_flag("--tensors", inspect.show_tensors, "list every tensor");
  inspect_cmd->add_flag("--json", inspect.json, "print JSON instead of text");

  SynthArgs synth;
  CLI::App* synth_cmd =
      app.add_subcommand("synth", "write a random-weight GGUF in the shape of a real model");
  synth_cmd->add_option("--shape", synth.shape, "model shape (see --list)");
  synth_cmd->add_option("--type", synth.type, "weight type: f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k | q4_k_m | q5_k_m")
      ->capture_default_str();
  synth_cmd->add_option("-o,--output", synth.output, "output GGUF path");
  synth_cmd->add_option("--seed", synth.seed, "RNG seed")->capture_default_str();
  synth_cmd->add_flag("--list", synth.list, "list the known shapes");

  BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "llama-bench style prompt and decode speed");
  bench_cmd->add_option("-m,--model", bench.model_paths, "GGUF model file(s)")->required();
  bench_cmd->add_option("-p,--n-prompt", bench.prompt_lengths, "prompt lengths (pp tests)")
      ->delimiter(',');
  bench_cmd->add_option("-n,--n-gen", bench.gen_lengths, "generated lengths (tg tests)")
      ->delimiter(',');
  bench_cmd->add_option("-r,--repetitions", bench.repetitions, "repetitions per test")
      ->capture_default_str();
  bench_cmd->add_option("-t,--threads", bench.threads, "thread counts")->delimiter(',');
  bench_cmd->add_option("-b,--batch-size", bench.batch_size, "prompt tokens per step")
      ->capture_default_str();
  bench_cmd->add_option("-o,--output", bench.output, "md | json")->capture_default_str();
  bench_cmd->add_option("--isa", bench.isa, "kernels: auto | avx512 | avx2 | scalar")
      ->capture_default_str();
  bench_cmd->add_option("--parallel", bench.parallel, "sequences decoding together (tg tests)")
      ->delimiter(',');
  bench_cmd->add_option("--prefix", bench.prefix_tokens,
                        "prefix-cache test: shared prompt tokens (0 = off)");
  bench_cmd->add_option("--suffix", bench.suffix_tokens, "prefix-cache test: unique suffix tokens")
      ->capture_default_str();
  // Lists, as llama-bench takes them: every (k, v) pair is a separate engine and table row.
  bench_cmd->add_option("--cache-type-k", bench.cache_types_k, "KV cache types for keys (-ctk)")
      ->delimiter(',')
      ->capture_default_str();
  bench_cmd->add_option("--cache-type-v", bench.cache_types_v, "KV cache types for values (-ctv)")
      ->delimiter(',')
      ->capture_default_str();

  CalibrateArgs calibrate;
  CLI::App* calibrate_cmd = app.add_subcommand(
      "calibrate", "measure this machine for the KV cost model and write a profile");
  calibrate_cmd->add_option("-m,--model", calibrate.model_path,
                            "GGUF model file (its shapes are measured)");
  calibrate_cmd->add_option("-t,--threads", calibrate.num_threads, "threads; 0 = every core");
  calibrate_cmd->add_option("--disk", calibrate.disk_dir,
                            "directory for the disk test (default: temp dir)");
  calibrate_cmd->add_flag("--quick", calibrate.quick, "smaller and fewer measurements (seconds)");
  calibrate_cmd->add_option("-o,--output", calibrate.output,
                            "profile path (default: $KVL_PROFILE or "
                            "~/.cache/kvlattice/profile-<model>.json)");

  try {
    std::vector<std::string> args = NormalizeArgs(argc, argv);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (*run_cmd) return RunCommand(run);
  if (*inspect_cmd) return InspectCommand(inspect);
  if (*synth_cmd) return SynthCommand(synth);
  if (*bench_cmd) return BenchCommand(bench);
  if (*calibrate_cmd) return CalibrateCommand(calibrate);
  return 1;
}

}  // namespace kvl::cli
