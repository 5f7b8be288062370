// `kvl bench lattice`'s flags and their validation (the command: cmd_bench_lattice.cc). The
// engine flags it honours are the shared groups of command_flags.h.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <vector>

#include "command_flags.h"
#include "kvl/engine.h"

namespace kvl::cli {
namespace {

// The policies the bench knows: `auto` and the fixed ones it compares it with. demote-redis runs
// only where the engine has it and the Redis link starts (else its cells are skipped, with why).
const std::vector<std::string_view> kPolicies = {
    "auto",          "keep",          "demote-disk",        "demote-redis",     "compress",
    "compress-int4", "recompute-residual", "recompute-tokens", "evict",         "demote"};

// --quick: a size the command line did not give takes its small value, so that the whole bench
// (four workloads, every policy, every budget) runs in well under a minute on stories260K.
void ApplyQuickSizes(const CLI::App* cmd, BenchLatticeArgs* bl) {
  auto quick = [&](const char* flag, auto* value, auto small) {
    if (cmd->count(flag) == 0) *value = small;
  };
  // Many short streams, two at a time: a quarter of the working set then still holds a
  // running sequence's pages, as a quarter of the full sizes does.
  quick("--concurrency", &bl->concurrency, 2);
  quick("--chats", &bl->chats, 8);
  quick("--chat-requests", &bl->chat_requests, 16);
  quick("--user-min", &bl->user_min, 16);
  quick("--user-max", &bl->user_max, 20);
  quick("--reply", &bl->reply_tokens, 8);
  quick("--system-tokens", &bl->system_tokens, 16);
  quick("--doc-tokens", &bl->doc_tokens, 24);
  quick("--rag-users", &bl->rag_users, 4);
  quick("--rag-requests", &bl->rag_requests, 12);
  quick("--question-tokens", &bl->question_tokens, 8);
  quick("--agents", &bl->agents, 4);
  quick("--agent-steps", &bl->agent_steps, 3);
  quick("--tool-min", &bl->tool_min, 12);
  quick("--tool-max", &bl->tool_max, 20);
  quick("--long-seqs", &bl->long_seqs, 4);
  quick("--long-tokens", &bl->long_tokens, 48);
}

}  // namespace

CommandFlags DeclareBenchLatticeFlags(CLI::App* bench, BenchLatticeArgs* bl) {
  CLI::App* cmd = bench->add_subcommand(
      "lattice", "auto against every fixed KV policy under one budget and the same lower tiers, "
                 "at 1/8, 1/4 and 1/2 of each workload's working set, on skewed chats, RAG, an "
                 "agent loop and long generations: tok/s, CPU tok/s, top-1 and KLD against "
                 "keep-all, RSS less the weights against the budget");
  cmd->add_option("-m,--model", bl->engine.model_path,
                  "GGUF model file (quality is judged on a trained one: models/kvl-doc-12m.gguf)")
      ->required();
  cmd->add_option("--workloads", bl->workloads, "chats, rag, agent, long")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--policies", bl->policies,
                  "auto and the fixed --kv-policy values to compare (keep, demote-disk, "
                  "demote-redis, compress, compress-int4, recompute-residual, recompute-tokens, "
                  "evict, demote)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--budgets", bl->budgets, "KV budgets as fractions of each working set")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--auto-quality", bl->auto_quality,
                  "the quality auto runs at: lossless, balanced, aggressive")
      ->capture_default_str();
  cmd->add_flag("--quick", bl->quick,
                "small sizes for every size flag not given (a smoke test in under a minute)");
  cmd->add_option("--concurrency", bl->concurrency, "requests at once (chats, rag, agent)")
      ->capture_default_str();
  cmd->add_option("--chats", bl->chats, "chats: conversations")->capture_default_str();
  cmd->add_option("--chat-requests", bl->chat_requests,
                  "chats: turns in all, drawn among the conversations by a Zipf law")
      ->capture_default_str();
  cmd->add_option("--zipf", bl->zipf, "the Zipf exponent of the chats' and documents' draws")
      ->capture_default_str();
  cmd->add_option("--user-min", bl->user_min, "fewest tokens in a user message (and agent task)")
      ->capture_default_str();
  cmd->add_option("--user-max", bl->user_max, "most tokens in a user message (and agent task)")
      ->capture_default_str();
  cmd->add_option("--reply", bl->reply_tokens,
                  "greedy tokens per chat reply, RAG answer and agent action")
      ->capture_default_str();
  cmd->add_option("--system-tokens", bl->system_tokens,
                  "rag and agent: tokens of the shared system prompt")
      ->capture_default_str();
  cmd->add_option("--docs", bl->docs, "rag: shared documents")->capture_default_str();
  cmd->add_option("--doc-tokens", bl->doc_tokens, "rag: tokens per document")
      ->capture_default_str();
  cmd->add_option("--rag-users", bl->rag_users, "rag: users asking")->capture_default_str();
  cmd->add_option("--rag-requests", bl->rag_requests, "rag: questions in all")
      ->capture_default_str();
  cmd->add_option("--question-tokens", bl->question_tokens, "rag: tokens per question")
      ->capture_default_str();
  cmd->add_option("--agents", bl->agents, "agent: agents")->capture_default_str();
  cmd->add_option("--agent-steps", bl->agent_steps, "agent: steps of each")
      ->capture_default_str();
  cmd->add_option("--tool-min", bl->tool_min, "agent: fewest tokens of a tool's output")
      ->capture_default_str();
  cmd->add_option("--tool-max", bl->tool_max, "agent: most tokens of a tool's output")
      ->capture_default_str();
  cmd->add_option("--long-seqs", bl->long_seqs, "long generations at once")
      ->capture_default_str();
  cmd->add_option("--long-tokens", bl->long_tokens, "tokens each long generation makes")
      ->capture_default_str();
  cmd->add_option("--runs", bl->runs, "runs of each cell, each in a fresh engine, in rounds "
                                      "that alternate the cells' order (the median by tok/s is "
                                      "kept; the range is shown)")
      ->capture_default_str();
  cmd->add_option("--kv-tier", bl->disk_tier,
                  "disk:PATH:SIZE[:direct]: the disk tier every cell uses, started empty for "
                  "each (default: a scratch file in TMPDIR)");
  cmd->add_option("--redis-script", bl->redis_script,
                  "the script that starts Redis behind a shaped link (default: "
                  "scripts/redis-netns.sh)");
  cmd->add_option("--redis-rate", bl->redis_rate, "the Redis link's rate: 1gbit, 10gbit")
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
  return {cmd, ParsedCommand::Kind::kBenchLattice, [cmd, bl, seed]() -> Status {
            KVL_RETURN_IF_ERROR(seed());
            if (bl->quick) ApplyQuickSizes(cmd, bl);
            return ValidateBenchLatticeArgs(*bl);
          }};
}

