// The three workloads of `kvl bench lattice` (cmd_bench_lattice.cc), as scripts of requests: the
// same script runs under every KV configuration, each cell feeding its own replies back where a
// workload resubmits a history (the chats), as a chat client does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_lattice.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {

// One request of a script: the tokens it appends to its stream's history (a chat's), and how
// many tokens it generates. Its prompt is the whole history; its reply joins the history after it.
struct ScriptedRequest {
  int32_t stream = 0;             // which history it extends (a chat, a RAG request, ...)
  std::vector<int32_t> append;    // new tokens after the history
  int32_t max_new_tokens = 0;
};

struct LatticeWorkload {
  std::string name;               // chats | rag | long
  std::string description;
  // Rounds run one after another; a round's requests are submitted together (at most
  // `concurrency` of them) and run to their end.
  std::vector<std::vector<ScriptedRequest>> rounds;
  int32_t concurrency = 1;        // sequences at once (the engine's max_seqs)
  int64_t context = 0;            // the longest stream's tokens, rounded up to a block
  int64_t requests = 0;
  int64_t generated_tokens = 0;   // what every cell generates (EOS is ignored)
};

// `name` (chats, rag or long) sized by args; block_tokens rounds the context up.
LatticeWorkload MakeLatticeWorkload(const std::string& name, const BenchLatticeArgs& args,
                                    const Tokenizer& tokenizer, int32_t block_tokens);

}  // namespace kvl::cli
