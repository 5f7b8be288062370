// The flag groups and checks that several commands share (command_flags.h): declared once here,
// so that run, chat, serve and the benches that run engines spell and explain them alike.
#include "command_flags.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>

#include "kvl/engine.h"
#include "kvl/kv_trace.h"  // OpenKvTraceFile

namespace kvl::cli {

std::function<Status()> AddSeedFlag(CLI::App* cmd, const std::string& names,
                                    const std::string& help, uint64_t* seed) {
  auto text = std::make_shared<std::string>();
  CLI::Option* option = cmd->add_option(names, *text, help);
  return [option, text, seed]() -> Status {
    if (option->count() == 0) return Status::Ok();
    KVL_ASSIGN_OR_RETURN(*seed, ParseSeed(*text, "--seed"));
    return Status::Ok();
  };
}

std::function<Status()> AddSamplingFlags(CLI::App* cmd, SamplingParams* s) {
  std::function<Status()> seed =
      AddSeedFlag(cmd, "-s,--seed", "RNG seed (same seed, same output)", &s->seed);
  cmd->add_option("--temp", s->temperature, "temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s->top_k, "top-k sampling; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s->top_p, "top-p (nucleus) sampling; 1 = off")->capture_default_str();
  cmd->add_option("--min-p", s->min_p, "min-p sampling; 0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", s->repeat_penalty, "repetition penalty; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", s->repeat_last_n, "tokens the penalty looks back over")
      ->capture_default_str();
  return seed;
}

void AddComputeFlags(CLI::App* cmd, EngineOptions* engine) {
  cmd->add_option("-t,--threads", engine->num_threads, "threads; 0 = every core");
  // As llama.cpp: unset, the model's context capped at 4096; -c 0, all of the model's.
  cmd->add_option_function<int64_t>(
      "-c,--ctx-size",
      [engine](const int64_t& tokens) {
        engine->context_length = tokens;
        engine->whole_model_context = tokens == 0;
      },
      "context length (default: the model's, at most 4096); 0 = all of the model's");
  cmd->add_option("-b,--batch-size", engine->batch_size,
                  "prompt tokens per step (fewer under --kv-budget, at least 128: the forward "
                  "pass's scratch fits a quarter of it)")
      ->capture_default_str();
  cmd->add_option("--isa", engine->isa, "kernels: auto | avx512 | avx2 | scalar")
      ->capture_default_str();
}

void AddCacheTypeFlags(CLI::App* cmd, EngineOptions* engine) {
  // -ctk / -ctv (see NormalizeArgs in options.cc), as llama.cpp's --cache-type-k / --cache-type-v.
  cmd->add_option("--cache-type-k", engine->cache_type_k,
                  "KV cache type for keys (-ctk): f16 | f32 | bf16 | q8_0 | q4_0 | q8_0r | q4_0r")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", engine->cache_type_v,
                  "KV cache type for values (-ctv): f16 | f32 | bf16 | q8_0 | q4_0 | q8_0r | q4_0r")
      ->capture_default_str();
}

void AddKvProfileFlags(CLI::App* cmd, EngineOptions* engine) {
  cmd->add_option("--kv-profile", engine->profile_path,
                  "calibration profile (default: $KVL_PROFILE or "
                  "~/.cache/kvlattice/profile-<model>-<dim>x<layers>-<type>-<isa>-t<threads>"
                  ".json; measured and saved if missing)");
  cmd->add_flag("!--no-calibrate", engine->calibrate,
                "without a profile, price KV actions with analytic defaults instead of "
                "measuring this machine (nothing is written)");
  cmd->add_option("--kv-profile-drift", engine->kv_profile_drift,
                  "a profile at the default path whose measured correction of some action "
                  "passes this factor either way is measured again (kvl serve: while idle; "
                  "else at the next start); 0 = never")
      ->capture_default_str();
}

void AddKvReserveFlags(CLI::App* cmd, EngineOptions* engine) {
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
}

// What a loss of quality is worth (kvl/kv_policy.h KvQualityPrices); ValidateEngineOptions
// checks the values and names the flag of a bad one.
void AddKvPriceFlags(CLI::App* cmd, KvQualityPrices* prices) {
  cmd->add_option("--kv-price-kld-balanced", prices->balanced_ms_per_kld,
                  "--kv-quality balanced: ms a compressed page may cost per nat of KL divergence "
                  "it adds")
      ->capture_default_str();
  cmd->add_option("--kv-price-kld-aggressive", prices->aggressive_ms_per_kld,
                  "--kv-quality aggressive: ms per nat of KL divergence")
      ->capture_default_str();
  cmd->add_option("--kv-price-evict-balanced", prices->balanced_ms_per_evicted_mass,
                  "--kv-quality balanced: ms an evicted page costs per unit of the attention "
                  "mass it would still get")
      ->capture_default_str();
  cmd->add_option("--kv-price-evict-aggressive", prices->aggressive_ms_per_evicted_mass,
                  "--kv-quality aggressive: ms per unit of evicted attention mass")
      ->capture_default_str();
}

