// Reply splitting: see reply_splitter.h. A small state machine over the text not yet decided:
// before any reasoning, inside it, content, a reply held whole as a possible JSON call, or the
// calls (Hermes and XML-tag calls go out one by one as each closes; other formats are parsed at
// the end).
#include "reply_splitter.h"

#include <algorithm>
#include <random>

namespace kvl::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesClose = "</tool_call>";

// The length of the longest suffix of `text` that is a proper prefix of `marker`: the text a
// stream holds back because the marker may be starting there.
size_t MarkerPrefixAtEnd(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string_view LeftTrim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  return begin == std::string_view::npos ? std::string_view() : s.substr(begin);
}

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

std::string NewToolCallId(ToolCallFormat format) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

ReplySplitter::ReplySplitter(ReplyOptions options)
    : options_(options),
      phase_(options.split_reasoning
                 ? (options.reasoning_open ? Phase::kReasoning : Phase::kStart)
                 : Phase::kContent) {}

ReplyDelta ReplySplitter::Add(std::string_view text) {
  ReplyDelta out;
  pending_ += text;
  Step(&out);
  return out;
}

void ReplySplitter::EmitContent(std::string_view text, ReplyDelta* out) {
  // Content after reasoning begins at its first non-space (the template's "\n\n" after
  // </think>); a reply without reasoning is sent as it is.
  if (after_reasoning_) text = LeftTrim(text);
  if (text.empty()) return;
  after_reasoning_ = false;
  content_started_ = true;
  out->content += text;
}

void ReplySplitter::EmitCall(const ParsedToolCall& call, ReplyDelta* out) {
  if (!options_.parallel && calls_sent_ > 0) return;
  ReplyToolCall c;
  c.index = calls_sent_++;
  const bool own_id = options_.format == ToolCallFormat::kMistral && call.id.size() == 9 &&
                      std::all_of(call.id.begin(), call.id.end(), IsIdChar);
  c.id = own_id ? call.id : NewToolCallId(options_.format);
  c.name = call.name;
  c.arguments = call.arguments;
  out->calls.push_back(std::move(c));
}

// Every <tool_call>...</tool_call> complete in pending_ goes out; text between them is kept
// for the end.
void ReplySplitter::TakeCompleteHermesCalls(ReplyDelta* out) {
  const std::string_view opener = ToolCallOpener(options_.format);
  for (;;) {
    const size_t open = pending_.find(opener);
    if (open == std::string::npos) return;
    const size_t close = pending_.find(kHermesClose, open + opener.size());
    if (close == std::string::npos) return;
    const size_t end = close + kHermesClose.size();
    const ParsedReply parsed =
        ParseToolCalls(std::string_view(pending_).substr(open, end - open), options_.format,
                       &options_.parameter_types);
    tail_ += pending_.substr(0, open);
    if (parsed.tool_calls.size() == 1) {
      EmitCall(parsed.tool_calls[0], out);
    } else {
      tail_ += pending_.substr(open, end - open);  // not a call: text
    }
    pending_.erase(0, end);
  }
}

void ReplySplitter::Step(ReplyDelta* out) {
  for (;;) {
    switch (phase_) {
      case Phase::kStart: {
        const std::string_view text = LeftTrim(pending_);
        if (text.empty()) return;
        if (text.starts_with(kThinkOpen)) {
          pending_ = std::string(text.substr(kThinkOpen.size()));
          phase_ = Phase::kReasoning;
          continue;
        }
        if (kThinkOpen.starts_with(text)) return;  // may still become <think>
        phase_ = Phase::kContent;
        continue;
      }
      case Phase::kReasoning: {
        const size_t close = pending_.find(kThinkClose);
        if (close == std::string::npos) {
          const size_t keep = MarkerPrefixAtEnd(pending_, kThinkClose);
          std::string_view sendable = std::string_view(pending_).substr(0, pending_.size() - keep);
          if (out->reasoning.empty() && reasoning_sent_ == 0) sendable = LeftTrim(sendable);
          reasoning_sent_ += sendable.size();
          out->reasoning += sendable;
          pending_.erase(0, pending_.size() - keep);
          return;
        }
        std::string_view sendable = std::string_view(pending_).substr(0, close);
        if (out->reasoning.empty() && reasoning_sent_ == 0) sendable = LeftTrim(sendable);
        reasoning_sent_ += sendable.size();
        out->reasoning += sendable;
        pending_.erase(0, close + kThinkClose.size());
        after_reasoning_ = true;
        phase_ = Phase::kContent;
        continue;
      }
      case Phase::kContent: {
        if (!options_.parse_tools) {
          EmitContent(pending_, out);
          pending_.clear();
          return;
        }
        if (!content_started_ && CallMayStartWithJson(options_.format)) {
          const std::string_view text = LeftTrim(pending_);
          if (text.empty()) return;
          if (text.front() == '{') {
            phase_ = Phase::kHeldJson;
            return;
          }
        }
        const std::string_view opener = ToolCallOpener(options_.format);
        if (opener.empty()) {
          EmitContent(pending_, out);
          pending_.clear();
          return;
        }
        const size_t at = pending_.find(opener);
        if (at != std::string::npos) {
          EmitContent(std::string_view(pending_).substr(0, at), out);
          pending_.erase(0, at);
          phase_ = Phase::kCalls;
          continue;
        }
        const size_t keep = MarkerPrefixAtEnd(pending_, opener);
        EmitContent(std::string_view(pending_).substr(0, pending_.size() - keep), out);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Phase::kHeldJson:
        return;  // decided at the end
      case Phase::kCalls:
        if (options_.format == ToolCallFormat::kHermes ||
            options_.format == ToolCallFormat::kXmlFunction) {
          TakeCompleteHermesCalls(out);
        }
        return;
    }
  }
}

ReplyDelta ReplySplitter::Finish() {
  ReplyDelta out;
  Step(&out);
  switch (phase_) {
    case Phase::kStart:
    case Phase::kContent:
      EmitContent(pending_, &out);
      break;
    case Phase::kReasoning:
      // A reply cut off inside its reasoning: all of it is reasoning, as llama.cpp reads it.
      out.reasoning += reasoning_sent_ == 0 ? LeftTrim(pending_) : std::string_view(pending_);
      break;
    case Phase::kHeldJson:
    case Phase::kCalls: {
      const ParsedReply parsed =
          ParseToolCalls(pending_, options_.format, &options_.parameter_types);
      if (parsed.tool_calls.empty() && calls_sent_ == 0) {
        // No call after all: the held text goes on from the content sent, as it was written.
        EmitContent(tail_ + pending_, &out);
        break;
      }
      if (parsed.tool_calls.empty()) {
        tail_ += pending_;
      } else {
        for (const ParsedToolCall& call : parsed.tool_calls) EmitCall(call, &out);
        tail_ += parsed.content;
      }
      const std::string_view tail = TrimSpace(tail_);
      if (!tail.empty()) {
        if (content_started_) out.content += "\n";
        EmitContent(tail, &out);
      }
      break;
    }
  }
  pending_.clear();
  tail_.clear();
  return out;
}

ReplyDelta SplitReply(std::string_view text, const ReplyOptions& options) {
  ReplySplitter splitter(options);
  ReplyDelta all = splitter.Add(text);
  ReplyDelta rest = splitter.Finish();
  all.reasoning += rest.reasoning;
  all.content += rest.content;
  for (ReplyToolCall& call : rest.calls) all.calls.push_back(std::move(call));
  return all;
}

}  // namespace kvl::server
