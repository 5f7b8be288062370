// What `kvl bench turns` (cmd_bench_turns.cc), its restart measurement (cmd_bench_restart.cc) and
// `kvl bench lattice` share: the scripted text and conversation, and a child process run to its
// end.
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

// A scripted conversation's shape: `turns` user messages of [user_min, user_max] tokens each,
// replies of `reply_tokens`; the seed and the turn decide each message.
struct ConversationScript {
  int32_t turns = 20;
  int32_t user_min = 40;
  int32_t user_max = 80;
  int32_t reply_tokens = 64;
  uint64_t seed = 1;
};

// The scripted conversation: user messages as token ids, BOS at the start of the first.
struct Conversation {
  std::vector<std::vector<int32_t>> user;
  int64_t total_tokens = 0;  // BOS, every user message and every reply
};

// Each user message is "User: <scripted words>\nAssistant:", cut to a length drawn uniformly from
// [user_min, user_max] tokens (bench turns' conversation; bench lattice's chats, one seed each).
Conversation ScriptConversation(const Tokenizer& tokenizer, const ConversationScript& script);

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
