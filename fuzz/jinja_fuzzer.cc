// libFuzzer target for the Jinja chat-template renderer: any input, parsed as a template and
// rendered over a conversation with tools, must give text or a Status, never a crash, a hang or a
// sanitizer report. The limits are set low so each input renders in milliseconds; what they stop
// (steps, bytes, recursion, string size, time) is an error like any other.
//
// An input is a template as it is, unless its first byte is 0x01: then it is generated from a
// count (bytes 1-2, big-endian) and five parts (the rest, split at NUL bytes): prefix + open x
// count + middle + close x count + suffix, with each '#' in the prefix and suffix read as the
// count. Random bytes rarely make a chain of 20,000 operators, a nesting thousands deep
// or a loop that builds a value 100,000 levels deep, and those are what overflow a recursive
// evaluator's stack or exhaust memory; mutating the count and the parts of a seed makes them
// (scripts/run-fuzz.sh writes seeds of each shape).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/jinja.h"

namespace {

using kvl::jinja::Value;
using kvl::jinja::ValueMap;

Value Message(const char* role, Value content) {
  ValueMap m;
  m.Set("role", Value::String(role));
  m.Set("content", std::move(content));
  return Value::Object(std::move(m));
}

const kvl::jinja::Context& Context() {
  static const kvl::jinja::Context context = [] {
    ValueMap function;
    function.Set("name", Value::String("get_weather"));
    function.Set("arguments", Value::Object({{{"city", Value::String("Zürich")}, {"days", Value::Int(3)}}}));
    ValueMap call;
    call.Set("type", Value::String("function"));
    call.Set("function", Value::Object(function));
    Value assistant = Message("assistant", Value::Null());
    assistant.map().Set("tool_calls", Value::Array({Value::Object(std::move(call))}));
    ValueMap tool;
    tool.Set("type", Value::String("function"));
    tool.Set("function", Value::Object(std::move(function)));
    return kvl::jinja::Context{
        {"messages", Value::Array({Message("system", Value::String("Be brief.")),
                                   Message("user", Value::String("Привет 👋 what's the weather?")), assistant,
                                   Message("tool", Value::String("{\"temp\": 21.5}")),
                                   Message("assistant", Value::String("<think>\nok\n</think>\n\n21.5 °C"))})},
        {"tools", Value::Array({Value::Object(std::move(tool))})},
        {"add_generation_prompt", Value::Bool(true)},
        {"bos_token", Value::String("<s>")},
        {"eos_token", Value::String("</s>")},
        {"enable_thinking", Value::Bool(false)},
    };
  }();
  return context;
}

// A generated template stays under this (a 20k-link chain is 40 KB).
constexpr size_t kMaxGeneratedBytes = 1 << 20;

std::string Expand(std::string_view part, size_t count) {
  std::string out;
  for (char c : part) {
    if (c == '#') {
      out += std::to_string(count);
    } else {
      out += c;
    }
  }
  return out;
}

// The template an input starting with 0x01 generates (see the top of the file); "" where it
// would be too large.
std::string Generate(std::string_view input) {
  if (input.size() < 3) return "";
  const size_t count = static_cast<size_t>(static_cast<uint8_t>(input[1])) << 8 | static_cast<uint8_t>(input[2]);
  std::vector<std::string_view> parts;
  std::string_view rest = input.substr(3);
  while (parts.size() < 4) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  parts.push_back(rest);
  parts.resize(5);
  const std::string_view open = parts[1], middle = parts[2], close = parts[3];
  if ((open.size() + close.size()) * count + parts[0].size() + middle.size() + parts[4].size() > kMaxGeneratedBytes) {
    return "";
  }
  std::string out = Expand(parts[0], count);
  for (size_t i = 0; i < count; ++i) out += open;
  out += middle;
  for (size_t i = 0; i < count; ++i) out += close;
  out += Expand(parts[4], count);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool generated = !input.empty() && input[0] == '\x01';
  const std::string source = generated ? Generate(input) : std::string(input);
  kvl::StatusOr<kvl::jinja::Template> parsed = kvl::jinja::Template::Parse(source);
  if (!parsed.ok()) return 0;
  kvl::jinja::RenderOptions options;
  // A generated loop may build a value 100,000 levels deep (five steps a level): deep enough
  // that freeing or printing it recursively overflows the stack.
  options.max_steps = generated ? 600'000 : 20'000;
  options.max_call_depth = 32;
  options.max_string_bytes = 1 << 20;
  options.max_bytes = 64 << 20;
  options.max_seconds = 5;
  options.now = 1721995200;
  kvl::StatusOr<std::string> out = parsed->Render(Context(), options);
  // The limit holds for the output too.
  if (out.ok() && out->size() > options.max_string_bytes) std::abort();
  return 0;
}
