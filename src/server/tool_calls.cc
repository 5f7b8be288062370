// Tool-call parsing: see tool_calls.h. Each format is a small reader over the reply's text;
// JSON is parsed by nlohmann's (no exceptions), so a malformed call is content, never an error.
#include "tool_calls.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

namespace kvl::server {
namespace {

using json = nlohmann::ordered_json;

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

// A call from {"name": ..., <arguments_key>: {...}}; nullopt when it is not one.
std::optional<ParsedToolCall> CallFromObject(const json& object) {
  if (!object.is_object() || !object.contains("name") || !object["name"].is_string()) {
    return std::nullopt;
  }
  ParsedToolCall call;
  call.name = object["name"].get<std::string>();
  const json* args = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    if (object.contains(key)) args = &object[key];
  }
  if (args == nullptr) {
    call.arguments = "{}";
  } else if (args->is_string()) {
    // Some models write the arguments as a JSON string holding the object.
    const json inner = json::parse(args->get<std::string>(), nullptr, false);
    if (!inner.is_object()) return std::nullopt;
    call.arguments = inner.dump();
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else {
    return std::nullopt;
  }
  if (object.contains("id") && object["id"].is_string()) call.id = object["id"].get<std::string>();
  return call;
}

ParsedReply AsContent(std::string_view text) { return ParsedReply{std::string(text), {}}; }

}  // namespace

std::string_view TrimSpace(std::string_view s) { return Trim(s); }

std::string_view ToolCallOpener(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kXmlFunction: return "<tool_call>";
    case ToolCallFormat::kLlama3: return "<|python_tag|>";
    case ToolCallFormat::kMistral: return "[TOOL_CALLS]";
    case ToolCallFormat::kNone: break;
  }
  return {};
}

bool CallMayStartWithJson(ToolCallFormat format) {
  return format == ToolCallFormat::kLlama3 || format == ToolCallFormat::kNone;
}

namespace {

// One parameter's value as the XML-tag templates write it: a string as its bare text, anything
// else through `tojson` (objects, arrays) or `string` (numbers; Python's True / False / None).
json XmlParameterValue(std::string_view text, const std::string* type) {
  if (type != nullptr && *type == "string") return std::string(text);
  if (type != nullptr && *type == "boolean") {
    if (text == "True" || text == "true") return true;
    if (text == "False" || text == "false") return false;
  }
  if (text == "None") return nullptr;
  const json value = json::parse(text, nullptr, false);
  // Undeclared: JSON where it parses as a number, object, array, boolean or null; a bare word
  // (which JSON refuses) or a JSON string's quotes stay the text the model wrote.
  if (value.is_discarded() || value.is_string()) return std::string(text);
  return value;
}

// <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>, the body of one
// <tool_call>; nullopt when it is not one.
std::optional<ParsedToolCall> ParseXmlFunction(std::string_view body,
                                               const ToolParameterTypes* types) {
  constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
  constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";
  body = Trim(body);
  if (!body.starts_with(kFunction) || !body.ends_with(kFunctionEnd)) return std::nullopt;
  const size_t name_end = body.find('>');
  ParsedToolCall call;
  call.name = std::string(Trim(body.substr(kFunction.size(), name_end - kFunction.size())));
  if (call.name.empty()) return std::nullopt;
  const std::map<std::string, std::string>* declared = nullptr;
  if (types != nullptr) {
    if (auto it = types->find(call.name); it != types->end()) declared = &it->second;
  }
  std::string_view rest = Trim(body.substr(name_end + 1, body.size() - kFunctionEnd.size() -
                                                             name_end - 1));
  json arguments = json::object();
  while (!rest.empty()) {
    if (!rest.starts_with(kParameter)) return std::nullopt;
    const size_t key_end = rest.find('>');
    const size_t value_end = rest.find(kParameterEnd);
    if (key_end == std::string_view::npos || value_end == std::string_view::npos ||
        value_end < key_end) {
      return std::nullopt;
    }
    const std::string key(Trim(rest.substr(kParameter.size(), key_end - kParameter.size())));
    // The template puts one newline after <parameter=KEY> and one before </parameter>; a
    // value's own leading or trailing newlines beyond those are its text.
    std::string_view value = rest.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const std::string* type = nullptr;
    if (declared != nullptr) {
      if (auto it = declared->find(key); it != declared->end()) type = &it->second;
    }
    arguments[key] = XmlParameterValue(value, type);
    rest = Trim(rest.substr(value_end + kParameterEnd.size()));
  }
  call.arguments = arguments.dump();
  return call;
}

ParsedReply ParseHermes(std::string_view text, const ToolParameterTypes* types, bool xml) {
  constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  ParsedReply reply;
  std::string content;
  size_t at = 0;
  while (true) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string_view::npos) break;
    const size_t close = text.find(kClose, open + kOpen.size());
    if (close == std::string_view::npos) return AsContent(text);  // an unfinished call
    const std::string_view body = text.substr(open + kOpen.size(), close - open - kOpen.size());
    // A template of either kind may meet the other's call (the XML one's prompt shows JSON
    // examples in some fine-tunes): the body's first character tells them apart.
    std::optional<ParsedToolCall> call =
        Trim(body).starts_with('<')
            ? (xml ? ParseXmlFunction(body, types) : std::nullopt)
            : CallFromObject(json::parse(Trim(body), nullptr, false));
    if (!call) return AsContent(text);
    content += text.substr(at, open - at);
    reply.tool_calls.push_back(std::move(*call));
    at = close + kClose.size();
  }
  if (reply.tool_calls.empty()) return AsContent(text);
  content += text.substr(at);
  reply.content = std::string(Trim(content));
  return reply;
}

