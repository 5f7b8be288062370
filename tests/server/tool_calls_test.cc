// Tool calls parsed from raw model replies in each family's format, into the calls llama.cpp's
// chat parser gives for the same texts; a reply that is not a well-formed call stays content.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

TEST(ToolCallsTest, FormatsAreDetectedFromTheTemplates) {
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("<|start_header_id|>{{ '<|python_tag|>' }}"),
            ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("{{ messages }}"), ToolCallFormat::kNone);
}

}  // namespace
}  // namespace kvl::server