void AddEngineFlags(CLI::App* cmd, EngineOptions* engine, std::string* kv_budget) {
  cmd->add_option("--kv-budget", *kv_budget,
                  "every byte of KV held in RAM: the pool, a RAM tier, staging, rings and a draft "
                  "model's pool, e.g. 512MiB (default: enough for -np full contexts, at most "
                  "1 GiB, which a RAM tier then comes out of)");
  cmd->add_flag("!--no-prefix-cache", engine->prefix_cache, "do not reuse cached prompt prefixes");
  cmd->add_option("--kv-tier", engine->kv_tiers,
                  "a tier KV pages can be demoted to: ram:SIZE[:zstd] (carved from --kv-budget), "
                  "ram:auto[:zstd] (the budget split between pool and tier), "
                  "disk:PATH:SIZE[:direct][:scratch] or redis://HOST[:PORT][/NAMESPACE] "
                  "(repeatable)");
  cmd->add_option("--kv-policy", engine->kv_policy,
                  "what happens to cold KV pages when the budget is short: auto (cost model), "
                  "keep, compress, compress-int4, demote, demote-disk, demote-redis, "
                  "recompute-residual, "
                  "recompute-tokens, evict")
      ->capture_default_str();
  cmd->add_option("--kv-quality", engine->kv_quality, "lossless | balanced | aggressive")
      ->capture_default_str();
  AddKvPriceFlags(cmd, &engine->kv_quality_prices);
  AddKvProfileFlags(cmd, engine);
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
  AddKvReserveFlags(cmd, engine);
  // `auto` reads as 0, which EngineOptions takes as "the cost model chooses".
  cmd->add_option("--kv-checkpoint-every", engine->kv_checkpoint_every,
                  "pages kept as residual checkpoints keep every S-th layer's (1 = every "
                  "layer; the layers between are rebuilt by running them); auto: the cost "
                  "model's choice")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{{"auto", "0"}}))
      ->capture_default_str();
  AddCacheTypeFlags(cmd, engine);
  // Speculative decoding (issue 26).
  cmd->add_option("--spec", engine->spec,
                  "speculative decoding: auto (the engine's choice: today suffix), ngram (prompt "
                  "lookup), suffix (and recent requests), draft (a small model, -md) or off; "
                  "drafts are sent only where the cost model says they pay, and the output is "
                  "plain decoding's")
      ->capture_default_str();
  cmd->add_option("--draft-max", engine->draft_max, "most draft tokens one sequence's step carries")
      ->capture_default_str();
  cmd->add_flag("--spec-force", engine->spec_force,
                "send every draft, whatever the cost model says (to measure acceptance)");
  cmd->add_option("--model-draft", engine->draft_model_path,
                  "draft model for --spec draft (-md), of the model's vocabulary");
  AddComputeFlags(cmd, engine);
}

void AddChatTemplateLimitFlags(CLI::App* cmd, jinja::RenderOptions* limits) {
  cmd->add_option("--chat-template-steps", limits->max_steps,
                  "steps each render of a Jinja chat template may take (one per statement, "
                  "expression and loop iteration, and one per KiB of text or list it works on)")
      ->capture_default_str();
  cmd->add_option("--chat-template-timeout", limits->max_seconds,
                  "seconds each render of a Jinja chat template may take")
      ->capture_default_str();
}

Status CheckChatTemplateLimits(const jinja::RenderOptions& limits) {
  KVL_RETURN_IF_ERROR(
      CheckRange("--chat-template-steps", limits.max_steps, 1000, int64_t{1} << 53));
  if (!(limits.max_seconds > 0 && limits.max_seconds <= 3600)) {
    return InvalidArgumentError("--chat-template-timeout must be in (0, 3600] seconds");
  }
  return Status::Ok();
}

Status CheckRange(std::string_view flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return Status::Ok();
  return InvalidArgumentError(fmt::format("{} must be in [{}, {}], got {}", flag, lo, hi, value));
}

Status CheckOutputFormat(const std::string& output,
                         std::initializer_list<std::string_view> formats) {
  for (std::string_view f : formats) {
    if (output == f) return Status::Ok();
  }
  return InvalidArgumentError(
      fmt::format("-o must be {}, got '{}'", fmt::join(formats, " or "), output));
}

Status CheckOutputFile(std::string_view flag, const std::string& path) {
  if (path.empty()) return Status::Ok();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgumentError(fmt::format("{} '{}' is a directory: give a file", flag, path));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    return InvalidArgumentError(
        fmt::format("{} '{}': the directory '{}' does not exist", flag, path, parent.string()));
  }
  return Status::Ok();
}

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
  // --kv-trace: the CLI links the trace library, the engine does not.
  if (!options.kv_trace_path.empty()) options.kv_trace_opener = OpenKvTraceFile;
  KVL_RETURN_IF_ERROR(ValidateEngineOptions(options));
  return options;
}

}  // namespace kvl::cli
