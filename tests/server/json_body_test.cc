// The one JSON door of every route (server/json_body.h) and the request parsers behind it, in
// process: nesting is refused before a value is built, JSON nested inside a string goes through
// the same bound, and errors quote what a client sent only as a bounded snippet, naming the field
// that was wrong.
#include "server/json_body.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kvl/chat_template.h"
#include "server/api_request.h"

namespace kvl::server {
namespace {

std::string Nested(int depth, const std::string& inner = "1") {
  return std::string(static_cast<size_t>(depth), '[') + inner +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(JsonBodyTest, NestingDepthCountsBracketsOutsideStringsAndStopsPastTheLimit) {
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": []}]})", 32), 4);
  EXPECT_EQ(JsonNestingDepth(R"({"a": "[[[[{{{{"})", 32), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a": "\"[[[["})", 32), 1);  // an escaped quote ends no string
  EXPECT_EQ(JsonNestingDepth(R"(["\\", [[]]])", 32), 3);     // an escaped backslash ends one
  EXPECT_EQ(JsonNestingDepth(Nested(100000), 32), 33);
  EXPECT_EQ(JsonNestingDepth("]]]]][[", 32), 0);  // not JSON, still one bounded pass
}

TEST(JsonBodyTest, ADeepBodyIsRefusedByItsDepthWithoutParsing) {
  JsonValue doc;
  std::optional<ApiError> error = ParseJsonBody(R"({"content": )" + Nested(100000) + "}", &doc);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->http_status, 400);
  EXPECT_NE(error->message.find("deeper than 32"), std::string::npos) << error->message;
  EXPECT_TRUE(doc.is_null());  // nothing was built
  // At the bound exactly it parses.
  EXPECT_FALSE(ParseJsonBody(R"({"a": )" + Nested(31) + "}", &doc).has_value());
  EXPECT_TRUE(ParseJsonBody(R"({"a": )" + Nested(32) + "}", &doc).has_value());
  EXPECT_NE(ParseJsonBody("{", &doc)->message.find("not valid JSON"), std::string::npos);
  EXPECT_NE(ParseJsonBody("[1]", &doc)->message.find("JSON object"), std::string::npos);
  EXPECT_FALSE(ParseNestedJson(Nested(100000)).has_value());
  EXPECT_EQ(ParseNestedJson(R"({"x": [1]})")->at("x")[0], 1);
}

TEST(JsonBodyTest, QuotesAndDescriptionsOfSentValuesAreBounded) {
  EXPECT_EQ(BoundedQuote("short"), "\"short\"");
  const std::string huge(6 << 20, 'm');
  const std::string quoted = BoundedQuote(huge);
  EXPECT_LT(quoted.size(), 100u);
  EXPECT_NE(quoted.find("(6291456 bytes)"), std::string::npos) << quoted;
  // Cut at a character's start: "é" is two bytes, the cut would fall between them.
  std::string accents = "a";
  for (int i = 0; i < 40; ++i) accents += "\xC3\xA9";
  EXPECT_EQ(BoundedQuote(accents, 4), "\"a\xC3\xA9...\" (81 bytes)");
  EXPECT_EQ(DescribeValue(JsonValue::parse(Nested(32))), "an array of 1 elements");
  EXPECT_EQ(DescribeValue(JsonValue::parse(R"({"a": 1, "b": 2})")), "an object of 2 fields");
  EXPECT_EQ(DescribeValue(JsonValue(huge)).size(), quoted.size());
  EXPECT_EQ(DescribeValue(JsonValue(1.5)), "1.5");
  EXPECT_EQ(Truncated("short"), "short");
  EXPECT_EQ(Truncated(huge, 10), "mmmmmmmmmm... (6291456 bytes)");
  EXPECT_EQ(DescribeValue(JsonValue(-5)), "-5");
}

ApiContext Context() {
  ApiContext context;
  context.model_name = "stories260K";
  context.context_length = 512;
  context.vocab_size = 512;
  return context;
}

std::optional<ApiError> ParseCompletion(const std::string& body) {
  CompletionParams params;
  return ParseCompletionRequest(body, Endpoint::kCompletions, Context(), &params);
}

TEST(ApiRequestBoundsTest, AnOutOfVocabularyLogitBiasNamesLogitBias) {
  std::optional<ApiError> error =
      ParseCompletion(R"({"prompt": "Once", "logit_bias": {"100000": 5}})");
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->param, "logit_bias");
  EXPECT_NE(error->message.find("100000"), std::string::npos) << error->message;
  EXPECT_NE(error->message.find("[0, 512)"), std::string::npos) << error->message;
  EXPECT_FALSE(ParseCompletion(R"({"prompt": "Once", "logit_bias": {"511": 5}})").has_value());
}

TEST(ApiRequestBoundsTest, ErrorsQuoteHugeValuesAsSnippets) {
  const std::string huge(6 << 20, 'x');
  std::optional<ApiError> model =
      ParseCompletion(R"({"prompt": "Once", "model": ")" + huge + "\"}");
  ASSERT_TRUE(model.has_value());
  EXPECT_EQ(model->http_status, 404);
  EXPECT_EQ(model->param, "model");
  EXPECT_LT(ErrorBody(*model).size(), 400u);
  EXPECT_NE(model->message.find("(6291456 bytes)"), std::string::npos) << model->message;

  std::optional<ApiError> bias =
      ParseCompletion(R"({"prompt": "Once", "logit_bias": {")" + huge + "\": 1}}");
  ASSERT_TRUE(bias.has_value());
  EXPECT_EQ(bias->param, "logit_bias");
  EXPECT_LT(ErrorBody(*bias).size(), 400u);

  std::optional<ApiError> range = ParseCompletion(R"({"prompt": "Once", "temperature": 1e300})");
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->param, "temperature");
  EXPECT_LT(ErrorBody(*range).size(), 400u);
}

// An error the template raises may quote the request: it reaches the client cut short.
TEST(ApiRequestBoundsTest, ATemplatesErrorQuotingTheRequestIsBounded) {
  ApiContext context = Context();
  auto formatter = ChatFormatter::FromJinja(
      "{% if messages[0].content | length > 10 %}{{ raise_exception(messages[0].content) }}"
      "{% endif %}{{ messages[0].content }}",
      "test", {});
  ASSERT_TRUE(formatter.ok()) << formatter.status().ToString();
  context.chat = std::make_shared<const ChatFormatter>(std::move(*formatter));
  const std::string body =
      R"({"messages": [{"role": "user", "content": ")" + std::string(1 << 20, 'r') + R"("}]})";
  CompletionParams params;
  std::optional<ApiError> error =
      ParseCompletionRequest(body, Endpoint::kChatCompletions, context, &params);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->param, "messages");
  EXPECT_LT(ErrorBody(*error).size(), 1024u);
  EXPECT_NE(error->message.find("rrrr"), std::string::npos) << error->message;
}

// A tool call's arguments string is JSON the server parses and hands to the template as a
// mapping: nested 100k deep, it was converted recursively (a stack overflow); now it stays the
// string it was, as any arguments that do not parse into a mapping do.
TEST(ApiRequestBoundsTest, DeepJsonInsideAToolCallsArgumentsIsNotFollowed) {
  std::string arguments;
  for (int i = 0; i < 100000; ++i) arguments += "{\\\"a\\\":";
  arguments += "1" + std::string(100000, '}');
  const std::string body =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, )"
      R"("tool_calls": [{"type": "function", "function": {"name": "f", "arguments": ")" +
      arguments + R"("}}]}]})";
  ApiContext context = Context();
  auto formatter = ChatFormatter::FromJinja(
      "{% for m in messages %}{{ m.content }}{% if m.tool_calls %}"
      "{% set a = m.tool_calls[0].function.arguments %}{{ a is mapping }}|{{ a }}{% endif %}"
      "{% endfor %}",
      "test", {});
  ASSERT_TRUE(formatter.ok()) << formatter.status().ToString();
  context.chat = std::make_shared<const ChatFormatter>(std::move(*formatter));
  CompletionParams params;
  std::optional<ApiError> error =
      ParseCompletionRequest(body, Endpoint::kChatCompletions, context, &params);
  ASSERT_FALSE(error.has_value()) << error->message;
  EXPECT_TRUE(params.request.prompt.starts_with(R"(hifalse|{"a":{"a":)"))
      << params.request.prompt.substr(0, 80);

  // Arguments within the bound still become a mapping.
  const std::string shallow =
      R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"type": )"
      R"("function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}]})";
  error = ParseCompletionRequest(shallow, Endpoint::kChatCompletions, context, &params);
  ASSERT_FALSE(error.has_value()) << error->message;
  EXPECT_TRUE(params.request.prompt.starts_with("true|")) << params.request.prompt;
}

}  // namespace
}  // namespace kvl::server
