#include "lattice_workloads.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "bench_turns.h"

namespace kvl::cli {
namespace {

// A uniform double in [0, 1) from the generator's top 53 bits: the same on every standard library
// (std::uniform_real_distribution is not specified bit for bit).
double Uniform(std::mt19937_64* rng) { return static_cast<double>((*rng)() >> 11) * 0x1.0p-53; }

int32_t UniformIn(int32_t lo, int32_t hi, std::mt19937_64* rng) {
  return lo + static_cast<int32_t>((*rng)() % static_cast<uint64_t>(hi - lo + 1));
}

// `prefix` then `count` scripted words (count may be 0).
std::vector<int32_t> Words(const Tokenizer& tokenizer, const std::string& prefix, int64_t count,
                           std::mt19937_64* rng) {
  std::vector<int32_t> ids = prefix.empty() ? std::vector<int32_t>{}
                                            : tokenizer.Encode(prefix, /*add_bos=*/false);
  if (count > 0) {
    const std::vector<int32_t> words = ScriptedTokens(tokenizer, count, rng);
    ids.insert(ids.end(), words.begin(), words.end());
  }
  return ids;
}

// Requests in script order made rounds: a round takes the next requests until it holds
// `concurrency` of them or the next one extends a stream already in it (that request needs the
// reply of the one before it). The order of the script is kept.
std::vector<std::vector<ScriptedRequest>> PackRounds(std::vector<ScriptedRequest> order,
                                                     int32_t concurrency) {
  std::vector<std::vector<ScriptedRequest>> rounds;
  std::set<int32_t> in_round;
  for (ScriptedRequest& r : order) {
    if (rounds.empty() || static_cast<int32_t>(rounds.back().size()) >= concurrency ||
        in_round.contains(r.stream)) {
      rounds.emplace_back();
      in_round.clear();
    }
    in_round.insert(r.stream);
    rounds.back().push_back(std::move(r));
  }
  return rounds;
}

// (a) --chats conversations, --chat-requests turns among them in the order a Zipf law draws the
// conversations (every conversation at least once): a few chats return turn after turn, most
// are visited once or twice and their pages wait long between reads. Each turn resubmits the
// chat's whole history, as a chat client does; the prefix cache finds what the pool still holds.
StatusOr<LatticeWorkload> Chats(const BenchLatticeArgs& args, const Tokenizer& tokenizer,
                                int64_t max_tokens) {
  LatticeWorkload w;
  w.name = "chats";
  w.concurrency = args.concurrency;
  std::vector<int32_t> draws = ZipfDraws(args.chats, args.zipf, args.chat_requests, args.seed);
  // A conversation the law never drew joins at a seeded place: every chat has pages.
  std::mt19937_64 place(args.seed * 6151u);
  for (int32_t c = 0; c < args.chats; ++c) {
    if (std::find(draws.begin(), draws.end(), c) != draws.end()) continue;
    draws.insert(draws.begin() + static_cast<ptrdiff_t>(place() % (draws.size() + 1)), c);
  }
  std::map<int32_t, int32_t> turns_of;
  for (int32_t c : draws) ++turns_of[c];
  // Each chat's script, its turns cut where its history would pass the model's context.
  std::map<int32_t, Conversation> convs;
  std::map<int32_t, int32_t> fits;  // turns that fit
  for (const auto& [c, turns] : turns_of) {
    const Conversation conv = ScriptConversation(
        tokenizer, {turns, args.user_min, args.user_max, args.reply_tokens,
                    args.seed * 7919u + static_cast<uint64_t>(c)});
    int64_t tokens = 0;
    int32_t n = 0;
    for (const std::vector<int32_t>& user : conv.user) {
      tokens += static_cast<int64_t>(user.size()) + args.reply_tokens;
      if (tokens > max_tokens) break;
      ++n;
    }
    if (n == 0) {
      return InvalidArgumentError(fmt::format(
          "chats: one turn ({} tokens) does not fit the model's context of {} tokens: lower "
          "--user-max or --reply", tokens, max_tokens));
    }
    convs.emplace(c, conv);
    fits[c] = n;
  }
  std::vector<ScriptedRequest> order;
  std::map<int32_t, int32_t> next_turn;
  int32_t most_turns = 0;
  for (int32_t c : draws) {
    int32_t& t = next_turn[c];
    if (t >= fits[c]) continue;  // the chat's history is full: its later turns are dropped
    order.push_back({c, convs[c].user[static_cast<size_t>(t)], args.reply_tokens});
    ++t;
    most_turns = std::max(most_turns, t);
  }
  w.description = fmt::format("{} chats, {} turns in Zipf order (s={:.2f}; the busiest chat {} "
                              "turns), user messages {}-{} tokens, replies {} tokens, {} at once",
                              args.chats, order.size(), args.zipf, most_turns, args.user_min,
                              args.user_max, args.reply_tokens, args.concurrency);
  w.rounds = PackRounds(std::move(order), args.concurrency);
  return w;
}

// (b) RAG: every request is a shared system prompt, one of --docs shared documents (drawn by the
// Zipf law: some documents are read by many requests, some by one) and a user's question. The
// system prompt's pages are read by every request, a popular document's by many, an unpopular
// one's once, a question's once.
StatusOr<LatticeWorkload> Rag(const BenchLatticeArgs& args, const Tokenizer& tokenizer) {
  LatticeWorkload w;
  w.name = "rag";
  w.concurrency = args.concurrency;
  std::mt19937_64 system_rng(args.seed * 15485867u);
  std::vector<int32_t> system = {tokenizer.bos()};
  const std::vector<int32_t> system_words =
      Words(tokenizer, "System:", args.system_tokens, &system_rng);
  system.insert(system.end(), system_words.begin(), system_words.end());
  std::vector<std::vector<int32_t>> docs;
  for (int32_t d = 0; d < args.docs; ++d) {
    std::mt19937_64 rng(args.seed * 104729u + static_cast<uint64_t>(d));
    docs.push_back(Words(tokenizer, "\nDocument:", args.doc_tokens, &rng));
  }
  const std::vector<int32_t> doc_of =
      ZipfDraws(args.docs, args.zipf, args.rag_requests, args.seed * 31u + 7u);
  std::vector<ScriptedRequest> order;
  for (int32_t r = 0; r < args.rag_requests; ++r) {
    const int32_t user = r % args.rag_users;
    std::mt19937_64 rng(args.seed * 1299709u + static_cast<uint64_t>(user) * 7727u +
                        static_cast<uint64_t>(r));
    std::vector<int32_t> ids = system;
    const std::vector<int32_t>& doc = docs[static_cast<size_t>(doc_of[static_cast<size_t>(r)])];
    ids.insert(ids.end(), doc.begin(), doc.end());
    const std::vector<int32_t> question =
        Words(tokenizer, fmt::format("\nUser {} asks:", user), args.question_tokens, &rng);
    ids.insert(ids.end(), question.begin(), question.end());
    order.push_back({r, std::move(ids), args.reply_tokens});
  }
  const std::set<int32_t> read(doc_of.begin(), doc_of.end());
  w.description = fmt::format("system prompt of {} tokens, {} documents of {} tokens ({} read, in "
                              "Zipf order), {} questions of {} tokens from {} users, answers {} "
                              "tokens, {} at once",
                              system.size(), args.docs, args.doc_tokens, read.size(),
                              args.rag_requests, args.question_tokens, args.rag_users,
                              args.reply_tokens, args.concurrency);
  w.rounds = PackRounds(std::move(order), args.concurrency);
  return w;
}

// (c) An agent loop: --agents agents share a system prompt (the tools' descriptions), each with
// its own task; at each of --agent-steps steps an agent generates an action and the tool's output
// joins its transcript, which is re-sent whole. The transcript's pages are read at every step;
// the tool outputs grow it in large pieces.
StatusOr<LatticeWorkload> Agent(const BenchLatticeArgs& args, const Tokenizer& tokenizer,
                                int64_t max_tokens) {
  LatticeWorkload w;
  w.name = "agent";
  w.concurrency = args.concurrency;
  std::mt19937_64 system_rng(args.seed * 49979687u);
  std::vector<int32_t> system = {tokenizer.bos()};
  const std::vector<int32_t> tools = Words(tokenizer, "Tools:", args.system_tokens, &system_rng);
  system.insert(system.end(), tools.begin(), tools.end());
  std::vector<ScriptedRequest> order;
  for (int32_t step = 0; step < args.agent_steps; ++step) {
    for (int32_t a = 0; a < args.agents; ++a) {
      std::mt19937_64 rng(args.seed * 86028121u + static_cast<uint64_t>(a) * 104723u +
                          static_cast<uint64_t>(step));
      std::vector<int32_t> ids;
      if (step == 0) {
        ids = system;
        const std::vector<int32_t> task = Words(
            tokenizer, "\nTask:", UniformIn(args.user_min, args.user_max, &rng), &rng);
        ids.insert(ids.end(), task.begin(), task.end());
      } else {
        ids = Words(tokenizer, "\nTool output:", UniformIn(args.tool_min, args.tool_max, &rng),
                    &rng);
      }
      const std::vector<int32_t> action = tokenizer.Encode("\nAction:", false);
      ids.insert(ids.end(), action.begin(), action.end());
      order.push_back({a, std::move(ids), args.reply_tokens});
    }
  }
  std::vector<int64_t> length(static_cast<size_t>(args.agents), 0);
  for (const ScriptedRequest& r : order) {
    int64_t& n = length[static_cast<size_t>(r.stream)];
    n += static_cast<int64_t>(r.append.size()) + r.max_new_tokens;
    if (n > max_tokens) {
      return InvalidArgumentError(fmt::format(
          "agent: a transcript of {} steps reaches {} tokens, past the model's context of {}: "
          "lower --agent-steps, --tool-max or --system-tokens", args.agent_steps, n, max_tokens));
    }
  }
  w.description = fmt::format("{} agents x {} steps: shared tools prompt of {} tokens, actions of "
                              "{} tokens, tool outputs {}-{} tokens, the transcript re-sent at "
                              "each step, {} at once",
                              args.agents, args.agent_steps, system.size(), args.reply_tokens,
                              args.tool_min, args.tool_max, args.concurrency);
  w.rounds = PackRounds(std::move(order), args.concurrency);
  return w;
}

// (d) Long generations: --long-seqs short prompts, each generating --long-tokens at once; the
// pages of the generated text itself outgrow the budget.
StatusOr<LatticeWorkload> Long(const BenchLatticeArgs& args, const Tokenizer& tokenizer) {
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
    w.rounds[0].push_back({s, std::move(ids), args.long_tokens});
  }
  return w;
}

// The distinct tokens of every history at its end: each request's prompt and reply go into a
// trie of token sequences (a reply's tokens are not known before a run, and are its own: each
// stands in as an id no other token has). Also the longest prompt and reply, the context.
void MeasureWorkingSet(LatticeWorkload* w) {
  std::unordered_map<uint64_t, uint32_t> children;  // (node << 32 | token) -> node
  uint32_t nodes = 1;                               // the root
  int64_t next_reply_id = -1;
  std::map<int32_t, std::vector<int64_t>> history;
  for (const std::vector<ScriptedRequest>& round : w->rounds) {
    for (const ScriptedRequest& r : round) {
      std::vector<int64_t>& h = history[r.stream];
      h.insert(h.end(), r.append.begin(), r.append.end());
      for (int32_t i = 0; i < r.max_new_tokens; ++i) h.push_back(next_reply_id--);
      uint32_t node = 0;
      for (int64_t token : h) {
        const uint64_t key = (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(token);
        auto [it, inserted] = children.try_emplace(key, nodes);
        if (inserted) ++nodes;
        node = it->second;
      }
      w->context = std::max<int64_t>(w->context, static_cast<int64_t>(h.size()));
      ++w->requests;
      w->generated_tokens += r.max_new_tokens;
    }
  }
  w->working_set_tokens = nodes - 1;
}

}  // namespace

std::vector<int32_t> ZipfDraws(int32_t n, double s, int32_t count, uint64_t seed) {
  std::vector<double> cumulative(static_cast<size_t>(n));
  double total = 0;
  for (int32_t i = 0; i < n; ++i) {
    total += 1.0 / std::pow(static_cast<double>(i + 1), s);
    cumulative[static_cast<size_t>(i)] = total;
  }
  std::mt19937_64 rng(seed * 2654435761u + 1u);
  std::vector<int32_t> draws;
  for (int32_t k = 0; k < count; ++k) {
    const double u = Uniform(&rng) * total;
    const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
    draws.push_back(static_cast<int32_t>(std::min<ptrdiff_t>(it - cumulative.begin(), n - 1)));
  }
  return draws;
}

StatusOr<LatticeWorkload> MakeLatticeWorkload(const std::string& name,
                                              const BenchLatticeArgs& args,
                                              const Tokenizer& tokenizer, int32_t block_tokens,
                                              int64_t max_context) {
  // One block short of the model's context: the last generated token's row needs its slot.
  const int64_t max_tokens = max_context - block_tokens;
  StatusOr<LatticeWorkload> w = name == "chats"   ? Chats(args, tokenizer, max_tokens)
                                : name == "rag"   ? Rag(args, tokenizer)
                                : name == "agent" ? Agent(args, tokenizer, max_tokens)
                                                  : Long(args, tokenizer);  // validated when parsed
  if (!w.ok()) return w.status();
  MeasureWorkingSet(&*w);
  if (w->context > max_tokens) {
    return InvalidArgumentError(fmt::format(
        "{}: a request needs {} tokens of context, past the model's {} (less a block): lower its "
        "sizes (--doc-tokens, --system-tokens, --long-tokens, ...)",
        name, w->context, max_context));
  }
  w->context = (w->context + block_tokens) / block_tokens * block_tokens;
  return w;
}

}  // namespace kvl::cli
