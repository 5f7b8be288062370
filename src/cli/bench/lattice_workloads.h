// The four workloads of `kvl bench lattice` (cmd_bench_lattice.cc), as scripts of requests whose
// pages differ in how often they are read again: skewed multi-turn chats, RAG over a shared
// system prompt and shared documents, an agent loop re-sending a growing transcript, long
// generations. The same script runs under every KV configuration, each cell feeding its own
// replies back where a workload resubmits a history (chats, agents), as a client does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_lattice.h"
#include "kvl/status.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {

// One request of a script: the tokens it appends to its stream's history (a chat's, an agent's),
// and how many tokens it generates. Its prompt is the whole history; its reply joins the history
// after it.
struct ScriptedRequest {
  int32_t stream = 0;             // which history it extends (a chat, a RAG request, ...)
  std::vector<int32_t> append;    // new tokens after the history
  int32_t max_new_tokens = 0;
};

struct LatticeWorkload {
  std::string name;               // chats | rag | agent | long
  std::string description;
  // Rounds run one after another; a round's requests are submitted together (at most
  // `concurrency` of them, never two of one stream) and run to their end.
  std::vector<std::vector<ScriptedRequest>> rounds;
  int32_t concurrency = 1;        // sequences at once (the engine's max_seqs)
  int64_t context = 0;            // the longest stream's tokens, rounded up to a block
  int64_t requests = 0;
  int64_t generated_tokens = 0;   // what every cell generates (EOS is ignored)
  // The distinct tokens of every history at its end (a prefix several requests share counted
  // once, each reply counted as its own): what holding the whole workload's KV at once takes.
  // The budgets are fractions of it.
  int64_t working_set_tokens = 0;
};

// `name` (chats, rag, agent or long) sized by args; block_tokens rounds the context up. An error
// when a stream would not fit `max_context` tokens (the model's), naming the flags to lower.
StatusOr<LatticeWorkload> MakeLatticeWorkload(const std::string& name,
                                              const BenchLatticeArgs& args,
                                              const Tokenizer& tokenizer, int32_t block_tokens,
                                              int64_t max_context);

// The order a Zipf law of exponent `s` draws `count` items in, over `n` items ranked 0..n-1
// (rank 0 the most likely), from `seed`: the skew of the chats and of the RAG documents.
std::vector<int32_t> ZipfDraws(int32_t n, double s, int32_t count, uint64_t seed);

}  // namespace kvl::cli
