// `kvl bench lattice`'s flags and their validation (the command: cmd_bench_lattice.cc). The
// engine flags it honours are the shared groups of command_flags.h.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "command_flags.h"
#include "kvl/engine.h"

namespace kvl::cli {

CommandFlags DeclareBenchLatticeFlags(CLI::App* bench, BenchLatticeArgs* bl) {
  CLI::App* cmd = bench->add_subcommand(
      "lattice", "auto against every fixed KV policy at 1/8, 1/4 and 1/2 of keep-all's peak KV, "
                 "on concurrent chats, shared long prefixes and long generations: tok/s, TTFT, "
                 "agreement and KLD against keep-all");
  cmd->add_option("-m,--model", bl->engine.model_path, "GGUF model file")->required();
  cmd->add_option("--workloads", bl->workloads, "chats, rag, long")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--policies", bl->policies,
                  "auto and the fixed --kv-policy values to compare (keep, compress, "
                  "compress-int4, demote, recompute-residual, recompute-tokens, evict)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--budgets", bl->budgets, "KV budgets as fractions of keep-all's peak")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--chats", bl->chats, "chats at once (and RAG requests at once)")
      ->capture_default_str();
  cmd->add_option("--turns", bl->turns, "turns of each chat")->capture_default_str();
  cmd->add_option("--user-min", bl->user_min, "fewest tokens in a user message")
      ->capture_default_str();
  cmd->add_option("--user-max", bl->user_max, "most tokens in a user message")
      ->capture_default_str();
  cmd->add_option("--reply", bl->reply_tokens, "greedy tokens per chat reply and RAG answer")
      ->capture_default_str();
  cmd->add_option("--docs", bl->docs, "RAG: documents (shared prefixes)")->capture_default_str();
  cmd->add_option("--doc-tokens", bl->doc_tokens, "RAG: tokens per document")
      ->capture_default_str();
  cmd->add_option("--questions", bl->questions, "RAG: questions per document")
      ->capture_default_str();
  cmd->add_option("--question-tokens", bl->question_tokens, "RAG: tokens per question")
      ->capture_default_str();
  cmd->add_option("--long-seqs", bl->long_seqs, "long generations at once")
      ->capture_default_str();
  cmd->add_option("--long-tokens", bl->long_tokens, "tokens each long generation makes")
      ->capture_default_str();
  cmd->add_option("--runs", bl->runs, "runs of each cell, each in a fresh engine, in rounds "
                                      "that alternate the cells' order (the median by tok/s is "
                                      "kept; the range is shown)")
      ->capture_default_str();
  cmd->add_option("--json", bl->json_path, "write every cell as JSON (scripts/plots.py lattice)");
  std::function<Status()> seed = AddSeedFlag(cmd, "--seed", "the scripted texts' seed (default 1)",
                                             &bl->seed);
  AddComputeFlags(cmd, &bl->engine);
  cmd->get_option("--ctx-size")
      ->description("ignored: each workload's context is what its longest request needs");
  AddCacheTypeFlags(cmd, &bl->engine);
  AddKvProfileFlags(cmd, &bl->engine);
  AddKvReserveFlags(cmd, &bl->engine);
  cmd->add_flag("--explain", bl->engine.explain,
                "print every KV decision with its cost terms (best with one policy, one budget)");
  return {cmd, ParsedCommand::Kind::kBenchLattice, [bl, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            return ValidateBenchLatticeArgs(*bl);
          }};
}

namespace {

// Each entry of a list flag known and given once.
Status CheckNames(std::string_view flag, const std::vector<std::string>& given,
                  std::initializer_list<std::string_view> known) {
  if (given.empty()) return InvalidArgumentError(fmt::format("{} must not be empty", flag));
  std::set<std::string> seen;
  for (const std::string& g : given) {
    if (std::find(known.begin(), known.end(), g) == known.end()) {
      return InvalidArgumentError(
          fmt::format("{}: unknown '{}' (use {})", flag, g, fmt::join(known, ", ")));
    }
    if (!seen.insert(g).second) {
      return InvalidArgumentError(fmt::format("{}: '{}' is given twice", flag, g));
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateBenchLatticeArgs(const BenchLatticeArgs& args) {
  constexpr int64_t kMaxTokens = kMaxContextTokens / 4;
  KVL_RETURN_IF_ERROR(CheckNames("--workloads", args.workloads, {"chats", "rag", "long"}));
  KVL_RETURN_IF_ERROR(CheckNames("--policies", args.policies,
                                 {"auto", "keep", "compress", "compress-int4", "demote",
                                  "recompute-residual", "recompute-tokens", "evict"}));
  if (args.budgets.empty()) return InvalidArgumentError("--budgets must not be empty");
  for (double b : args.budgets) {
    if (!(b > 0 && b <= 1)) {
      return InvalidArgumentError(fmt::format("--budgets: each must be in (0, 1], got {}", b));
    }
  }
  KVL_RETURN_IF_ERROR(CheckRange("--chats", args.chats, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--turns", args.turns, 1, 1000));
  KVL_RETURN_IF_ERROR(CheckRange("--user-min", args.user_min, 8, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--user-max", args.user_max, args.user_min, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--reply", args.reply_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--docs", args.docs, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--doc-tokens", args.doc_tokens, 8, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--questions", args.questions, 1, 1000));
  KVL_RETURN_IF_ERROR(CheckRange("--question-tokens", args.question_tokens, 4, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--long-seqs", args.long_seqs, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--long-tokens", args.long_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--runs", args.runs, 1, 100));
  KVL_RETURN_IF_ERROR(CheckOutputFile("--json", args.json_path));
  EngineOptions engine = args.engine;
  engine.max_seqs = std::max(args.chats, args.long_seqs);
  return ValidateEngineOptions(engine);
}

}  // namespace kvl::cli
