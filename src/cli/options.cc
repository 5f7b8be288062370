// The kvl command line, parsed (CLI11) and validated: ParseCommandLine and the per-command
// checks. Nothing here opens a file, allocates by a user's number or starts work.
#include "options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <sstream>
#include <string_view>

#include "kvl/chat_template.h"
#include "kvl/engine.h"

namespace kvl::cli {
namespace {

// The seed is taken as text: CLI11 saturates integers past 2^64 silently (ParseSeed does not).
CLI::Option* AddSamplingFlags(CLI::App* cmd, SamplingParams* s, std::string* seed) {
  CLI::Option* seed_opt = cmd->add_option("-s,--seed", *seed, "RNG seed (same seed, same output)");
  cmd->add_option("--temp", s->temperature, "temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s->top_k, "top-k sampling; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s->top_p, "top-p (nucleus) sampling; 1 = off")->capture_default_str();
  cmd->add_option("--min-p", s->min_p, "min-p sampling; 0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", s->repeat_penalty, "repetition penalty; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", s->repeat_last_n, "tokens the penalty looks back over")
      ->capture_default_str();
  return seed_opt;
}

// The engine's flags, shared by every command that runs an engine (run, serve).
void AddEngineFlags(CLI::App* cmd, EngineOptions* engine, std::string* kv_budget) {
  cmd->add_option("--kv-budget", *kv_budget, "KV cache memory, e.g. 512MiB (default: enough for -np full contexts, at most 1 GiB)");
  cmd->add_flag("!--no-prefix-cache", engine->prefix_cache, "do not reuse cached prompt prefixes");
  cmd->add_option("--kv-tier", engine->kv_tiers,
                      "a tier KV pages can be demoted to: ram:SIZE[:zstd] or "
                      "disk:PATH:SIZE[:direct][:scratch] (repeatable)");
  cmd->add_option("--kv-policy", engine->kv_policy,
                      "what happens to cold KV pages when the budget is short: auto (cost model), "
                      "keep, compress, compress-int4, demote, demote-disk, recompute-residual, "
                      "recompute-tokens, evict")
      ->capture_default_str();
  cmd->add_option("--kv-quality", engine->kv_quality, "lossless | balanced | aggressive")
      ->capture_default_str();
  cmd->add_option("--kv-profile", engine->profile_path,
                      "calibration profile (default: $KVL_PROFILE or "
                      "~/.cache/kvlattice/profile-<model>-<dim>x<layers>-<type>-<isa>-t<threads>"
                      ".json; measured and saved if missing)");
  cmd->add_flag("!--no-calibrate", engine->calibrate,
                    "without a profile, price KV actions with analytic defaults instead of "
                    "measuring this machine (nothing is written)");
  cmd->add_flag("!--no-kv-feedback", engine->kv_feedback,
                "price KV actions from the profile alone, without correcting bring-back times "
                "by what was measured in this run");
  cmd->add_flag("!--no-kv-promote-back", engine->kv_promote_back,
                "leave a running sequence's pages that went to a tier (or to checkpoints) there "
                "until it ends, instead of bringing them back into the pool when blocks free up");
  cmd->add_flag("!--no-kv-window-release", engine->kv_window_release,
                "on a sliding-window model (Gemma-2/3), keep every layer's K/V in the pool instead "
                "of the global layers' there and one window of the local layers' per sequence");
  cmd->add_flag("--explain", engine->explain, "print every KV decision with its cost terms");
  cmd->add_option("--kv-trace", engine->kv_trace_path,
                  "write a page-access trace here (replay it with kvl bench replay)");
  cmd->add_option("--kv-sink", engine->kv_sink_tokens,
                      "first tokens never compressed, demoted or evicted (attention sinks)")
      ->capture_default_str();
  cmd->add_option("--kv-recent", engine->kv_recent_tokens,
                      "newest tokens always kept resident at full precision")
      ->capture_default_str();
  cmd->add_option("--kv-stream-reserve", engine->kv_stream_reserve,
                      "fraction of --kv-budget that stages pages streamed back from tiers; 0 = auto "
                      "(0.25 with a RAM tier, else enough for one full context's pages, at most 0.5)")
      ->capture_default_str();
  // `auto` reads as 0, which EngineOptions takes as "the cost model chooses".
  cmd->add_option("--kv-checkpoint-every", engine->kv_checkpoint_every,
                      "pages kept as residual checkpoints keep every S-th layer's (1 = every "
                      "layer; the layers between are rebuilt by running them); auto: the cost "
                      "model's choice")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{{"auto", "0"}}))
      ->capture_default_str();
  // -ctk / -ctv (see NormalizeArgs), as llama.cpp's --cache-type-k / --cache-type-v.
  cmd->add_option("--cache-type-k", engine->cache_type_k,
                      "KV cache type for keys (-ctk): f32 | f16 | bf16 | q8_0 | q4_0")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", engine->cache_type_v,
                      "KV cache type for values (-ctv): f32 | f16 | bf16 | q8_0 | q4_0")
      ->capture_default_str();
  // Speculative decoding (issue 26).
  cmd->add_option("--spec", engine->spec,
                  "speculative decoding: ngram (prompt lookup), suffix (and recent requests), "
                  "draft (a small model, -md) or off; drafts are sent only where the cost model "
                  "says they pay, and the output is plain decoding's")
      ->capture_default_str();
  cmd->add_option("--draft-max", engine->draft_max,
                  "most draft tokens one sequence's step carries")
      ->capture_default_str();
  cmd->add_flag("--spec-force", engine->spec_force,
                "send every draft, whatever the cost model says (to measure acceptance)");
  cmd->add_option("--model-draft", engine->draft_model_path,
                  "draft model for --spec draft (-md), of the model's vocabulary");
  cmd->add_option("-t,--threads", engine->num_threads, "threads; 0 = every core");
  cmd->add_option("-c,--ctx-size", engine->context_length, "context length; 0 = model's");
  cmd->add_option("-b,--batch-size", engine->batch_size, "prompt tokens per step")
      ->capture_default_str();
  cmd->add_option("--isa", engine->isa, "kernels: auto | avx512 | avx2 | scalar")
      ->capture_default_str();
}

