// The command line, parsed and validated, nothing run: the one layer that checks what a user
// typed. Main runs what it returns; the option fuzzer (fuzz/cli_options_fuzzer.cc) calls it on
// arbitrary argument vectors.
#pragma once

#include <string>
#include <vector>

#include "bench/bench_lattice.h"
#include "cli.h"
#include "kvl/status.h"

namespace kvl::cli {

struct ParsedCommand {
  enum class Kind { kPrint, kRun, kChat, kServe, kInspect, kSynth, kBench, kBenchServe,
                    kBenchTurns, kBenchReplay, kBenchFrontier, kBenchQuality, kBenchSpec, kBenchLattice,
                    kCalibrate,
                    kTokenize, kPerplexity };
  Kind kind = Kind::kPrint;
  std::string text;  // kPrint: help or version text for stdout
  // Lines for stderr before the command runs: llama.cpp flags that were ignored (llama_flags.h).
  std::vector<std::string> notes;
  RunArgs run;
  ChatArgs chat;
  ServeArgs serve;
  InspectArgs inspect;
  SynthArgs synth;
  BenchArgs bench;
  BenchServeArgs bench_serve;
  BenchReplayArgs bench_replay;
  BenchTurnsArgs bench_turns;
  BenchFrontierArgs bench_frontier;
  BenchQualityArgs bench_quality;
  BenchSpecArgs bench_spec;
  BenchLatticeArgs bench_lattice;
  CalibrateArgs calibrate;
  TokenizeArgs tokenize;
  PerplexityArgs perplexity;
};

// args excludes the program name. INVALID_ARGUMENT with CLI11's message for a syntax error, or
// the validation's for a value out of range or options that contradict each other.
StatusOr<ParsedCommand> ParseCommandLine(const std::vector<std::string>& args);

// Range and consistency checks per command (run also checks its EngineOptions with
// ValidateEngineOptions, as Engine::Create does).
Status ValidateRunArgs(const RunArgs& args);
// The engine's options for a run: -np and --kv-budget folded in, validated.
StatusOr<EngineOptions> RunEngineOptions(const RunArgs& args);
// Range checks of the serve flags; fills serve.max_body_bytes and serve.engine (-np, --kv-budget
// folded in, validated).
Status ValidateServeArgs(ServeArgs* args);
// Range checks of the chat flags, the template's name and the engine's options.
Status ValidateChatArgs(const ChatArgs& args);
// The engine's options for a chat: one sequence, --kv-budget folded in, validated.
StatusOr<EngineOptions> ChatEngineOptions(const ChatArgs& args);
Status ValidateBenchArgs(const BenchArgs& args);
Status ValidateBenchServeArgs(const BenchServeArgs& args);
Status ValidateBenchReplayArgs(const BenchReplayArgs& args);
Status ValidateBenchTurnsArgs(const BenchTurnsArgs& args);
Status ValidateBenchFrontierArgs(const BenchFrontierArgs& args);
Status ValidateBenchQualityArgs(const BenchQualityArgs& args);
Status ValidateBenchLatticeArgs(const BenchLatticeArgs& args);
Status ValidateCalibrateArgs(const CalibrateArgs& args);
Status ValidateSynthArgs(const SynthArgs& args);
Status ValidatePerplexityArgs(const PerplexityArgs& args);

// "12345" -> 12345 over the whole uint64 range; anything else (a sign, 2^64 or more, junk) is an
// error naming `flag`.
StatusOr<uint64_t> ParseSeed(const std::string& text, std::string_view flag);

}  // namespace kvl::cli
