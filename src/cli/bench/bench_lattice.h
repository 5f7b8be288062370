// `kvl bench lattice`'s arguments (its flags: bench_lattice_flags.cc; the command:
// cmd_bench_lattice.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvl/engine.h"

namespace kvl::cli {

// `kvl bench lattice`: `auto` against every fixed KV policy at budgets below keep-all's peak, on
// three workloads (eight concurrent chats, requests sharing long prefixes, long generations):
// output tok/s, TTFT, and quality against keep-all per cell (cmd_bench_lattice.cc).
struct BenchLatticeArgs {
  // Model, threads, -b, --isa, -ctk/-ctv, profile, sink, recent. The recent window is 16 tokens
  // here, not the engine's 64: eight sequences' windows would otherwise fill a budget of 1/8
  // of keep-all's peak on their own, leaving no page for a policy to act on.
  EngineOptions engine = [] {
    EngineOptions o;
    o.kv_recent_tokens = 16;
    return o;
  }();
  std::vector<std::string> workloads = {"chats", "rag", "long"};  // --workloads
  std::vector<std::string> policies = {"auto",  "keep",     "compress",           "compress-int4",
                                       "demote", "recompute-residual", "recompute-tokens",
                                       "evict"};  // --policies
  std::vector<double> budgets = {0.125, 0.25, 0.5};  // --budgets: fractions of keep-all's peak
  int32_t chats = 8;           // --chats: conversations at once
  int32_t turns = 3;           // --turns: turns of each chat
  int32_t user_min = 24;       // --user-min / --user-max: tokens per user message
  int32_t user_max = 48;
  int32_t reply_tokens = 24;   // --reply: greedy tokens per chat reply and per RAG answer
  int32_t docs = 4;            // --docs: long prefixes (documents) the RAG requests share
  int32_t doc_tokens = 192;    // --doc-tokens
  int32_t questions = 4;       // --questions: requests per document
  int32_t question_tokens = 16;  // --question-tokens
  int32_t long_seqs = 4;       // --long-seqs: long generations at once
  int32_t long_tokens = 192;   // --long-tokens: tokens each generates
  int32_t runs = 1;            // --runs: rounds, each running every cell once; the median
                               // by tok/s is kept
  std::string json_path;       // --json FILE
  uint64_t seed = 1;           // --seed: the scripted texts
};
int BenchLatticeCommand(const BenchLatticeArgs& args);

}  // namespace kvl::cli
