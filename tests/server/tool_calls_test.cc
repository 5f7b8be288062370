// Tool calls parsed from raw model replies in each family's format, into the calls llama.cpp's
// chat parser gives for the same texts; a reply that is not a well-formed call stays content.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/llama_vocab_files.h"

namespace kvl::server {
namespace {

using nlohmann::json;

void ExpectCall(const ParsedToolCall& call, const std::string& name, const json& arguments,
                const std::string& id = "") {
  EXPECT_EQ(call.name, name);
  EXPECT_EQ(json::parse(call.arguments), arguments) << call.arguments;
  EXPECT_EQ(call.id, id);
}

TEST(ToolCallsTest, HermesCallsWithTextAroundThem) {
  const ParsedReply r = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>",
      ToolCallFormat::kHermes);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  ExpectCall(r.tool_calls[0], "get_weather", {{"city", "Paris"}, {"days", 3}});
  ExpectCall(r.tool_calls[1], "get_time", json::object());
  // Arguments written as a string holding JSON (some fine-tunes do).
  const ParsedReply s = ParseToolCalls(
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
      ToolCallFormat::kHermes);
  ASSERT_EQ(s.tool_calls.size(), 1u);
  ExpectCall(s.tool_calls[0], "f", {{"x", 1}});
  EXPECT_EQ(s.content, "");
}

TEST(ToolCallsTest, HalfACallIsContent) {
  for (const char* text : {"<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}",
                           "<tool_call>{\"name\": \"f\", \"argu</tool_call>",
                           "<tool_call>{\"arguments\": {}}</tool_call>",
                           "Just an answer, no call."}) {
    const ParsedReply r = ParseToolCalls(text, ToolCallFormat::kHermes);
    EXPECT_TRUE(r.tool_calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  const ParsedReply m = ParseToolCalls("[TOOL_CALLS][{\"name\": \"f\"", ToolCallFormat::kMistral);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ToolCallsTest, Llama3JsonPythonTagAndBuiltins) {
  const ParsedReply json_call = ParseToolCalls(
      "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
      ToolCallFormat::kLlama3);
  EXPECT_EQ(json_call.content, "");
  ASSERT_EQ(json_call.tool_calls.size(), 1u);
  ExpectCall(json_call.tool_calls[0], "get_weather", {{"city", "Oslo"}});

  const ParsedReply builtin = ParseToolCalls(
      "<|python_tag|>brave_search.call(query=\"weather, Oslo\", count=3)", ToolCallFormat::kLlama3);
  ASSERT_EQ(builtin.tool_calls.size(), 1u);
  ExpectCall(builtin.tool_calls[0], "brave_search", {{"query", "weather, Oslo"}, {"count", 3}});

  const ParsedReply code =
      ParseToolCalls("<|python_tag|>print(2 + 2)", ToolCallFormat::kLlama3);
  ASSERT_EQ(code.tool_calls.size(), 1u);
  ExpectCall(code.tool_calls[0], "python", {{"code", "print(2 + 2)"}});

  const ParsedReply tagged_json = ParseToolCalls(
      "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": [1, 2]}}", ToolCallFormat::kLlama3);
  ASSERT_EQ(tagged_json.tool_calls.size(), 1u);
  ExpectCall(tagged_json.tool_calls[0], "f", {{"a", {1, 2}}});

  // An answer that merely is JSON (no parameters) is content.
  const ParsedReply answer = ParseToolCalls("{\"name\": \"Bob\", \"age\": 3}", ToolCallFormat::kLlama3);
  EXPECT_TRUE(answer.tool_calls.empty());
  EXPECT_EQ(answer.content, "{\"name\": \"Bob\", \"age\": 3}");
}

TEST(ToolCallsTest, MistralArraysWithIds) {
  const ParsedReply r = ParseToolCalls(
      "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}, \"id\": \"abc123XYZ\"}, "
      "{\"name\": \"neg\", \"arguments\": {\"x\": -1}, \"id\": \"def456UVW\"}]",
      ToolCallFormat::kMistral);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  ExpectCall(r.tool_calls[0], "add", {{"a", 1}, {"b", 2}}, "abc123XYZ");
  ExpectCall(r.tool_calls[1], "neg", {{"x", -1}}, "def456UVW");
}

// The texts of llama.cpp's chat-parser tests for these formats, written out here: each family's
// call as its templates show the model, with the calls llama.cpp's parser reads from them.
TEST(ToolCallsTest, FamilyTextsParseAsLlamaCppParsesThem) {
  // Qwen2.5 / Qwen3 (Hermes 2 Pro): JSON on its own lines inside the tags; nested arguments
  // and non-ASCII kept; no content.
  const ParsedReply qwen = ParseToolCalls(
      "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n"
      "</tool_call>",
      ToolCallFormat::kHermes);
  EXPECT_EQ(qwen.content, "");
  ASSERT_EQ(qwen.tool_calls.size(), 1u);
  ExpectCall(qwen.tool_calls[0], "special_function", {{"arg1", 1}});
  const ParsedReply nested = ParseToolCalls(
      "<tool_call>{\"name\":\"book\",\"arguments\":{\"who\":\"Zo\u00eb\",\"seats\":[1,2],"
      "\"opts\":{\"window\":true,\"note\":null}}}</tool_call>",
      ToolCallFormat::kHermes);
  ASSERT_EQ(nested.tool_calls.size(), 1u);
  ExpectCall(nested.tool_calls[0], "book",
             {{"who", "Zo\u00eb"}, {"seats", {1, 2}}, {"opts", {{"window", true}, {"note", nullptr}}}});
  // Text after the call is content too.
  const ParsedReply after = ParseToolCalls(
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nDone.",
      ToolCallFormat::kHermes);
  ASSERT_EQ(after.tool_calls.size(), 1u);
  EXPECT_EQ(after.content, "Done.");

  // Llama 3.1 / 3.2 / 3.3: the reply one JSON object, "parameters" the arguments.
  const ParsedReply llama = ParseToolCalls(
      "{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}", ToolCallFormat::kLlama3);
  ASSERT_EQ(llama.tool_calls.size(), 1u);
  ExpectCall(llama.tool_calls[0], "special_function", {{"arg1", 1}});
  EXPECT_EQ(llama.content, "");
  // With leading space and a trailing newline, as sampled.
  const ParsedReply spaced = ParseToolCalls(
      "  {\"name\": \"g\", \"parameters\": {\"q\": \"a b\"}}\n", ToolCallFormat::kLlama3);
  ASSERT_EQ(spaced.tool_calls.size(), 1u);
  ExpectCall(spaced.tool_calls[0], "g", {{"q", "a b"}});
  // Llama 3.1's built-in tools after <|python_tag|>.
  const ParsedReply search = ParseToolCalls(
      "<|python_tag|>brave_search.call(query=\"latest news\")", ToolCallFormat::kLlama3);
  ASSERT_EQ(search.tool_calls.size(), 1u);
  ExpectCall(search.tool_calls[0], "brave_search", {{"query", "latest news"}});

  // Mistral Nemo: [TOOL_CALLS] and the array, each call with its 9-character id.
  const ParsedReply nemo = ParseToolCalls(
      "[TOOL_CALLS][{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}, \"id\": "
      "\"123456789\"}]",
      ToolCallFormat::kMistral);
  ASSERT_EQ(nemo.tool_calls.size(), 1u);
  ExpectCall(nemo.tool_calls[0], "special_function", {{"arg1", 1}}, "123456789");
  EXPECT_EQ(nemo.content, "");
  // Without ids (Mistral 7B v0.3 writes none).
  const ParsedReply no_id = ParseToolCalls(
      "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": \"y\"}}]", ToolCallFormat::kMistral);
  ASSERT_EQ(no_id.tool_calls.size(), 1u);
  ExpectCall(no_id.tool_calls[0], "f", {{"x", "y"}});

  // Families with no syntax of their own: llama.cpp's generic format.
  const ParsedReply generic = ParseToolCalls(
      "{\"tool_call\": {\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}}",
      ToolCallFormat::kNone);
  ASSERT_EQ(generic.tool_calls.size(), 1u);
  ExpectCall(generic.tool_calls[0], "special_function", {{"arg1", 1}});
  const ParsedReply answer = ParseToolCalls("{\"response\": \"Hello\"}", ToolCallFormat::kNone);
  EXPECT_TRUE(answer.tool_calls.empty());
  EXPECT_EQ(answer.content, "{\"response\": \"Hello\"}");
}

// Qwen3-Coder's and Qwen3.5's format, as their templates write an assistant's tool_calls: a
// string bare, an object or array through tojson, a number or boolean through `string`.
TEST(ToolCallsTest, XmlFunctionTagsWithTypedValues) {
  const std::string text =
      "I will look it up.\n<tool_call>\n<function=search>\n<parameter=query>\nkv cache\n"
      "two lines\n</parameter>\n<parameter=limit>\n5\n</parameter>\n<parameter=exact>\nTrue\n"
      "</parameter>\n<parameter=filters>\n{\"lang\": \"en\"}\n</parameter>\n<parameter=zip>\n"
      "02139\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
      "</function>\n</tool_call>";
  const ToolParameterTypes types = {
      {"search", {{"query", "string"}, {"limit", "integer"}, {"exact", "boolean"},
                  {"filters", "object"}, {"zip", "string"}}}};
  const ParsedReply r = ParseToolCalls(text, ToolCallFormat::kXmlFunction, &types);
  EXPECT_EQ(r.content, "I will look it up.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  ExpectCall(r.tool_calls[0], "search",
             {{"query", "kv cache\ntwo lines"}, {"limit", 5}, {"exact", true},
              {"filters", {{"lang", "en"}}}, {"zip", "02139"}});
  ExpectCall(r.tool_calls[1], "get_time", json::object());
  // Without the tools' types: JSON where the text parses as JSON, else the text ("02139" is
  // not JSON: a leading zero).
  const ParsedReply untyped = ParseToolCalls(text, ToolCallFormat::kXmlFunction);
  ASSERT_EQ(untyped.tool_calls.size(), 2u);
  ExpectCall(untyped.tool_calls[0], "search",
             {{"query", "kv cache\ntwo lines"}, {"limit", 5}, {"exact", "True"},
              {"filters", {{"lang", "en"}}}, {"zip", "02139"}});
  // A JSON call inside <tool_call> is read too; a broken tag structure is content.
  EXPECT_EQ(ParseToolCalls("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                           ToolCallFormat::kXmlFunction)
                .tool_calls.size(),
            1u);
  for (const char* broken :
       {"<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>"}) {
    const ParsedReply b = ParseToolCalls(broken, ToolCallFormat::kXmlFunction);
    EXPECT_TRUE(b.tool_calls.empty()) << broken;
    EXPECT_EQ(b.content, broken);
  }
  // Hermes templates do not read XML tags as calls.
  EXPECT_TRUE(ParseToolCalls(text, ToolCallFormat::kHermes).tool_calls.empty());
}

TEST(ToolCallsTest, FormatsAreDetectedFromTheTemplates) {
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("<|start_header_id|>{{ '<|python_tag|>' }}"),
            ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("{{ messages }}"), ToolCallFormat::kNone);
  // The real templates (llama.cpp's models/templates).
  std::string why_not;
  const std::string dir = testing::LlamaCppDir(&why_not);
  if (dir.empty()) GTEST_SKIP() << why_not;
  for (const auto& [file, format] : std::vector<std::pair<std::string, ToolCallFormat>>{
           {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::kLlama3},
           {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::kLlama3},
           {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::kHermes},
           {"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::kHermes},
           {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::kHermes},
           {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::kMistral},
           {"Qwen3-Coder.jinja", ToolCallFormat::kXmlFunction},
           {"Qwen3.5-4B.jinja", ToolCallFormat::kXmlFunction},
           {"google-gemma-2-2b-it.jinja", ToolCallFormat::kNone}}) {
    const std::string source = testing::ReadWholeFile(dir + "/models/templates/" + file);
    ASSERT_FALSE(source.empty()) << file;
    EXPECT_EQ(DetectToolCallFormat(source), format) << file;
  }
}

}  // namespace
}  // namespace kvl::server
