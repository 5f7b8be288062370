// kvl chat: a terminal chat through the chat template the server uses. The whole conversation is
// kept and resubmitted, templated, every turn, so the engine's prefix cache carries the history
// and each turn computes only what is new ("cached N of M prompt tokens" on stderr says how much).
// Replies stream to stdout; with -f the user's turns come from a file, one a line.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "kvl/chat_template.h"
#include "kvl/user_file.h"
#include "options.h"

namespace kvl::cli {
namespace {

constexpr int64_t kMaxTurnsFileBytes = 64ll << 20;

class ChatSession {
 public:
  ChatSession(Engine& engine, const ChatArgs& args, ChatFormatter tmpl)
      : engine_(engine), args_(args), template_(std::move(tmpl)) {
    Reset();
  }

  void Reset() {
    messages_.clear();
    if (!args_.system.empty()) messages_.push_back({"system", args_.system});
  }

  // One user turn: the reply streamed to stdout. An error (the history no longer fits the
  // context, output that cannot be written) leaves the history as it was before the turn.
  Status Turn(const std::string& user_text) {
    messages_.push_back({"user", user_text});
    Status s = Reply();
    if (!s.ok()) messages_.pop_back();
    return s;
  }

  // /stats: the engine's KV pool and prefix cache, each KV tier's contents and traffic, and what
  // the KV lattice did to pages.
  Status PrintStats() const {
    const EngineMetrics m = engine_.Metrics();
    fmt::print("kv pool: {} of {} blocks used ({} cached), peak {}\n", m.kv.blocks_used,
               m.kv.blocks_total, m.kv.blocks_cached, m.kv.blocks_used_peak);
    fmt::print("prefix cache: {} of {} prompt tokens hit\n", m.kv.prefix_hit_tokens,
               m.kv.prefix_query_tokens);
    for (const KvTierMetrics& t : m.kv_tiers) {
      fmt::print(
          "tier {}: {} of {} used, {} pages; written {} pages ({}), read {} pages ({}); "
          "prefix lookups {}, hits {} blocks ({} tokens), promoted {} blocks; "
          "checksum failures {}, evictions {}, errors {}\n",
          t.name, FormatBytes(t.bytes_used), FormatBytes(t.capacity_bytes), t.pages, t.pages_in,
          FormatBytes(t.bytes_in), t.pages_out, FormatBytes(t.bytes_out), t.lookups, t.hit_blocks,
          t.hit_tokens, t.blocks_promoted, t.checksum_failures, t.evictions, t.errors);
    }
    if (m.kv_tiers.empty()) fmt::print("kv tiers: none (--kv-tier adds one)\n");
    fmt::print("pages per action:");
    for (int a = 0; a < kNumKvActions; ++a) {
      fmt::print(" {}={}", KvActionName(static_cast<KvAction>(a)),
                 m.kv_actions[static_cast<size_t>(a)].pages);
    }
    fmt::print("\nrequests: {}, tokens prefilled {}, generated {}, messages in history {}\n",
               m.requests_finished, m.tokens_prefilled, m.tokens_generated, messages_.size());
    return FlushStdout();
  }

 private:
  Status Reply() {
    KVL_ASSIGN_OR_RETURN(std::string prompt, ApplyChatTemplate(template_, messages_));
    GenerateRequest request;
    request.prompt = std::move(prompt);
    request.parse_special = true;  // the template's control tokens are tokens, not text
    request.max_new_tokens = args_.num_predict;
    request.sampling = args_.sampling;
    int64_t printed = 0;
    bool delivered = true;
    StatusOr<GenerateResult> result =
        engine_.Generate(request, [&](int32_t, std::string_view piece) {
          if (args_.num_predict >= 0 && printed >= args_.num_predict) return false;
          ++printed;
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          delivered = FlushStdout().ok();
          return delivered;
        });
    if (!result.ok()) return result.status();
    if (!delivered) return FlushStdout();
    std::fputc('\n', stdout);
    KVL_RETURN_IF_ERROR(FlushStdout());
    const GenerateStats& st = result->stats;
    fmt::print(stderr, "kvl: cached {} of {} prompt tokens; {} generated ({}), {:.2f} ms\n",
               st.cached_prompt_tokens, st.prompt_tokens, st.generated_tokens,
               result->stop_reason, st.prompt_ms + st.generate_ms);
    messages_.push_back({"assistant", result->text});
    return Status::Ok();
  }

