// What every command's flag file (`*_flags.cc`, beside its `cmd_*.cc`) declares its flags and
// validation with: the CLI11 subcommand, the step that finishes it once parsed, and the flag
// groups and range checks that several commands share. ParseCommandLine (options.cc) only
// assembles these; no command's flags are written there.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "cli.h"
#include "kvl/status.h"
#include "options.h"

namespace kvl::cli {

// One command on the parser. `finish` runs when the command line named it, after CLI11 parsed:
// values taken as text are converted (a seed) and the whole command is validated.
struct CommandFlags {
  CLI::App* app = nullptr;
  ParsedCommand::Kind kind = ParsedCommand::Kind::kPrint;
  std::function<Status()> finish = [] { return Status::Ok(); };
};

// Each command's flags (the files beside its cmd_*.cc). The bench subcommands go on `bench`,
// the app that DeclareBenchFlags returns.
CommandFlags DeclareRunFlags(CLI::App* app, RunArgs* args);
CommandFlags DeclareChatFlags(CLI::App* app, ChatArgs* args);
CommandFlags DeclareServeFlags(CLI::App* app, ServeArgs* args);
CommandFlags DeclareInspectFlags(CLI::App* app, InspectArgs* args);
CommandFlags DeclareTokenizeFlags(CLI::App* app, TokenizeArgs* args);
CommandFlags DeclarePerplexityFlags(CLI::App* app, PerplexityArgs* args);
CommandFlags DeclareSynthFlags(CLI::App* app, SynthArgs* args);
CommandFlags DeclareCalibrateFlags(CLI::App* app, CalibrateArgs* args);
CommandFlags DeclareBenchFlags(CLI::App* app, BenchArgs* args);
CommandFlags DeclareBenchServeFlags(CLI::App* bench, BenchServeArgs* args);
CommandFlags DeclareBenchReplayFlags(CLI::App* bench, BenchReplayArgs* args);
CommandFlags DeclareBenchTurnsFlags(CLI::App* bench, BenchTurnsArgs* args);
CommandFlags DeclareBenchFrontierFlags(CLI::App* bench, BenchFrontierArgs* args);
CommandFlags DeclareBenchQualityFlags(CLI::App* bench, BenchQualityArgs* args);
CommandFlags DeclareBenchSpecFlags(CLI::App* bench, BenchSpecArgs* args);
CommandFlags DeclareBenchLatticeFlags(CLI::App* bench, BenchLatticeArgs* args);

// A seed flag taken as text (CLI11 saturates integers past 2^64 silently; ParseSeed does not).
// The returned step sets *seed from the text when the flag was given.
std::function<Status()> AddSeedFlag(CLI::App* cmd, const std::string& names,
                                    const std::string& help, uint64_t* seed);

// The sampling flags of run and chat, with -s/--seed; the returned step parses the seed.
std::function<Status()> AddSamplingFlags(CLI::App* cmd, SamplingParams* sampling);

// The engine's flags, in groups, so that a bench that runs engines of its own declares the ones
// it honours once, with the same names and help as run and serve.
// -t, -c, -b, --isa: how the forward pass runs.
void AddComputeFlags(CLI::App* cmd, EngineOptions* engine);
// --cache-type-k / --cache-type-v (-ctk / -ctv).
void AddCacheTypeFlags(CLI::App* cmd, EngineOptions* engine);
// --kv-profile, --no-calibrate: where the cost model's prices come from.
void AddKvProfileFlags(CLI::App* cmd, EngineOptions* engine);
// --kv-sink, --kv-recent, --kv-stream-reserve: the pages a budget never touches, and staging.
void AddKvReserveFlags(CLI::App* cmd, EngineOptions* engine);
// --kv-price-kld-balanced / -aggressive, --kv-price-evict-balanced / -aggressive.
void AddKvPriceFlags(CLI::App* cmd, KvQualityPrices* prices);
// Every engine flag (the groups above and the KV policy, tiers, trace, speculation): run, chat
// and serve.
void AddEngineFlags(CLI::App* cmd, EngineOptions* engine, std::string* kv_budget);

// --chat-template-steps and --chat-template-timeout (chat and serve): what each render of a Jinja
// chat template may spend.
void AddChatTemplateLimitFlags(CLI::App* cmd, jinja::RenderOptions* limits);
// Those two in range, else an error naming the flag.
Status CheckChatTemplateLimits(const jinja::RenderOptions& limits);

// `value` in [lo, hi], else an error naming `flag` and the range.
Status CheckRange(std::string_view flag, int64_t value, int64_t lo, int64_t hi);
// -o's value among `formats` ("md", "json"), else an error naming them.
Status CheckOutputFormat(const std::string& output, std::initializer_list<std::string_view> formats);
// A file a bench writes (--json): not a directory, in a directory that exists; empty is unset.
Status CheckOutputFile(std::string_view flag, const std::string& path);
// A positive byte size given as text ("512MiB"), for `flag`.
StatusOr<int64_t> ParsePositiveBytes(const std::string& text, std::string_view flag);
// `options` with -np sequences and --kv-budget folded in, validated as Engine::Create does.
StatusOr<EngineOptions> EngineOptionsFor(EngineOptions options, int32_t parallel,
                                         const std::string& kv_budget);

}  // namespace kvl::cli
