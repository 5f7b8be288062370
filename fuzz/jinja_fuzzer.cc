// libFuzzer target for the Jinja chat-template renderer: any input, parsed as a template and
// rendered over a conversation with tools, must give text or a Status, never a crash, a hang or a
// sanitizer report. The limits are set low so each input renders in milliseconds; what they stop
// (steps, recursion, string size) is an error like any other.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  kvl::StatusOr<kvl::jinja::Template> parsed = kvl::jinja::Template::Parse(source);
  if (!parsed.ok()) return 0;
  kvl::jinja::RenderOptions options;
  options.max_steps = 20'000;
  options.max_call_depth = 32;
  options.max_string_bytes = 1 << 20;
  options.now = 1721995200;
  kvl::StatusOr<std::string> out = parsed->Render(Context(), options);
  return out.ok() && out->size() > (1u << 20) ? 1 : 0;  // the limit holds for the output too
}