  Engine& engine_;
  const ChatArgs& args_;
  ChatFormatter template_;
  std::vector<ChatMessage> messages_;
};

enum class LineResult { kContinue, kExit, kError };

// One line the user typed: a command or a turn.
LineResult HandleLine(ChatSession& chat, std::string line, bool from_file) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.empty()) return LineResult::kContinue;
  if (line == "/exit" || line == "/quit") return LineResult::kExit;
  if (line == "/reset") {
    chat.Reset();
    fmt::print(stderr, "kvl: history cleared\n");
    return LineResult::kContinue;
  }
  if (line == "/stats") {
    if (const Status s = chat.PrintStats(); !s.ok()) {
      fmt::print(stderr, "kvl: {}\n", s.message());
      return LineResult::kError;
    }
    return LineResult::kContinue;
  }
  if (line.starts_with('/') && line.find(' ') == std::string::npos) {
    fmt::print(stderr, "kvl: unknown command '{}' (commands: /reset, /stats, /exit)\n", line);
    return from_file ? LineResult::kError : LineResult::kContinue;
  }
  if (const Status s = chat.Turn(line); !s.ok()) {
    if (std::ferror(stdout) != 0) return LineResult::kError;  // Main reports the write error
    fmt::print(stderr, "kvl: {}{}\n", s.ToString(),
               from_file ? "" : " (the turn was dropped; /reset starts a new conversation)");
    return from_file ? LineResult::kError : LineResult::kContinue;
  }
  return LineResult::kContinue;
}

}  // namespace

int ChatCommand(const ChatArgs& args) {
  StatusOr<EngineOptions> options = ChatEngineOptions(args);  // validated when parsed; cheap
  if (!options.ok()) {
    fmt::print(stderr, "kvl: {}\n", options.status().message());
    return 1;
  }
  std::vector<std::string> turns;
  const bool from_file = !args.turns_file.empty();
  if (from_file) {
    StatusOr<std::string> contents =
        ReadUserFile(args.turns_file, "turns file", kMaxTurnsFileBytes);
    if (!contents.ok()) {
      fmt::print(stderr, "kvl: {}\n", contents.status().message());
      return 1;
    }
    std::istringstream text(*contents);
    for (std::string line; std::getline(text, line);) turns.push_back(line);
  }
  StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*options);
  if (!engine.ok()) {
    fmt::print(stderr, "kvl: {}\n", engine.status().ToString());
    return 1;
  }
  Engine& e = **engine;
  std::string fallback_reason;
  StatusOr<ChatFormatter> formatter =
      LoadChatFormatter(e, {args.chat_template, args.chat_template_file, args.chat_template_limits},
                        &fallback_reason);
  if (!formatter.ok()) {
    fmt::print(stderr, "kvl: {}\n", formatter.status().ToString());
    return 1;
  }
  if (!fallback_reason.empty()) {
    fmt::print(stderr, "kvl: {}; using the built-in chat template '{}'\n", fallback_reason,
               formatter->description());
  }
  const bool interactive = !from_file && isatty(STDIN_FILENO) != 0;
  fmt::print(stderr, "kvl: model {}, context {}, chat template {}{}\n", e.model().config().name,
             e.context_length(), formatter->description(),
             interactive ? "; /reset, /stats, /exit (or Ctrl-D)" : "");
  ChatSession chat(e, args, std::move(*formatter));
  if (from_file) {
    for (const std::string& line : turns) {
      const LineResult r = HandleLine(chat, line, /*from_file=*/true);
      if (r == LineResult::kError) return 1;
      if (r == LineResult::kExit) break;
    }
    return 0;
  }
  for (;;) {
    if (interactive) {
      std::fputs("> ", stdout);
      if (!FlushStdout().ok()) return 1;
    }
    std::string line;
    if (!std::getline(std::cin, line)) break;  // EOF quits
    const LineResult r = HandleLine(chat, line, /*from_file=*/false);
    if (r == LineResult::kError) return 1;
    if (r == LineResult::kExit) break;
  }
  if (interactive) std::fputc('\n', stdout);
  return 0;
}

}  // namespace kvl::cli