// llama.cpp's multi-letter single-dash flags, which CLI11 cannot declare, mapped to long names
// (both "-ctk f16" and "-ctk=f16").
std::vector<std::string> NormalizeArgs(const std::vector<std::string>& in) {
  struct Alias {
    std::string_view short_name, long_name;
  };
  static constexpr Alias kAliases[] = {
      {"-np", "--parallel"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"},
      {"-md", "--model-draft"}};
  std::vector<std::string> args;
  for (auto it = in.rbegin(); it != in.rend(); ++it) {  // CLI11 wants them reversed
    std::string a = *it;
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


}  // namespace

StatusOr<uint64_t> ParseSeed(const std::string& text, std::string_view flag) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return InvalidArgumentError(fmt::format(
        "{} must be an integer in [0, 18446744073709551615], got '{}'", flag, text));
  }
  return value;
}

// CLI11 splits a comma list and drops its empty entries, so `-np 1,,2` ran as `-np 1,2`: a
// typo measured something else without a word. Every bench list value is checked whole first.
static Status CheckBenchListValues(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] != "bench") return Status::Ok();  // argv: the words after "kvl"
  for (size_t i = 2; i < argv.size(); ++i) {
    const std::string& flag = argv[i - 1];
    const std::string& value = argv[i];
    if (flag.size() < 2 || flag[0] != '-' || value.find(',') == std::string::npos) continue;
    if (value.find(",,") != std::string::npos || value.front() == ',' || value.back() == ',') {
      return InvalidArgumentError(
          fmt::format("{}: an empty entry in the list '{}' (give values separated by single "
                      "commas)",
                      flag, value));
    }
  }
  return Status::Ok();
}

