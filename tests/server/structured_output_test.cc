// Structured output over HTTP (issue 42) from a real `kvl serve` on stories260K: response_format
// json_schema and json_object on /v1/chat/completions, llama-server's json_schema and grammar
// fields on /v1/completions, plain and streamed, greedy and sampled; every reply is JSON the
// schema accepts. Schemas and grammars it cannot honour are 400s naming the field and keyword.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "grammar/json_schema_check.h"
#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;
using testing::SseData;

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    "born": {"type": "string", "format": "date"}
  },
  "required": ["name", "age", "pets"],
  "additionalProperties": false
})");

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"-np", "4", "-c", "2048"});
    ASSERT_TRUE(server_->WaitReady()) << "kvl serve did not become ready";
  }
  static void TearDownTestSuite() { delete server_; }

  // The reply's text (joined from a stream's deltas), its finish reason and status.
  struct Reply {
    int status = 0;
    std::string text;
    std::string finish_reason;
    std::string body;
  };
  Reply Post(const std::string& path, const json& body) {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(60, 0);
    auto res = PostJson(client, path, body.dump());
    Reply reply;
    if (!res) return reply;
    reply.status = res->status;
    reply.body = res->body;
    if (res->status != 200) return reply;
    const bool chat = path == "/v1/chat/completions";
    if (body.value("stream", false)) {
      for (const std::string& frame : SseData(res->body)) {
        if (frame == "[DONE]") continue;
        const json chunk = json::parse(frame);
        if (chunk["choices"].empty()) continue;
        const json& choice = chunk["choices"][0];
        if (chat && choice["delta"].contains("content") && choice["delta"]["content"].is_string()) {
          reply.text += choice["delta"]["content"].get<std::string>();
        }
        if (!chat) reply.text += choice.value("text", "");
        if (choice["finish_reason"].is_string()) reply.finish_reason = choice["finish_reason"];
      }
    } else {
      const json choice = json::parse(res->body)["choices"][0];
      reply.text = chat ? choice["message"]["content"].get<std::string>()
                        : choice["text"].get<std::string>();
      reply.finish_reason = choice["finish_reason"];
    }
    return reply;
  }
  static ServerProcess* server_;
};
ServerProcess* StructuredOutputTest::server_ = nullptr;

json Chat(float temperature, int seed, bool stream) {
  return {{"messages", {{{"role", "user"}, {"content", "Tell me about a girl and her pets."}}}},
          {"temperature", temperature},
          {"seed", seed},
          {"max_tokens", 1500},
          {"stream", stream}};
}

