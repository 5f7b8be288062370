// A chat reply's text split into what OpenAI's clients read apart (issue 42): the reasoning
// (`<think>...</think>`, as Qwen3 and DeepSeek-R1 write it) into `reasoning_content`, tool
// calls in the template family's format (tool_calls.h) into `tool_calls`, and the rest as
// `content`. One splitter serves a streamed reply, fed text as it arrives and answering each
// time with what may go out now, and a plain one, fed the whole text at once: both split alike.
//
// A stream never sends text it may have to take back: text that may be the start of `</think>`
// or of a call's opener is held until it is decided (as llama-server and vLLM hold it), a reply
// that may be a JSON call (Llama 3.x, families with no call syntax) is held whole, and a call
// goes out once it is complete: its index, id and name in one delta, its arguments in the next.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tool_calls.h"

namespace kvl::server {

struct ReplyOptions {
  bool parse_tools = false;  // the request has tools and tool_choice is not "none"
  ToolCallFormat format = ToolCallFormat::kNone;
  ToolParameterTypes parameter_types;  // the tools' (how XML-tag calls' values read back)
  bool parallel = true;          // parallel_tool_calls: false keeps only the first call
  bool split_reasoning = false;  // reasoning_format other than "none"
  bool reasoning_open = false;   // the prompt ends inside <think> (the reply starts in it)
  bool active() const { return parse_tools || split_reasoning; }
};

struct ReplyToolCall {
  int index = 0;
  std::string id;  // call_... (Mistral: 9 letters and digits, as its template demands)
  std::string name;
  std::string arguments;  // a JSON object as text
};

// What may go out after one piece of text.
struct ReplyDelta {
  std::string reasoning;
  std::string content;
  std::vector<ReplyToolCall> calls;  // complete calls, in order
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class ReplySplitter {
 public:
  explicit ReplySplitter(ReplyOptions options);
  ReplyDelta Add(std::string_view text);
  // The end of the reply: whatever was held, decided.
  ReplyDelta Finish();
  int calls_sent() const { return calls_sent_; }

 private:
  enum class Phase { kStart, kReasoning, kContent, kHeldJson, kCalls };
  void Step(ReplyDelta* out);
  void EmitContent(std::string_view text, ReplyDelta* out);
  void EmitCall(const ParsedToolCall& call, ReplyDelta* out);
  void TakeCompleteHermesCalls(ReplyDelta* out);

  ReplyOptions options_;
  Phase phase_;
  std::string pending_;  // text not yet decided
  bool content_started_ = false;
  bool after_reasoning_ = false;  // </think> went by and no content since
  size_t reasoning_sent_ = 0;  // bytes of reasoning given out so far
  std::string tail_;  // Hermes: text between and after calls, sent as content at the end
  int calls_sent_ = 0;
};

// The whole reply at once (a plain answer): the sum of what Add and Finish give.
ReplyDelta SplitReply(std::string_view text, const ReplyOptions& options);

// A new call id: "call_" and 24 letters and digits, or 9 of them for Mistral's templates.
std::string NewToolCallId(ToolCallFormat format);

}  // namespace kvl::server
