// What `kvl bench turns` (cmd_bench_turns.cc) and its restart measurement (cmd_bench_restart.cc)
// share: the scripted text and a child process run to its end.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "kvl/engine.h"
#include "kvl/status.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {

// Exactly `num_tokens` ids of words drawn from a fixed list of simple story words by `rng`
// (no BOS): the same seed gives the same ids on every machine.
std::vector<int32_t> ScriptedTokens(const Tokenizer& tokenizer, int64_t num_tokens,
                                    std::mt19937_64* rng);

// Runs argv[0] (found on PATH) with argv, no shell, to its end; its stdout (and stderr, with
// `with_stderr`; else that passes through) is returned in *out. The exit code, or an error when
// it could not start or died of a signal.
StatusOr<int> RunChildProcess(const std::vector<std::string>& argv, std::string* out,
                              bool with_stderr = false);

// The path of this process's own executable, for a child that must be a fresh process.
StatusOr<std::string> SelfExecutable();

// --restart: the parent (spawns one fresh process per phase) and one phase, in the child.
int BenchRestart(const BenchTurnsArgs& args);
int BenchRestartPhase(const BenchTurnsArgs& args);

}  // namespace kvl::cli