// `tool.call(key="value", n=3)`: Llama 3.1's built-in tools (brave_search, wolfram_alpha, ...).
std::optional<ParsedToolCall> ParseBuiltinCall(std::string_view code) {
  const size_t dot = code.find(".call(");
  if (dot == std::string_view::npos || code.back() != ')') return std::nullopt;
  ParsedToolCall call;
  call.name = std::string(code.substr(0, dot));
  for (const char c : call.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return std::nullopt;
  }
  std::string_view args = code.substr(dot + 6, code.size() - dot - 7);
  json object = json::object();
  while (!Trim(args).empty()) {
    args = Trim(args);
    const size_t eq = args.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string key(Trim(args.substr(0, eq)));
    args = Trim(args.substr(eq + 1));
    // The value: a JSON literal up to the next top-level comma (strings may hold commas).
    size_t end = 0;
    bool in_string = false;
    for (; end < args.size(); ++end) {
      const char c = args[end];
      if (in_string && c == '\\') {
        ++end;
      } else if (c == '"') {
        in_string = !in_string;
      } else if (c == ',' && !in_string) {
        break;
      }
    }
    const json value = json::parse(Trim(args.substr(0, end)), nullptr, false);
    if (value.is_discarded()) return std::nullopt;
    object[key] = value;
    args = end < args.size() ? args.substr(end + 1) : std::string_view();
  }
  call.arguments = object.dump();
  return call;
}

ParsedReply ParseLlama3(std::string_view text) {
  constexpr std::string_view kPythonTag = "<|python_tag|>";
  const size_t tag = text.find(kPythonTag);
  if (tag != std::string_view::npos) {
    const std::string_view code = Trim(text.substr(tag + kPythonTag.size()));
    ParsedReply reply;
    reply.content = std::string(Trim(text.substr(0, tag)));
    const json object = json::parse(code, nullptr, false);
    if (std::optional<ParsedToolCall> call = CallFromObject(object)) {
      reply.tool_calls.push_back(std::move(*call));
    } else if (std::optional<ParsedToolCall> builtin = ParseBuiltinCall(code)) {
      reply.tool_calls.push_back(std::move(*builtin));
    } else {
      reply.tool_calls.push_back({"python", json{{"code", std::string(code)}}.dump(), ""});
    }
    return reply;
  }
  // A reply that is one JSON object with a name and parameters is a call.
  const std::string_view trimmed = Trim(text);
  if (trimmed.empty() || trimmed.front() != '{') return AsContent(text);
  const json object = json::parse(trimmed, nullptr, false);
  if (!object.is_object() || !(object.contains("parameters") || object.contains("arguments"))) {
    return AsContent(text);
  }
  std::optional<ParsedToolCall> call = CallFromObject(object);
  if (!call) return AsContent(text);
  return ParsedReply{"", {std::move(*call)}};
}

