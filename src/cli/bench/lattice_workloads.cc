#include "lattice_workloads.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>

#include "bench_turns.h"

namespace kvl::cli {
namespace {

// Eight (--chats) conversations at once, in lockstep: turn t of every chat is one round, each
// chat resubmitting its whole history as a chat client does. The prefix cache finds the history;
// a budget below the chats' peak makes the policies decide which chat's pages leave the pool.
LatticeWorkload Chats(const BenchLatticeArgs& args, const Tokenizer& tokenizer) {
  LatticeWorkload w;
  w.name = "chats";
  w.description = fmt::format("{} concurrent chats, {} turns, user messages {}-{} tokens, "
                              "replies {} tokens",
                              args.chats, args.turns, args.user_min, args.user_max,
                              args.reply_tokens);
  w.concurrency = args.chats;
  w.rounds.resize(static_cast<size_t>(args.turns));
  for (int32_t c = 0; c < args.chats; ++c) {
    // Each chat its own seed: eight different conversations of the same shape.
    const Conversation conv = ScriptConversation(
        tokenizer, {args.turns, args.user_min, args.user_max, args.reply_tokens,
                    args.seed * 7919u + static_cast<uint64_t>(c)});
    w.context = std::max(w.context, conv.total_tokens);
    for (int32_t t = 0; t < args.turns; ++t) {
      w.rounds[static_cast<size_t>(t)].push_back({c, conv.user[static_cast<size_t>(t)],
                                                  args.reply_tokens});
    }
  }
  return w;
}

// RAG-like: --docs long documents, --questions short questions about each; a request is one
// document and one question. Rounds of --chats requests go document-major (d0q0 d1q0 ... d0q1
// ...), so that every round reads every document and a budget below the documents' pages makes
// the policies keep, shrink, move or drop the prefixes between rounds.
LatticeWorkload Rag(const BenchLatticeArgs& args, const Tokenizer& tokenizer) {
  LatticeWorkload w;
  w.name = "rag";
  w.description = fmt::format("{} documents of {} tokens, {} questions of {} tokens each, "
                              "answers {} tokens, {} requests at once",
                              args.docs, args.doc_tokens, args.questions, args.question_tokens,
                              args.reply_tokens, args.chats);
  w.concurrency = args.chats;
  std::vector<std::vector<int32_t>> docs;
  for (int32_t d = 0; d < args.docs; ++d) {
    std::mt19937_64 rng(args.seed * 104729u + static_cast<uint64_t>(d));
    std::vector<int32_t> doc = {tokenizer.bos()};
    const std::vector<int32_t> words = ScriptedTokens(tokenizer, args.doc_tokens - 1, &rng);
    doc.insert(doc.end(), words.begin(), words.end());
    docs.push_back(std::move(doc));
  }
  const std::vector<int32_t> head = tokenizer.Encode("\nQuestion:", false);
  std::vector<ScriptedRequest> order;
  int32_t stream = 0;
  for (int32_t q = 0; q < args.questions; ++q) {
    for (int32_t d = 0; d < args.docs; ++d) {
      std::mt19937_64 rng(args.seed * 1299709u + static_cast<uint64_t>(q * args.docs + d));
      std::vector<int32_t> ids = docs[static_cast<size_t>(d)];
      ids.insert(ids.end(), head.begin(), head.end());
      const std::vector<int32_t> words = ScriptedTokens(
          tokenizer, std::max<int64_t>(1, args.question_tokens - static_cast<int64_t>(head.size())),
          &rng);
      ids.insert(ids.end(), words.begin(), words.end());
      w.context = std::max<int64_t>(w.context, static_cast<int64_t>(ids.size()) + args.reply_tokens);
      order.push_back({stream++, std::move(ids), args.reply_tokens});
    }
  }
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(args.chats)) {
    const size_t end = std::min(order.size(), i + static_cast<size_t>(args.chats));
    w.rounds.emplace_back(order.begin() + static_cast<ptrdiff_t>(i),
                          order.begin() + static_cast<ptrdiff_t>(end));
  }
  return w;
}

// Long generations: --long-seqs short prompts, each generating --long-tokens at once; the pages
// of the generated text itself outgrow the budget.
LatticeWorkload Long(const BenchLatticeArgs& args, const Tokenizer& tokenizer) {
  LatticeWorkload w;
  w.name = "long";
  w.description = fmt::format("{} generations of {} tokens at once from 32-token prompts",
                              args.long_seqs, args.long_tokens);
  w.concurrency = args.long_seqs;
  w.rounds.resize(1);
  for (int32_t s = 0; s < args.long_seqs; ++s) {
    std::mt19937_64 rng(args.seed * 15485863u + static_cast<uint64_t>(s));
    std::vector<int32_t> ids = {tokenizer.bos()};
    const std::vector<int32_t> words = ScriptedTokens(tokenizer, 31, &rng);
    ids.insert(ids.end(), words.begin(), words.end());
    w.context = std::max<int64_t>(w.context, static_cast<int64_t>(ids.size()) + args.long_tokens);
    w.rounds[0].push_back({s, std::move(ids), args.long_tokens});
  }
  return w;
}

}  // namespace

LatticeWorkload MakeLatticeWorkload(const std::string& name, const BenchLatticeArgs& args,
                                    const Tokenizer& tokenizer, int32_t block_tokens) {
  LatticeWorkload w = name == "chats" ? Chats(args, tokenizer)
                      : name == "rag" ? Rag(args, tokenizer)
                                      : Long(args, tokenizer);  // validated when parsed
  // One block more than the longest stream: the last generated token's row needs its slot.
  w.context = (w.context + block_tokens) / block_tokens * block_tokens;
  for (const std::vector<ScriptedRequest>& round : w.rounds) {
    for (const ScriptedRequest& r : round) {
      ++w.requests;
      w.generated_tokens += r.max_new_tokens;
    }
  }
  return w;
}

}  // namespace kvl::cli