namespace {

// Each entry of a list flag known and given once.
Status CheckNames(std::string_view flag, const std::vector<std::string>& given,
                  const std::vector<std::string_view>& known) {
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
  KVL_RETURN_IF_ERROR(CheckNames("--workloads", args.workloads, {"chats", "rag", "agent", "long"}));
  KVL_RETURN_IF_ERROR(CheckNames("--policies", args.policies, kPolicies));
  if (args.budgets.empty()) return InvalidArgumentError("--budgets must not be empty");
  for (double b : args.budgets) {
    if (!(b > 0 && b <= 1)) {
      return InvalidArgumentError(fmt::format("--budgets: each must be in (0, 1], got {}", b));
    }
  }
  if (!ParseKvQuality(args.auto_quality).ok()) {
    return InvalidArgumentError(fmt::format(
        "--auto-quality: unknown '{}' (use lossless, balanced, aggressive)", args.auto_quality));
  }
  KVL_RETURN_IF_ERROR(CheckRange("--concurrency", args.concurrency, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--chats", args.chats, 1, 1024));
  KVL_RETURN_IF_ERROR(CheckRange("--chat-requests", args.chat_requests, 1, 100000));
  if (!(args.zipf >= 0 && args.zipf <= 8)) {
    return InvalidArgumentError(fmt::format("--zipf must be in [0, 8], got {}", args.zipf));
  }
  KVL_RETURN_IF_ERROR(CheckRange("--user-min", args.user_min, 8, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--user-max", args.user_max, args.user_min, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--reply", args.reply_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--system-tokens", args.system_tokens, 0, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--docs", args.docs, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--doc-tokens", args.doc_tokens, 8, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--rag-users", args.rag_users, 1, 100000));
  KVL_RETURN_IF_ERROR(CheckRange("--rag-requests", args.rag_requests, 1, 100000));
  KVL_RETURN_IF_ERROR(CheckRange("--question-tokens", args.question_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--agents", args.agents, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--agent-steps", args.agent_steps, 1, 1000));
  KVL_RETURN_IF_ERROR(CheckRange("--tool-min", args.tool_min, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--tool-max", args.tool_max, args.tool_min, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--long-seqs", args.long_seqs, 1, 256));
  KVL_RETURN_IF_ERROR(CheckRange("--long-tokens", args.long_tokens, 1, kMaxTokens));
  KVL_RETURN_IF_ERROR(CheckRange("--runs", args.runs, 1, 100));
  if (!args.disk_tier.empty()) {
    StatusOr<TierSpec> spec = ParseTierSpec(args.disk_tier);
    if (!spec.ok()) {
      return InvalidArgumentError(fmt::format("--kv-tier: {}", spec.status().message()));
    }
    if (spec->kind != TierKind::kDisk) {
      return InvalidArgumentError(fmt::format(
          "--kv-tier: the bench takes a disk tier (disk:PATH:SIZE), got '{}'", args.disk_tier));
    }
  }
  if (args.redis_rate != "1gbit" && args.redis_rate != "10gbit") {
    return InvalidArgumentError(
        fmt::format("--redis-rate: unknown '{}' (use 1gbit, 10gbit)", args.redis_rate));
  }
  KVL_RETURN_IF_ERROR(CheckOutputFile("--json", args.json_path));
  EngineOptions engine = args.engine;
  engine.max_seqs = std::max(args.concurrency, args.long_seqs);
  return ValidateEngineOptions(engine);
}

}  // namespace kvl::cli