ParsedReply ParseMistral(std::string_view text) {
  constexpr std::string_view kTag = "[TOOL_CALLS]";
  const size_t tag = text.find(kTag);
  if (tag == std::string_view::npos) return AsContent(text);
  const json calls = json::parse(Trim(text.substr(tag + kTag.size())), nullptr, false);
  if (!calls.is_array() || calls.empty()) return AsContent(text);
  ParsedReply reply;
  reply.content = std::string(Trim(text.substr(0, tag)));
  for (const json& c : calls) {
    std::optional<ParsedToolCall> call = CallFromObject(c);
    if (!call) return AsContent(text);
    reply.tool_calls.push_back(std::move(*call));
  }
  return reply;
}

// Families with no call syntax of their own: the whole reply one JSON object, a call
// {"name", "arguments"}, or llama.cpp's generic {"tool_call": {...}} / {"tool_calls": [...]}.
ParsedReply ParseJsonReply(std::string_view text) {
  const std::string_view trimmed = Trim(text);
  if (trimmed.empty() || trimmed.front() != '{') return AsContent(text);
  const json object = json::parse(trimmed, nullptr, false);
  if (!object.is_object()) return AsContent(text);
  ParsedReply reply;
  if (object.contains("tool_calls") && object["tool_calls"].is_array()) {
    for (const json& c : object["tool_calls"]) {
      std::optional<ParsedToolCall> call = CallFromObject(c);
      if (!call) return AsContent(text);
      reply.tool_calls.push_back(std::move(*call));
    }
    return reply.tool_calls.empty() ? AsContent(text) : reply;
  }
  const json& inner = object.contains("tool_call") ? object["tool_call"] : object;
  if (!inner.is_object() || !(inner.contains("arguments") || inner.contains("parameters"))) {
    return AsContent(text);
  }
  std::optional<ParsedToolCall> call = CallFromObject(inner);
  if (!call) return AsContent(text);
  reply.tool_calls.push_back(std::move(*call));
  return reply;
}

}  // namespace

ToolCallFormat DetectToolCallFormat(std::string_view chat_template) {
  if (chat_template.find("<tool_call>") != std::string_view::npos) {
    return chat_template.find("<function=") != std::string_view::npos ? ToolCallFormat::kXmlFunction
                                                                      : ToolCallFormat::kHermes;
  }
  if (chat_template.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kMistral;
  if (chat_template.find("<|python_tag|>") != std::string_view::npos ||
      (chat_template.find("<|start_header_id|>") != std::string_view::npos &&
       chat_template.find("\"parameters\"") != std::string_view::npos)) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kNone;
}

ParsedReply ParseToolCalls(std::string_view text, ToolCallFormat format,
                           const ToolParameterTypes* types) {
  switch (format) {
    case ToolCallFormat::kHermes: return ParseHermes(text, types, /*xml=*/false);
    case ToolCallFormat::kXmlFunction: return ParseHermes(text, types, /*xml=*/true);
    case ToolCallFormat::kLlama3: return ParseLlama3(text);
    case ToolCallFormat::kMistral: return ParseMistral(text);
    case ToolCallFormat::kNone: return ParseJsonReply(text);
  }
  return AsContent(text);
}

}  // namespace kvl::server