TEST_F(StructuredOutputTest, ChatJsonSchemaRepliesValidate) {
  const testing::SchemaChecker checker(kSchema);
  int replies = 0;
  for (const bool stream : {false, true}) {
    for (const auto& [temperature, seed] : std::vector<std::pair<float, int>>{{0, 1}, {1, 2}, {1, 3}}) {
      json body = Chat(temperature, seed, stream);
      body["response_format"] = {
          {"type", "json_schema"},
          {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", kSchema}}}};
      const Reply reply = Post("/v1/chat/completions", body);
      ASSERT_EQ(reply.status, 200) << reply.body;
      EXPECT_EQ(reply.finish_reason, "stop") << reply.text;
      const json value = json::parse(reply.text, nullptr, false);
      ASSERT_FALSE(value.is_discarded()) << "not JSON: " << reply.text;
      EXPECT_EQ(checker.Check(value), "") << reply.text;
      ++replies;
    }
  }
  EXPECT_EQ(replies, 6);
}

TEST_F(StructuredOutputTest, JsonObjectAndLlamaServerFields) {
  // json_object: an object, whatever its members (bounded by max_tokens, so a reply cut by the
  // length is allowed to be a prefix only).
  json body = Chat(0, 1, false);
  body["response_format"] = {{"type", "json_object"}};
  const Reply object = Post("/v1/chat/completions", body);
  ASSERT_EQ(object.status, 200) << object.body;
  if (object.finish_reason == "stop") {
    EXPECT_TRUE(json::parse(object.text, nullptr, false).is_object()) << object.text;
  } else {
    EXPECT_EQ(object.text.rfind("{", 0), 0u) << object.text;
  }

  // llama-server's json_schema field on legacy completions.
  const Reply schema = Post("/v1/completions", {{"prompt", "Once upon a time"},
                                                {"max_tokens", 1500},
                                                {"temperature", 1},
                                                {"seed", 5},
                                                {"json_schema", kSchema}});
  ASSERT_EQ(schema.status, 200) << schema.body;
  EXPECT_EQ(schema.finish_reason, "stop");
  EXPECT_EQ(testing::SchemaChecker(kSchema).Check(json::parse(schema.text)), "") << schema.text;

  // llama-server's grammar field, streamed.
  const Reply grammar = Post("/v1/completions", {{"prompt", "Once upon a time"},
                                                 {"max_tokens", 50},
                                                 {"temperature", 1},
                                                 {"seed", 9},
                                                 {"stream", true},
                                                 {"grammar", "root ::= (\"yes\" | \"no\") \".\""}});
  ASSERT_EQ(grammar.status, 200) << grammar.body;
  EXPECT_TRUE(grammar.text == "yes." || grammar.text == "no.") << grammar.text;
  EXPECT_EQ(grammar.finish_reason, "stop");
}

TEST_F(StructuredOutputTest, RefusalsNameTheFieldAndTheKeyword) {
  struct Case {
    const char* fields;  // JSON members added to the body
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "not": {}}}}})",
       "response_format", "'not' at #: this keyword is not supported"},
      {R"({"json_schema": {"type": "array", "uniqueItems": true}})", "json_schema", "'uniqueItems'"},
      {R"({"grammar": "root ::= [a-"})", "grammar", "line 1, column 13: unexpected end"},
      {R"({"grammar": "root ::= x"})", "grammar", "rule 'x' is used but never defined"},
      {R"({"response_format": {"type": "yaml"}})", "response_format", "'yaml' is not one of"},
      {R"({"response_format": {"type": "json_schema"}})", "response_format", "needs 'json_schema'"},
      {R"({"grammar": "root ::= \"a\"", "json_schema": {"type": "string"}})", "grammar",
       "'json_schema' and 'grammar' both constrain the reply"},
  };
  for (const Case& c : cases) {
    json body = {{"prompt", "Once"}, {"max_tokens", 4}};
    body.update(json::parse(c.fields));
    const Reply reply = Post("/v1/completions", body);
    ASSERT_EQ(reply.status, 400) << c.fields << ": " << reply.body;
    const json error = json::parse(reply.body)["error"];
    EXPECT_EQ(error["param"], c.param) << reply.body;
    EXPECT_NE(error["message"].get<std::string>().find(c.says), std::string::npos) << reply.body;
  }
}

// A grammar that dead-ends (after "{" it wants a UTF-16 surrogate, which no UTF-8 text holds):
// the reply ends at once with finish_reason "error" and the error beside the text so far, plain
// and streamed; never a hang, never a 5xx.
TEST_F(StructuredOutputTest, AGrammarThatDeadEndsEndsWithFinishReasonErrorAndTheError) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 50},
                     {"grammar", "root ::= \"{\" [\\uD800-\\uDFFF]"}};
  httplib::Client client("127.0.0.1", server_->port());
  client.set_read_timeout(60, 0);
  auto plain = PostJson(client, "/v1/chat/completions", body.dump());
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const json answer = json::parse(plain->body);
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "error") << plain->body;
  EXPECT_EQ(answer["choices"][0]["message"]["content"], "{") << plain->body;
  EXPECT_EQ(answer["error"]["code"], "grammar_dead_end") << plain->body;
  EXPECT_NE(answer["error"]["message"].get<std::string>().find("the grammar allows no token"),
            std::string::npos)
      << plain->body;
  json streamed = body;
  streamed["stream"] = true;
  auto stream = PostJson(client, "/v1/chat/completions", streamed.dump());
  ASSERT_TRUE(stream);
  ASSERT_EQ(stream->status, 200) << stream->body;
  const std::vector<std::string> frames = SseData(stream->body);
  ASSERT_GE(frames.size(), 3u) << stream->body;
  EXPECT_EQ(frames.back(), "[DONE]");
  EXPECT_EQ(json::parse(frames[frames.size() - 2])["error"]["code"], "grammar_dead_end")
      << stream->body;
  EXPECT_EQ(json::parse(frames[frames.size() - 3])["choices"][0]["finish_reason"], "error")
      << stream->body;
}

}  // namespace
}  // namespace kvl