StatusOr<ParsedCommand> ParseCommandLine(const std::vector<std::string>& argv) {
  KVL_RETURN_IF_ERROR(CheckBenchListValues(argv));
  ParsedCommand cmd;
  CLI::App app{"kvlattice: LLM inference with a managed KV memory hierarchy", "kvl"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvl 0.1.0");

  RunArgs& run = cmd.run;
  CLI::App* run_cmd = app.add_subcommand("run", "generate text from a prompt");
  run_cmd->add_option("-m,--model", run.engine.model_path, "GGUF model file")->required();
  run_cmd->add_option("-p,--prompt", run.prompts,
                      "prompt text (repeat for several prompts; default \"Once upon a time\")");
  run_cmd->add_option("-f,--file", run.prompt_file,
                      "read the prompt from a file (with -np > 1: one prompt per line)");
  run_cmd->add_option("--parallel", run.parallel, "sequences generated at once")
      ->capture_default_str();
  AddEngineFlags(run_cmd, &run.engine, &run.kv_budget);
  run_cmd->add_option("--stop", run.stop, "stop generating before this text (repeatable)");
  run_cmd->add_option("-n,--n-predict", run.num_predict, "tokens to generate; -1 = until EOS")
      ->capture_default_str();
  run_cmd->add_flag("--no-bos", run.no_bos, "do not prepend BOS to the prompt");
  std::string run_seed;
  CLI::Option* run_seed_opt = AddSamplingFlags(run_cmd, &run.sampling, &run_seed);

  ChatArgs& chat = cmd.chat;
  CLI::App* chat_cmd = app.add_subcommand(
      "chat", "interactive chat through the model's chat template (/reset, /stats, /exit)");
  chat_cmd->add_option("-m,--model", chat.engine.model_path, "GGUF model file")->required();
  chat_cmd->add_option("--chat-template", chat.chat_template,
                       "force a built-in chat template: plain, llama2, chatml, zephyr, mistral, "
                       "llama3, gemma (default: the model's own Jinja template)");
  chat_cmd->add_option("--chat-template-file", chat.chat_template_file,
                       "render this Jinja chat template instead of the model's");
  chat_cmd->add_option("--system", chat.system, "system message that opens the conversation");
  chat_cmd->add_option("-f,--file", chat.turns_file,
                       "read the user's turns from a file, one per line, print each reply and exit");
  AddEngineFlags(chat_cmd, &chat.engine, &chat.kv_budget);
  chat_cmd->add_option("-n,--n-predict", chat.num_predict,
                       "tokens per reply at most; -1 = until EOS or the context is full")
      ->capture_default_str();
  std::string chat_seed;
  CLI::Option* chat_seed_opt = AddSamplingFlags(chat_cmd, &chat.sampling, &chat_seed);

  ServeArgs& serve = cmd.serve;
  CLI::App* serve_cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, /metrics)");
  serve_cmd->add_option("-m,--model", serve.serve.engine.model_path, "GGUF model file")->required();
  serve_cmd->add_option("--host", serve.serve.host, "address to listen on")->capture_default_str();
  serve_cmd->add_option("--port", serve.serve.port, "port to listen on; 0 = any free port")
      ->capture_default_str();
  serve_cmd->add_option("--api-key", serve.serve.api_key,
                        "require 'Authorization: Bearer KEY' on /v1/ routes");
  serve_cmd->add_option("--parallel", serve.parallel, "sequences served at once (-np)")
      ->capture_default_str();
  serve_cmd->add_option("--threads-http", serve.serve.http_threads,
                        "threads for the handlers of large requests; 0 = 4 (connections cost no thread)")
      ->capture_default_str();
  serve_cmd->add_option("--chat-template", serve.serve.chat_template,
                        "force a built-in chat template: plain, llama2, chatml, zephyr, mistral, "
                        "llama3, gemma (default: the model's own Jinja template)");
  serve_cmd->add_option("--chat-template-file", serve.serve.chat_template_file,
                        "render this Jinja chat template instead of the model's");
  serve_cmd->add_option("--max-body", serve.max_body, "largest request body, e.g. 8MiB")
      ->capture_default_str();
  serve_cmd->add_option("--cors-origin", serve.serve.cors_origin,
                        "let browsers on this origin (e.g. https://app.example, or *) call the "
                        "API: CORS headers and preflights (default: off)");
  serve_cmd->add_option("--shutdown-grace", serve.serve.shutdown_grace_seconds,
                        "seconds running requests may finish after SIGINT/SIGTERM")
      ->capture_default_str();
  serve_cmd->add_flag("!--no-webui", serve.serve.webui,
                      "do not serve the chat page at / (GET /v1/kv/state stays)");
  AddEngineFlags(serve_cmd, &serve.serve.engine, &serve.kv_budget);

  InspectArgs& inspect = cmd.inspect;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "describe a GGUF model and its KV costs");
  inspect_cmd->add_option("model", inspect.model_path, "GGUF model file")->required();
  inspect_cmd->add_flag("--tensors", inspect.show_tensors, "list every tensor");
  inspect_cmd->add_flag("--json", inspect.json, "print JSON instead of text");

  TokenizeArgs& tokenize = cmd.tokenize;
  CLI::App* tokenize_cmd =
      app.add_subcommand("tokenize", "text to token ids with a model's vocabulary alone");
  tokenize_cmd->add_option("-m,--model", tokenize.model_path, "GGUF file (vocab-only is enough)")
      ->required();
  CLI::Option* tokenize_prompt = tokenize_cmd->add_option("-p,--prompt", tokenize.prompt, "text");
  tokenize_cmd->add_option("-f,--file", tokenize.prompt_file, "file whose whole content is the text")
      ->excludes(tokenize_prompt);
  tokenize_cmd->add_flag("--ids", tokenize.ids, "print only the ids, as [1, 2, 3]");
  tokenize_cmd->add_flag("--pieces", tokenize.pieces, "print the pieces as a JSON array");
  tokenize_cmd->add_flag("--parse-special", tokenize.parse_special,
                         "control-token texts in the text become those tokens");
  tokenize_cmd->add_flag("--no-bos", tokenize.no_bos,
                         "no BOS (or EOS) even where the vocabulary asks for one");
  tokenize_cmd->add_flag("--show-count", tokenize.show_count, "print the number of tokens");
  tokenize_cmd->add_flag("-e,--escape,!--no-escape", tokenize.escape,
                         "process escapes (\\n, \\t, \\xNN, ...) in the text, as llama-tokenize "
                         "(default: on)");

  SynthArgs& synth = cmd.synth;
  CLI::App* synth_cmd =
      app.add_subcommand("synth", "write a random-weight GGUF in the shape of a real model");
  synth_cmd->add_option("--shape", synth.shape, "model shape (see --list)");
  synth_cmd->add_option("--type", synth.type,
                        "weight type: f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k | "
                        "q4_k_m | q5_k_m (the usual mix: Q6_K for some tensors)")
      ->capture_default_str();
  synth_cmd->add_option("-o,--output", synth.output, "output GGUF path");
  std::string synth_seed;
  CLI::Option* synth_seed_opt =
      synth_cmd->add_option("--seed", synth_seed, "RNG seed (default 1234)");
  synth_cmd->add_flag("--list", synth.list, "list the known shapes");
  synth_cmd->add_option("--vocab", synth.vocab,
                        "copy the tokenizer of this vocab-only GGUF (e.g. llama.cpp's "
                        "models/ggml-vocab-llama-bpe.gguf); its size becomes the vocab size");

  BenchArgs& bench = cmd.bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "llama-bench style prompt and decode speed");
  // Not required by CLI11: `bench serve` has no model (ValidateBenchArgs asks for it).
  bench_cmd->add_option("-m,--model", bench.model_paths, "GGUF model file(s)");
  bench_cmd->add_option("-p,--n-prompt", bench.prompt_lengths, "prompt lengths (pp tests)")
      ->delimiter(',');
  bench_cmd->add_option("-n,--n-gen", bench.gen_lengths, "generated lengths (tg tests)")
      ->delimiter(',');
  bench_cmd->add_option("-d,--n-depth", bench.depths,
                        "context depths: tokens already in the KV cache before each test")
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

  BenchServeArgs& bs = cmd.bench_serve;
  CLI::App* bs_cmd = bench_cmd->add_subcommand(
      "serve", "load generator against a running server's /v1/completions (vllm bench serve style)");
  bs_cmd->add_option("--host", bs.host, "server host")->capture_default_str();
  bs_cmd->add_option("--port", bs.port, "server port")->capture_default_str();
  bs_cmd->add_option("--api-key", bs.api_key, "sent as Authorization: Bearer KEY");
  bs_cmd->add_option("-n,--num-requests", bs.num_requests, "requests in all")->capture_default_str();
  CLI::Option* conc_opt =
      bs_cmd->add_option("--concurrency", bs.concurrency, "requests in flight at once (default 1)");
  bs_cmd->add_option("--rate", bs.rate, "requests per second, Poisson arrivals")->excludes(conc_opt);
  bs_cmd->add_option("--prompt-tokens", bs.prompt_tokens, "words per prompt (about a token each)")
      ->capture_default_str();
  bs_cmd->add_option("--shared-prefix", bs.shared_prefix,
                     "words at the start of every prompt that are the same (prefix cache)")
      ->capture_default_str();
  bs_cmd->add_flag("--random-ids", bs.random_ids,
                   "prompts as random token ids (as vllm's random dataset): --prompt-tokens and "
                   "--shared-prefix count tokens exactly");
  bs_cmd->add_option("--max-tokens", bs.max_tokens, "max_tokens of each request")
      ->capture_default_str();
  bs_cmd->add_flag("--stream", bs.stream, "stream (SSE): TTFT at the first token frame, ITL");
  bs_cmd->add_option("-o,--output", bs.output, "md | json")->capture_default_str();
  bs_cmd->add_option("--model", bs.model, "model name sent (default: the server's)");
  bs_cmd->add_option("--timeout", bs.timeout_s, "per-request limit in seconds")
      ->capture_default_str();
  std::string bs_seed;
  CLI::Option* bs_seed_opt = bs_cmd->add_option("--seed", bs_seed, "prompts and arrivals seed");

  BenchReplayArgs& br = cmd.bench_replay;
  CLI::App* br_cmd = bench_cmd->add_subcommand(
      "replay", "replay a --kv-trace against the reuse forecast, LRU, LFU and Belady's optimal");
  br_cmd->add_option("trace", br.trace_path, "trace file (written by --kv-trace)")->required();
  br_cmd->add_option("--capacity-pages", br.capacity_pages,
                     "resident set sizes in pages (default: the engine's pool, x1/2, x2)")
      ->delimiter(',');
  br_cmd->add_option("--miss-ms", br.miss_ms,
                     "price of one missed page (default: the trace's cheapest lossless "
                     "bring-back price)");
  br_cmd->add_option("--miss-action", br.miss_action,
                     "price misses at the trace's price of this action (demote-ram, demote-disk, "
                     "recompute-residual, recompute-tokens)");
  br_cmd->add_option("-o,--output", br.output, "md | json")->capture_default_str();
  BenchTurnsArgs& bt = cmd.bench_turns;
  CLI::App* bt_cmd = bench_cmd->add_subcommand(
      "turns", "one scripted chat, the whole history resubmitted each turn, under KV "
               "configurations: per-turn time, TTFT, resident KV, tiers, replies vs keep-all");
  bt_cmd->add_option("-m,--model", bt.engine.model_path, "GGUF model file")->required();
  bt_cmd->add_option("--turns", bt.turns, "turns of the conversation")->capture_default_str();
  bt_cmd->add_option("--reply", bt.reply_tokens, "greedy tokens per reply (EOS ignored)")
      ->capture_default_str();
  bt_cmd->add_option("--user-min", bt.user_min, "fewest tokens in a user message")
      ->capture_default_str();
  bt_cmd->add_option("--user-max", bt.user_max, "most tokens in a user message")
      ->capture_default_str();
  bt_cmd->add_option("--configs", bt.configs,
                     "a (no reuse), b (keep-all), c-ram, c-disk (lossless hierarchy at the budget), "
                     "d (= d-balanced,d-evict), d-compress; b always runs: it is the reference")
      ->delimiter(',')
      ->capture_default_str();
  bt_cmd->add_option("--budget-fraction", bt.budget_fraction,
                     "(c) and (d)'s KV budget as a fraction of (b)'s resident peak")
      ->capture_default_str();
  bt_cmd->add_option("--json", bt.json_path, "write every turn of every config as JSON");
  bt_cmd->add_option("--plot", bt.plot_path,
                     "draw per-turn time and resident KV into a PNG (python3-matplotlib)");
  bt_cmd->add_option("--plot-script", bt.plot_script,
                     "the plot script (default: scripts/plot_turns.py beside the build or here)");
  bt_cmd->add_option("--disk-dir", bt.disk_dir, "directory for the disk tiers' files")
      ->capture_default_str();
  std::string bt_seed;
  CLI::Option* bt_seed_opt = bt_cmd->add_option("--seed", bt_seed, "user messages' seed (default 1)");
  bt_cmd->add_flag("--restart", bt.restart,
                   "measure a restart instead: a long prompt's TTFT cold, then in a fresh process "
                   "with the first one's persistent disk tier");
  bt_cmd->add_option("--restart-tokens", bt.restart_tokens, "--restart: the prompt's tokens")
      ->capture_default_str();
  bt_cmd->add_option("--redis", bt.redis,
                     "--restart: the same through a Redis tier, redis://HOST:PORT[/NS], or 'auto' "
                     "to start a redis-server on a free port for the bench");
  bt_cmd->add_option("--restart-phase", bt.restart_phase)->group("");  // internal: the child
  bt_cmd->add_option("--restart-tier", bt.restart_tier)->group("");
  bt_cmd->add_option("-t,--threads", bt.engine.num_threads, "threads; 0 = every core");
  bt_cmd->add_option("-c,--ctx-size", bt.engine.context_length,
                     "context length; 0 = what the conversation needs");
  bt_cmd->add_option("-b,--batch-size", bt.engine.batch_size, "prompt tokens per step")
      ->capture_default_str();
  bt_cmd->add_option("--isa", bt.engine.isa, "kernels: auto | avx512 | avx2 | scalar")
      ->capture_default_str();
  bt_cmd->add_option("--cache-type-k", bt.engine.cache_type_k, "KV cache type for keys (-ctk)")
      ->capture_default_str();
  bt_cmd->add_option("--cache-type-v", bt.engine.cache_type_v, "KV cache type for values (-ctv)")
      ->capture_default_str();
  bt_cmd->add_option("--kv-profile", bt.engine.profile_path, "calibration profile");
  bt_cmd->add_flag("!--no-calibrate", bt.engine.calibrate,
                   "without a profile, price KV actions with analytic defaults");
  bt_cmd->add_flag("!--no-kv-window-release", bt.engine.kv_window_release,
                   "sliding-window models: every layer's K/V in the pool (no local release)");
  bt_cmd->add_option("--kv-sink", bt.engine.kv_sink_tokens, "attention-sink tokens")
      ->capture_default_str();
  bt_cmd->add_option("--kv-recent", bt.engine.kv_recent_tokens, "recent tokens kept resident")
      ->capture_default_str();
  bt_cmd->add_option("--kv-stream-reserve", bt.engine.kv_stream_reserve,
                     "fraction of the budget that stages streamed pages (0 = auto)")
      ->capture_default_str();

  BenchFrontierArgs& bf = cmd.bench_frontier;
  CLI::App* bf_cmd = bench_cmd->add_subcommand(
      "frontier", "recompute vs transfer of a KV page, measured per page tokens x depth x tier x "
                  "phase, beside the cost model's prediction, with the crossover points");
  bf_cmd->add_option("-m,--model", bf.model_path, "GGUF model file")->required();
  bf_cmd->add_option("-t,--threads", bf.num_threads, "threads; 0 = every core");
  bf_cmd->add_option("--tiers", bf.tiers, "ram, disk[:DIR] (O_DIRECT scratch file), redis://HOST[:PORT]")
      ->delimiter(',')
      ->capture_default_str();
  bf_cmd->add_option("--page-tokens", bf.page_tokens, "page sizes in tokens")
      ->delimiter(',')
      ->capture_default_str();
  bf_cmd->add_option("--depths", bf.depths, "layers of the page (from the first); default 1, L/4, L/2, L")
      ->delimiter(',');
  bf_cmd->add_option("--position", bf.position,
                     "tokens of context before the page; at most the model's context less the "
                     "128-token run of the decode idle fraction (clamped there, with a message)")
      ->capture_default_str();
  bf_cmd->add_option("-r,--repetitions", bf.repetitions, "runs per timing (the median is kept)")
      ->capture_default_str();
  bf_cmd->add_option("-o,--output", bf.output, "table | json")->capture_default_str();
  bf_cmd->add_option("--json", bf.json_path, "write every point as JSON");
  bf_cmd->add_option("--kv-profile", bf.profile_path, "calibration profile (default: the engine's)");
  bf_cmd->add_flag("!--no-calibrate", bf.calibrate,
                   "without a profile, predict with analytic defaults instead of measuring");

  BenchQualityArgs& bq = cmd.bench_quality;
  CLI::App* bq_cmd = bench_cmd->add_subcommand(
      "quality", "each lossy KV representation (cache types, int8/int4 pages) against the f32 "
                 "cache, teacher-forced over a text: KLD and top-1 against the bytes it keeps");
  bq_cmd->add_option("-m,--model", bq.model_path, "GGUF model file")->required();
  bq_cmd->add_option("-t,--threads", bq.num_threads, "threads; 0 = every core");
  bq_cmd->add_option("-f,--file", bq.text_path, "the text (default: the built-in one)");
  bq_cmd->add_option("-o,--output", bq.output, "table | json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  bq_cmd->add_option("--json", bq.json_path, "write every configuration as JSON");

  BenchSpecArgs& bsp = cmd.bench_spec;
  CLI::App* bsp_cmd = bench_cmd->add_subcommand(
      "spec", "speculative decoding against plain decoding: acceptance, tokens per step and "
              "tok/s on workloads that repeat their input and on prose; the verify step's cost");
  bsp_cmd->add_option("-m,--model", bsp.model_path, "GGUF model file")->required();
  bsp_cmd->add_option("-t,--threads", bsp.num_threads, "threads; 0 = every core");
  bsp_cmd->add_option("--spec", bsp.spec, "drafter: ngram | suffix")
      ->check(CLI::IsMember({"ngram", "suffix"}))
      ->capture_default_str();
  bsp_cmd->add_option("--draft-max", bsp.draft_max, "most draft tokens per step")
      ->check(CLI::Range(1, kMaxDraftTokens))
      ->capture_default_str();
  bsp_cmd->add_option("-n,--n-gen", bsp.n_gen, "tokens generated per workload")
      ->check(CLI::Range(2, 1 << 16))
      ->capture_default_str();
  bsp_cmd->add_option("--depth", bsp.depth, "context tokens of the step-cost measurement")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  bsp_cmd->add_option("-c,--ctx-size", bsp.context_length, "engine context")
      ->check(CLI::Range(int64_t{64}, kMaxContextTokens))
      ->capture_default_str();
  bsp_cmd->add_option("-r,--repetitions", bsp.repetitions, "step-cost timings (median kept)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  bsp_cmd->add_option("--runs", bsp.runs, "runs of each workload, plain and speculative in turn "
                                          "(the median tok/s is kept)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  bsp_cmd->add_flag("--steps-only", bsp.steps_only, "measure the step cost alone (no workloads)");
  bsp_cmd->add_option("-o,--output", bsp.output, "table | json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  bsp_cmd->add_option("--json", bsp.json_path, "write the figures as JSON");

  CalibrateArgs& calibrate = cmd.calibrate;
  CLI::App* calibrate_cmd = app.add_subcommand(
      "calibrate", "measure this machine for the KV cost model and write a profile");
  calibrate_cmd->add_option("-m,--model", calibrate.model_path,
                            "GGUF model file (its shapes are measured)");
  calibrate_cmd->add_option("-t,--threads", calibrate.num_threads, "threads; 0 = every core");
  calibrate_cmd->add_option("--disk", calibrate.disk_dir,
                            "directory for the disk test (default: temp dir)");
  calibrate_cmd->add_flag("--quick", calibrate.quick, "smaller and fewer measurements (seconds)");
  calibrate_cmd->add_flag("--explain", calibrate.explain,
                          "say for each cost-model input how it was measured or that it is a "
                          "named default");
  calibrate_cmd->add_option("-o,--output", calibrate.output,
                            "profile path (default: $KVL_PROFILE or "
                            "~/.cache/kvlattice/"
                            "profile-<model>-<dim>x<layers>-<type>-<isa>-t<threads>.json)");


  try {
    std::vector<std::string> args = NormalizeArgs(argv);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version end parsing with exit code 0: their text is the command's output.
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    if (code == 0) {
      cmd.kind = ParsedCommand::Kind::kPrint;
      cmd.text = out.str();
      return cmd;
    }
    std::string message = err.str();
    while (!message.empty() && message.back() == '\n') message.pop_back();
    return InvalidArgumentError(message);
  } catch (const CLI::Error& e) {
    return InvalidArgumentError(e.what());
  }
  if (*run_cmd) {
    cmd.kind = ParsedCommand::Kind::kRun;
    if (run_seed_opt->count() > 0) {
      KVL_ASSIGN_OR_RETURN(run.sampling.seed, ParseSeed(run_seed, "--seed"));
    }
    KVL_RETURN_IF_ERROR(ValidateRunArgs(run));
  } else if (*chat_cmd) {
    cmd.kind = ParsedCommand::Kind::kChat;
    if (chat_seed_opt->count() > 0) {
      KVL_ASSIGN_OR_RETURN(chat.sampling.seed, ParseSeed(chat_seed, "--seed"));
    }
    KVL_RETURN_IF_ERROR(ValidateChatArgs(chat));
  } else if (*serve_cmd) {
    cmd.kind = ParsedCommand::Kind::kServe;
    KVL_RETURN_IF_ERROR(ValidateServeArgs(&serve));
  } else if (*inspect_cmd) {
    cmd.kind = ParsedCommand::Kind::kInspect;
  } else if (*tokenize_cmd) {
    cmd.kind = ParsedCommand::Kind::kTokenize;
    if (tokenize.prompt_file.empty() && tokenize_prompt->count() == 0) {
      return InvalidArgumentError("kvl tokenize: give the text with -p TEXT or -f FILE");
    }
  } else if (*synth_cmd) {
    cmd.kind = ParsedCommand::Kind::kSynth;
    if (synth_seed_opt->count() > 0) {
      KVL_ASSIGN_OR_RETURN(synth.seed, ParseSeed(synth_seed, "--seed"));
    }
    KVL_RETURN_IF_ERROR(ValidateSynthArgs(synth));
  } else if (*bench_cmd && *br_cmd) {
    cmd.kind = ParsedCommand::Kind::kBenchReplay;
    KVL_RETURN_IF_ERROR(ValidateBenchReplayArgs(br));
  } else if (*bench_cmd && *bs_cmd) {
    cmd.kind = ParsedCommand::Kind::kBenchServe;
    if (bs_seed_opt->count() > 0) {
      KVL_ASSIGN_OR_RETURN(bs.seed, ParseSeed(bs_seed, "--seed"));
    }
    KVL_RETURN_IF_ERROR(ValidateBenchServeArgs(bs));
  } else if (*bench_cmd && *bsp_cmd) {
    cmd.kind = ParsedCommand::Kind::kBenchSpec;
  } else if (*bench_cmd && *bq_cmd) {
    cmd.kind = ParsedCommand::Kind::kBenchQuality;
  } else if (*bench_cmd && *bf_cmd) {
    cmd.kind = ParsedCommand::Kind::kBenchFrontier;
    KVL_RETURN_IF_ERROR(ValidateBenchFrontierArgs(bf));
  } else if (*bench_cmd && *bt_cmd) {
    cmd.kind = ParsedCommand::Kind::kBenchTurns;
    if (bt_seed_opt->count() > 0) {
      KVL_ASSIGN_OR_RETURN(bt.seed, ParseSeed(bt_seed, "--seed"));
    }
    KVL_RETURN_IF_ERROR(ValidateBenchTurnsArgs(bt));
  } else if (*bench_cmd) {
    cmd.kind = ParsedCommand::Kind::kBench;
    KVL_RETURN_IF_ERROR(ValidateBenchArgs(bench));
  } else if (*calibrate_cmd) {
    cmd.kind = ParsedCommand::Kind::kCalibrate;
    KVL_RETURN_IF_ERROR(ValidateCalibrateArgs(calibrate));
  } else {
    return InvalidArgumentError(
        "give a command: run, chat, serve, inspect, tokenize, synth, bench or calibrate");
  }
  return cmd;
}

namespace {

// Most values a bench or run asks for are token counts; none may exceed what positions hold.
Status CheckRange(std::string_view flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return Status::Ok();
  return InvalidArgumentError(fmt::format("{} must be in [{}, {}], got {}", flag, lo, hi, value));
}

}  // namespace

// A positive byte size given as text ("512MiB"), for `flag`.
StatusOr<int64_t> ParsePositiveBytes(const std::string& text, std::string_view flag) {
  StatusOr<int64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) return InvalidArgumentError(fmt::format("{}: {}", flag, bytes.status().message()));
  if (*bytes <= 0) {
    return InvalidArgumentError(fmt::format(
        "{} must be positive, got '{}' (leave it out for the default)", flag, text));
  }
  return *bytes;
}

StatusOr<EngineOptions> EngineOptionsFor(EngineOptions options, int32_t parallel,
                                         const std::string& kv_budget) {
  options.max_seqs = std::max(options.max_seqs, parallel);
  if (!kv_budget.empty()) {
    KVL_ASSIGN_OR_RETURN(options.kv_budget_bytes, ParsePositiveBytes(kv_budget, "--kv-budget"));
  }
  KVL_RETURN_IF_ERROR(ValidateEngineOptions(options));
  return options;
}

StatusOr<EngineOptions> RunEngineOptions(const RunArgs& args) {
  return EngineOptionsFor(args.engine, args.parallel, args.kv_budget);
}

namespace {

// --cors-origin is sent back as a header value: "*" or a scheme://host[:port] origin, nothing
// that could end the header line or name a path.
Status CheckCorsOrigin(const std::string& origin) {
  if (origin.empty() || origin == "*") return Status::Ok();
  const bool http = origin.starts_with("http://") || origin.starts_with("https://");
  const size_t host_at = origin.find("://") + 3;
  bool clean = http && host_at < origin.size();
  for (size_t i = 0; clean && i < origin.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(origin[i]);
    clean = c > 0x20 && c < 0x7f && !(i >= host_at && c == '/');
  }
  if (!clean) {
    return InvalidArgumentError(fmt::format(
        "--cors-origin '{}' is not an origin: give * or scheme://host[:port], e.g. "
        "https://app.example",
        origin));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateServeArgs(ServeArgs* args) {
  KVL_RETURN_IF_ERROR(CheckRange("-np (--parallel)", args->parallel, 1, kMaxSeqs));
  KVL_RETURN_IF_ERROR(CheckRange("--port", args->serve.port, 0, 65535));
  KVL_RETURN_IF_ERROR(CheckRange("--threads-http", args->serve.http_threads, 0, 1024));
  if (!(args->serve.shutdown_grace_seconds >= 0 && args->serve.shutdown_grace_seconds <= 3600)) {
    return InvalidArgumentError("--shutdown-grace must be in [0, 3600] seconds");
  }
  if (!args->serve.chat_template.empty()) {
    KVL_RETURN_IF_ERROR(ParseChatTemplateName(args->serve.chat_template).status());
    if (!args->serve.chat_template_file.empty()) {
      return InvalidArgumentError("--chat-template and --chat-template-file exclude each other");
    }
  }
  KVL_ASSIGN_OR_RETURN(args->serve.max_body_bytes, ParsePositiveBytes(args->max_body, "--max-body"));
  KVL_RETURN_IF_ERROR(CheckCorsOrigin(args->serve.cors_origin));
  // Serving runs -np sequences at once, exactly (the engine's default of 16 is not a floor).
  EngineOptions engine = args->serve.engine;
  engine.max_seqs = args->parallel;
  KVL_ASSIGN_OR_RETURN(args->serve.engine, EngineOptionsFor(engine, args->parallel, args->kv_budget));
  return Status::Ok();
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
  if (args.output != "md" && args.output != "json") {
    return InvalidArgumentError(fmt::format("-o must be md or json, got '{}'", args.output));
  }
  return Status::Ok();
}

Status ValidateBenchReplayArgs(const BenchReplayArgs& args) {
  if (args.trace_path.empty()) return InvalidArgumentError("give a trace file (--kv-trace FILE)");
  for (int64_t n : args.capacity_pages) {
    KVL_RETURN_IF_ERROR(CheckRange("--capacity-pages", n, 1, int64_t{1} << 30));
  }
  if (!(args.miss_ms >= 0 && args.miss_ms <= 1e9)) {
    return InvalidArgumentError(fmt::format("--miss-ms must be in [0, 1e9], got {}", args.miss_ms));
  }
  if (!args.miss_action.empty()) {
    KVL_ASSIGN_OR_RETURN(const KvPolicyChoice choice, ParseKvPolicy(args.miss_action));
    if (choice.automatic || !IsLossless(choice.fixed) || choice.fixed == KvAction::kKeep) {
      return InvalidArgumentError(fmt::format(
          "--miss-action '{}': use demote-ram, demote-disk, recompute-residual or recompute-tokens",
          args.miss_action));
    }
    if (args.miss_ms > 0) return InvalidArgumentError("give --miss-ms or --miss-action, not both");
  }
  if (args.output != "md" && args.output != "json") {
    return InvalidArgumentError(fmt::format("-o must be md or json, got '{}'", args.output));
  }
  return Status::Ok();
}

StatusOr<EngineOptions> ChatEngineOptions(const ChatArgs& args) {
  return EngineOptionsFor(args.engine, 1, args.kv_budget);
}

Status ValidateChatArgs(const ChatArgs& args) {
  if (!args.chat_template.empty()) {
    KVL_RETURN_IF_ERROR(ParseChatTemplateName(args.chat_template).status());
    if (!args.chat_template_file.empty()) {
      return InvalidArgumentError("--chat-template and --chat-template-file exclude each other");
    }
  }
  KVL_RETURN_IF_ERROR(
      CheckRange("-n (--n-predict; -1 = until EOS)", args.num_predict, -1, kMaxContextTokens));
  KVL_RETURN_IF_ERROR(args.sampling.Validate());
  return ChatEngineOptions(args).status();
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
  if (args.output != "md" && args.output != "json") {
    return InvalidArgumentError(fmt::format("-o must be md or json, got '{}'", args.output));
  }
  for (const std::string& t : args.cache_types_k) KVL_RETURN_IF_ERROR(ParseKvCacheType(t).status());
  for (const std::string& t : args.cache_types_v) KVL_RETURN_IF_ERROR(ParseKvCacheType(t).status());
  return Status::Ok();
}

Status ValidateBenchFrontierArgs(const BenchFrontierArgs& args) {
  // The bench allocates a forward run's activations for the largest page and a cache for the
  // context before it: bounds that keep a typo from asking for terabytes.
  KVL_RETURN_IF_ERROR(CheckRange("-t", args.num_threads, 0, 1024));
  KVL_RETURN_IF_ERROR(CheckRange("--position", args.position, 0, int64_t{1} << 20));
  KVL_RETURN_IF_ERROR(CheckRange("-r", args.repetitions, 1, 1000));
  if (args.page_tokens.empty()) return InvalidArgumentError("--page-tokens must not be empty");
  for (int64_t t : args.page_tokens) {
    KVL_RETURN_IF_ERROR(CheckRange("--page-tokens", t, 1, 65536));
  }
  for (int64_t d : args.depths) KVL_RETURN_IF_ERROR(CheckRange("--depths", d, 1, 100000));
  if (args.tiers.empty()) return InvalidArgumentError("--tiers must not be empty");
  for (const std::string& tier : args.tiers) {
    const bool known = tier == "ram" || tier == "disk" || tier.rfind("disk:", 0) == 0 ||
                       tier.rfind("redis://", 0) == 0;
    if (!known) {
      return InvalidArgumentError(
          fmt::format("--tiers '{}': use ram, disk[:DIR] or redis://HOST[:PORT]", tier));
    }
  }
  if (args.output != "table" && args.output != "json") {
    return InvalidArgumentError(fmt::format("-o must be table or json, got '{}'", args.output));
  }
  return Status::Ok();
}

Status ValidateBenchTurnsArgs(const BenchTurnsArgs& args) {
  // A conversation's tokens stay well inside a context; each user message has room for its
  // "User: ... Assistant:" frame.
  constexpr int64_t kMaxTokens = kMaxContextTokens / 4;
  KVL_RETURN_IF_ERROR(CheckRange("--turns", args.turns, 1, 100000));
  KVL_RETURN_IF_ERROR(CheckRange("--reply", args.reply_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--user-min", args.user_min, 8, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--user-max", args.user_max, args.user_min, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--restart-tokens", args.restart_tokens, 32, kMaxTokens));
  if (!(args.budget_fraction > 0 && args.budget_fraction <= 1)) {
    return InvalidArgumentError(
        fmt::format("--budget-fraction must be in (0, 1], got {}", args.budget_fraction));
  }
  static constexpr std::string_view kConfigs[] = {"a", "b", "c", "c-ram", "c-disk", "d",
                                                  "d-balanced", "d-evict", "d-compress"};
  for (const std::string& c : args.configs) {
    if (std::find(std::begin(kConfigs), std::end(kConfigs), c) == std::end(kConfigs)) {
      return InvalidArgumentError(fmt::format(
          "--configs: unknown config '{}' (a, b, c, c-ram, c-disk, d, d-balanced, d-evict, "
          "d-compress)", c));
    }
  }
  if (args.disk_dir.empty()) return InvalidArgumentError("--disk-dir must not be empty");
  // Checked before the first config runs: a missing folder failed the disk configs only after
  // the others had spent minutes.
  if (std::error_code ec; !std::filesystem::is_directory(args.disk_dir, ec)) {
    return InvalidArgumentError(
        fmt::format("--disk-dir '{}' is not an existing directory", args.disk_dir));
  }
  if (!args.redis.empty() && !args.restart) {
    return InvalidArgumentError("--redis is a --restart option");
  }
  if (!args.redis.empty() && args.redis != "auto") {
    KVL_ASSIGN_OR_RETURN(const TierSpec spec, ParseTierSpec(args.redis));
    if (spec.kind != TierKind::kRedis) {
      return InvalidArgumentError(fmt::format(
          "--redis must be redis://HOST:PORT[/NAMESPACE] or auto, got '{}'", args.redis));
    }
  }
  if (!args.restart_phase.empty() && args.restart_phase != "cold" && args.restart_phase != "warm") {
    return InvalidArgumentError("--restart-phase is cold or warm");
  }
  EngineOptions engine = args.engine;
  engine.max_seqs = 1;
  return ValidateEngineOptions(engine);
}

Status ValidateCalibrateArgs(const CalibrateArgs& args) {
  return CheckRange("calibrate -t (--threads; 0 = every core)", args.num_threads, 0, kMaxThreads);
}

Status ValidateSynthArgs(const SynthArgs& args) {
  if (!args.list && !args.shape.empty() && args.output.empty()) {
    return InvalidArgumentError("give an output file with -o");
  }
  return Status::Ok();
}


}  // namespace kvl::cli
