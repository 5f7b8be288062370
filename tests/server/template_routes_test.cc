// POST /apply-template and chat completions through a Jinja chat template, over HTTP on a real
// `kvl serve`: a --chat-template-file rendered (tools, tool calls with null content, template
// kwargs), an error the template raises answered as a 400 naming it, a model without a template
// falling back to the plain built-in (said on stderr), a broken template file refused at start.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;

// A ChatML-like template using what real templates use: loop.first, raise_exception, a ternary,
// `is not none`, tool calls printed with tojson, tools, a generation prompt and a kwarg.
constexpr char kTemplate[] =
    "{%- for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be first') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content if m.content is not none else '' }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

std::string WriteTemplate(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name + "_" + std::to_string(::getpid()) + ".jinja";
  std::ofstream(path) << text;
  return path;
}

TEST(ApplyTemplateTest, RendersTheTemplateFileWithToolsAndKwargsAndRefusesWhatItRaises) {
  const std::string path = WriteTemplate("chatml_tools", kTemplate);
  ServerProcess server({"--chat-template-file", path});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  EXPECT_NE(server.Log().find("chat template jinja (" + path + ")"), std::string::npos) << server.Log();
  httplib::Client client("127.0.0.1", server.port());

  // The arguments arrive as a JSON string (OpenAI's form) and reach the template as a mapping,
  // keys in the order sent; the assistant's content is null.
  // Sent as written: nlohmann::json would sort the keys.
  const nlohmann::ordered_json request = nlohmann::ordered_json::parse(R"json({
    "messages": [
      {"role": "user", "content": "Hi ü"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": \"x\"}"}}]}],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "chat_template_kwargs": {"enable_thinking": false}})json");
  auto res = PostJson(client, "/apply-template", request.dump());
  ASSERT_TRUE(res) << server.Log();
  ASSERT_EQ(res->status, 200) << res->body;
  // What @huggingface/jinja 0.5.11 renders for the same template and context.
  EXPECT_EQ(json::parse(res->body)["prompt"],
            "<|im_start|>user\nHi ü<|im_end|>\n<|im_start|>assistant\n<tool_call>{\"name\": \"f\", "
            "\"arguments\": {\"b\": 1, \"a\": \"x\"}}</tool_call><|im_end|>\nTOOLS [{\"type\": "
            "\"function\", \"function\": {\"name\": \"f\"}}]\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

  res = PostJson(client, "/apply-template",
                 R"({"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": false})");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["prompt"], "<|im_start|>user\na<|im_end|>\n");

  // The template's raise_exception is the client's error, named, on both routes.
  const std::string raising =
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}], "max_tokens": 2})";
  for (const char* route : {"/apply-template", "/v1/chat/completions"}) {
    res = PostJson(client, route, raising);
    ASSERT_TRUE(res) << route;
    EXPECT_EQ(res->status, 400) << route << ": " << res->body;
    const json error = json::parse(res->body)["error"];
    EXPECT_NE(error["message"].get<std::string>().find("raise_exception: System message must be first"),
              std::string::npos)
        << error.dump();
    EXPECT_EQ(error["param"], "messages");
  }
  // A chat completion renders the same prompt and runs.
  res = PostJson(client, "/v1/chat/completions",
                 R"({"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 3})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  // Bad bodies name their field.
  res = PostJson(client, "/apply-template", R"({"messages": "hi"})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  res = PostJson(client, "/apply-template", R"({"messages": [{"role": "user", "content": "a"}], "tools": 3})");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "tools");
  std::remove(path.c_str());
}

TEST(ApplyTemplateTest, ModelWithoutTemplateFallsBackToPlainAndSaysSo) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  EXPECT_NE(server.Log().find("no tokenizer.chat_template; using the built-in chat template 'plain'"),
            std::string::npos)
      << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  auto res = PostJson(client, "/apply-template",
                      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "there"}]})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["prompt"], "Hi\nthere");
  // The built-ins cannot write tools: refused, not dropped.
  res = PostJson(client, "/apply-template",
                 R"({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
}

TEST(ApplyTemplateTest, BrokenTemplateFileStopsTheServerNamingTheBlock) {
  const std::string path = WriteTemplate("unclosed", "{% for m in messages %}\n{{ m.content }}\n");
  ServerProcess server({"--chat-template-file", path});
  EXPECT_FALSE(server.WaitReady());
  EXPECT_NE(server.Log().find("'{% for %}' is never closed"), std::string::npos) << server.Log();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvl
