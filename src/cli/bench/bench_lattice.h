// `kvl bench lattice`'s arguments (its flags: bench_lattice_flags.cc; the command:
// cmd_bench_lattice.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvl/engine.h"

namespace kvl::cli {

// `kvl bench lattice`: `auto` against every fixed KV policy under one budget and the same lower
// tiers (a disk tier, and Redis over a shaped link where it can be started), at 1/8, 1/4 and 1/2
// of each workload's working set, on four workloads whose pages differ (lattice_workloads.h):
// skewed multi-turn chats, RAG over shared documents, an agent loop, long generations. Per cell:
// tok/s, CPU tok/s, quality against keep-all, the process's RSS less the weights against the
// budget, pages per action (cmd_bench_lattice.cc).
struct BenchLatticeArgs {
  // Model, threads, -b, --isa, -ctk/-ctv, profile, sink, recent. The recent window is 16 tokens
  // here, not the engine's 64: eight sequences' windows would otherwise fill a budget of 1/8
  // of the working set on their own, leaving no page for a policy to act on.
  EngineOptions engine = [] {
    EngineOptions o;
    o.kv_recent_tokens = 16;
    return o;
  }();
  std::vector<std::string> workloads = {"chats", "rag", "agent", "long"};  // --workloads
  // "Keep with preemption" is recompute-tokens: running pages stay, a preempted sequence's pages
  // are recomputed from its tokens (fixed `keep` lets the cost model place a preempted
  // sequence's pages, in the disk tier where it is cheaper).
  std::vector<std::string> policies = {"auto",         "recompute-tokens", "demote-disk",
                                       "demote-redis", "compress",         "compress-int4",
                                       "recompute-residual", "evict"};  // --policies
  std::vector<double> budgets = {0.125, 0.25, 0.5};  // --budgets: fractions of the working set
  std::string auto_quality = "balanced";  // --auto-quality: the preset `auto` runs at
  // --quick: every size below not given on the command line takes its small value
  // (ApplyQuickSizes), for a smoke test of the whole bench in well under a minute.
  bool quick = false;
  int32_t concurrency = 8;     // --concurrency: requests at once (the engine's max_seqs)
  // (a) chats: --chats conversations, --chat-requests turns among them drawn by a Zipf law of
  // exponent --zipf over the conversations (a few return often, most rarely).
  int32_t chats = 16;
  int32_t chat_requests = 48;
  double zipf = 1.1;
  int32_t user_min = 24;       // --user-min / --user-max: tokens per user message
  int32_t user_max = 48;
  int32_t reply_tokens = 24;   // --reply: greedy tokens per chat reply, RAG answer, agent action
  // (b) RAG: a shared system prompt, --docs shared documents, --rag-requests questions from
  // --rag-users users, each about one document (drawn by the same Zipf law: some documents are
  // read often, some once).
  int32_t system_tokens = 64;  // --system-tokens (RAG's and the agents' system prompt)
  int32_t docs = 8;
  int32_t doc_tokens = 128;
  int32_t rag_users = 16;
  int32_t rag_requests = 32;
  int32_t question_tokens = 16;
  // (c) agent loop: --agents agents, each --agent-steps steps: an action of --reply tokens, then
  // a tool output of [--tool-min, --tool-max] tokens, the whole transcript re-sent each step.
  int32_t agents = 4;
  int32_t agent_steps = 6;
  int32_t tool_min = 32;
  int32_t tool_max = 96;
  // (d) long generations.
  int32_t long_seqs = 4;       // --long-seqs: long generations at once
  int32_t long_tokens = 192;   // --long-tokens: tokens each generates
  int32_t runs = 1;            // --runs: rounds, each running every cell once; the median
                               // by tok/s is kept
  // --kv-tier disk:PATH:SIZE[:direct]: the disk tier every cell uses (made afresh for each);
  // empty: a scratch file in TMPDIR.
  std::string disk_tier;
  // The Redis link (lattice_redis_link.h): the script that starts it and the link's rate.
  std::string redis_script;    // --redis-script; empty: scripts/redis-netns.sh, found
  std::string redis_rate = "1gbit";  // --redis-rate: 1gbit | 10gbit
  std::string json_path;       // --json FILE
  uint64_t seed = 1;           // --seed: the scripted texts
};
int BenchLatticeCommand(const BenchLatticeArgs& args);

}  // namespace kvl::cli
