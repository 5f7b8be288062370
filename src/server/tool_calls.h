// Tool calls parsed out of a model's reply (issue 42, item 1), in the formats of the model
// families the server loads, as llama.cpp's chat parser reads them:
// - Hermes (Qwen2.5, Qwen3): <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any
//   number of them, with text around them as the content;
// - Llama 3.x: the whole reply one JSON object {"name": ..., "parameters": {...}} (also with
//   "type": "function", or "arguments" for "parameters"), or <|python_tag|> followed by such an
//   object, by `tool.call(key="value", ...)` (a built-in tool) or by code (the python tool);
// - Mistral / Nemo: [TOOL_CALLS] followed by a JSON array of {"name", "arguments", "id"}.
// - XML function tags (Qwen3-Coder, Qwen3.5): <tool_call><function=NAME><parameter=KEY>VALUE
//   </parameter>...</function></tool_call>, newlines around each part; a value is the text
//   itself where the tool declares the parameter a string (or declares nothing and the text is
//   not JSON), else the JSON the template wrote with `tojson` / `string`.
// - any other family (kNone): the whole reply one JSON object, a call {"name", "arguments"}, or
//   llama.cpp's generic {"tool_call": {...}} / {"tool_calls": [...]}.
// A reply that does not hold a well-formed call in its format is content, whole: a model that
// wrote half a call has answered in text. reply_splitter.h applies these to replies, streamed
// or not.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvl::server {

enum class ToolCallFormat { kNone, kHermes, kXmlFunction, kLlama3, kMistral };

// The format a chat template writes tool calls in, from the markers it contains; kNone when it
// names none.
ToolCallFormat DetectToolCallFormat(std::string_view chat_template);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object as text, compact (OpenAI sends it as a string)
  std::string id;         // the model's own id where the format has one (Mistral), else empty
};

struct ParsedReply {
  std::string content;  // the text that is not a call (trimmed where calls were cut out)
  std::vector<ParsedToolCall> tool_calls;
};

// The JSON types a request's tools declare for their parameters: function name -> parameter
// name -> "string", "integer", "boolean", ... (the schema's "type"; absent where it names none).
// The XML-tag format writes values as bare text, and the type decides how a value reads back.
using ToolParameterTypes = std::map<std::string, std::map<std::string, std::string>, std::less<>>;

// `types`: the request's tools' parameter types, or null (values are read as JSON where they
// parse as JSON, else as text).
ParsedReply ParseToolCalls(std::string_view text, ToolCallFormat format,
                           const ToolParameterTypes* types = nullptr);

// The text that opens a call in `format` ("<tool_call>" for both Hermes and XML function tags,
// "<|python_tag|>", "[TOOL_CALLS]"), ""
// for kNone. A stream holds back text from where it may begin.
std::string_view ToolCallOpener(ToolCallFormat format);
// Whether a reply that starts with "{" may be a call (Llama 3.x, kNone): such a reply is held
// back whole until it ends.
bool CallMayStartWithJson(ToolCallFormat format);

std::string_view TrimSpace(std::string_view s);

}  // namespace kvl::server
