// The third hostile probe's findings against `kvl serve` (issue 37), each on a real server
// process: JSON nested 100k deep on every route (it crashed /tokenize and /detokenize), the API
// key on /tokenize, /detokenize and /metrics and the scheme in any case, error bodies that once
// echoed megabytes or named the wrong field, the text /tokenize takes, and a streamed request
// the server can never hold (once 200, then an error frame).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;

std::string Nested(int depth) {
  return std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']');
}

bool Alive(const ServerProcess& server) { return ::kill(server.pid(), 0) == 0; }

json ErrorOf(const httplib::Result& res) {
  const json body = json::parse(res->body, nullptr, false);
  return body.is_object() && body.contains("error") ? body["error"] : json();
}

// Each route with JSON in the place it reads: 100k levels of arrays (a 200 KB body) are refused
// with a 400 naming the depth, and the server goes on answering.
TEST(HostileRequestsTest, JsonNested100kDeepIsA400OnEveryRoute) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  const std::string deep = Nested(100000);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/tokenize", R"({"content": )" + deep + "}"},
      {"/detokenize", R"({"tokens": )" + deep + "}"},
      {"/v1/completions", R"({"prompt": )" + deep + "}"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": )" + deep + "}]}"},
      {"/apply-template", R"({"messages": )" + deep + "}"},
      {"/tokenize", deep},  // the body itself, not an object
  };
  for (const auto& [path, body] : cases) {
    auto res = PostJson(client, path, body);
    ASSERT_TRUE(res) << path << ": no answer (did the server crash?)\n" << server.Log();
    EXPECT_EQ(res->status, 400) << path;
    const std::string message = ErrorOf(res).value("message", "");
    EXPECT_NE(message.find("deeper than 32 levels"), std::string::npos) << path << ": " << message;
    EXPECT_LT(res->body.size(), 400u) << path;
    ASSERT_TRUE(Alive(server)) << path << "\n" << server.Log();
  }
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto tokens = PostJson(client, "/tokenize", R"({"content": "Once upon a time"})");
  ASSERT_TRUE(tokens);
  EXPECT_EQ(json::parse(tokens->body)["tokens"].size(), 4u);
}

// A tool call's arguments hold JSON as a string, which the server parses for the template: 100k
// deep there was converted recursively. The request is answered and the server stays up.
TEST(HostileRequestsTest, JsonNestedDeepInsideAToolCallsArgumentsIsAnswered) {
  ServerProcess server({"-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  const json body = {{"messages",
                      {{{"role", "user"}, {"content", "Hi"}},
                       {{"role", "assistant"},
                        {"content", nullptr},
                        {"tool_calls",
                         {{{"type", "function"},
                           {"function", {{"name", "f"}, {"arguments", Nested(100000)}}}}}}}}}};
  auto res = PostJson(client, "/apply-template", body.dump());
  ASSERT_TRUE(res) << "no answer (did the server crash?)\n" << server.Log();
  EXPECT_LT(res->status, 500) << res->body.substr(0, 300);
  ASSERT_TRUE(Alive(server)) << server.Log();
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

httplib::Result Post(httplib::Client& client, const std::string& path, const std::string& body,
                     const std::string& authorization) {
  httplib::Headers headers;
  if (!authorization.empty()) headers.emplace("Authorization", authorization);
  return PostJson(client, path, body, headers);
}

// With --api-key, /tokenize, /detokenize and /metrics need the key too (they were open to anyone);
// /health does not. The scheme is matched in any case, the key exactly.
TEST(HostileRequestsTest, TheApiKeyGuardsTokenizeDetokenizeAndMetrics) {
  ServerProcess server({"--api-key", "sekret", "-np", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  const std::string tokenize = R"({"content": "Once"})";
  const std::string detokenize = R"({"tokens": [403]})";
  for (const auto& [path, body] : {std::pair{"/tokenize", tokenize}, {"/detokenize", detokenize}}) {
    auto missing = Post(client, path, body, "");
    ASSERT_TRUE(missing);
    EXPECT_EQ(missing->status, 401) << path;
    EXPECT_EQ(ErrorOf(missing)["code"], "invalid_api_key") << path;
    auto wrong = Post(client, path, body, "Bearer sekreT");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << path;
    for (const std::string scheme : {"Bearer sekret", "bearer sekret", "BEARER  sekret"}) {
      auto right = Post(client, path, body, scheme);
      ASSERT_TRUE(right);
      EXPECT_EQ(right->status, 200) << path << " with '" << scheme << "': " << right->body;
    }
    auto no_space = Post(client, path, body, "Bearersekret");
    ASSERT_TRUE(no_space);
    EXPECT_EQ(no_space->status, 401) << path;
  }
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 401);
  auto metrics_keyed = client.Get("/metrics", {{"Authorization", "bearer sekret"}});
  ASSERT_TRUE(metrics_keyed);
  EXPECT_EQ(metrics_keyed->status, 200);
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // The lower-case scheme on a completion too (it was refused there).
  auto completion =
      Post(client, "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", "bearer sekret");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 200) << completion->body;
}

TEST(HostileRequestsTest, ApiKeyOpenOpensOnlyTheRoutesItNames) {
  ServerProcess server({"--api-key", "sekret", "--api-key-open", "/metrics,/tokenize"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  auto tokenize = Post(client, "/tokenize", R"({"content": "Once"})", "");
  ASSERT_TRUE(tokenize);
  EXPECT_EQ(tokenize->status, 200);
  auto detokenize = Post(client, "/detokenize", R"({"tokens": [403]})", "");
  ASSERT_TRUE(detokenize);
  EXPECT_EQ(detokenize->status, 401);
  auto completion = Post(client, "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", "");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 401);

  // Only the three read-only routes can be opened.
  ServerProcess refused({"--api-key", "k", "--api-key-open", "/v1/completions"});
  EXPECT_EQ(refused.WaitExit(/*seconds=*/30), 1);
  EXPECT_NE(refused.Log().find("--api-key-open '/v1/completions'"), std::string::npos)
      << refused.Log();
}

// A 6 MiB model name was echoed whole in the 404; an out-of-vocabulary logit_bias named
// `param: "prompt"`; a long value in a token list was printed whole.
TEST(HostileRequestsTest, ErrorBodiesAreBoundedAndNameTheirField) {
  ServerProcess server({"-np", "1", "--max-body", "16MiB"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  const std::string huge(6 << 20, 'm');
  auto model =
      PostJson(client, "/v1/completions", json{{"prompt", "Once"}, {"model", huge}}.dump());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 404);
  EXPECT_LT(model->body.size(), 400u);
  EXPECT_EQ(ErrorOf(model)["param"], "model");
  EXPECT_NE(ErrorOf(model)["message"].get<std::string>().find("(6291456 bytes)"), std::string::npos)
      << model->body;

  auto detokenize = PostJson(client, "/detokenize", json{{"tokens", {1, huge}}}.dump());
  ASSERT_TRUE(detokenize);
  EXPECT_EQ(detokenize->status, 400);
  EXPECT_LT(detokenize->body.size(), 400u);
  EXPECT_EQ(ErrorOf(detokenize)["param"], "tokens");

  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    json body = {{"max_tokens", 2}, {"logit_bias", {{"600", 5}}}};
    if (path == "/v1/completions") {
      body["prompt"] = "Once";
    } else {
      body["messages"] = {{{"role", "user"}, {"content", "Hi"}}};
    }
    auto bias = PostJson(client, path, body.dump());
    ASSERT_TRUE(bias);
    EXPECT_EQ(bias->status, 400) << path;
    EXPECT_EQ(ErrorOf(bias)["param"], "logit_bias") << path << ": " << bias->body;
    EXPECT_NE(ErrorOf(bias)["message"].get<std::string>().find("600"), std::string::npos);
  }
}

// /tokenize takes what a prompt may hold (the context's tokens at the longest token's bytes), as
// /v1/ does, refusing more before tokenizing it; what fits is tokenized.
TEST(HostileRequestsTest, TokenizeTakesAtMostWhatAPromptCanHold) {
  ServerProcess server({"-np", "1", "-c", "256"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  auto refused = PostJson(client, "/tokenize", json{{"content", std::string(4 << 20, 'a')}}.dump());
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(ErrorOf(refused)["param"], "content");
  EXPECT_NE(ErrorOf(refused)["message"].get<std::string>().find("4194304 bytes"), std::string::npos)
      << refused->body;
  // A list of strings counts them all.
  auto list =
      PostJson(client, "/tokenize",
               json{{"content", {std::string(3 << 20, 'a'), 5, std::string(3 << 20, 'b')}}}.dump());
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 400);
  // 256 tokens of 'a' fit (each is at most the longest token's bytes).
  auto fits = PostJson(client, "/tokenize", json{{"content", std::string(256, 'a')}}.dump());
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200) << fits->body.substr(0, 300);
  EXPECT_EQ(json::parse(fits->body)["tokens"].size(), 256u);
}

// A lossy server admits any request (pages may move, so nothing bounds it at Submit); the one
// its budget can never hold is found by the scheduler before its first token. Unstreamed that
// was a 400, streamed a 200 and then an error frame: now the same 400 either way, and a stream
// that fits still gets its 200, frames and [DONE].
TEST(HostileRequestsTest, AStreamTheServerCanNeverHoldGetsItsErrorBeforeAnyHead) {
  // f32 KV (the default is f16, whose blocks are half the size): 64 KiB then holds fewer than
  // the 404 tokens asked for.
  ServerProcess server({"-np", "1", "--kv-policy", "auto", "--kv-quality", "balanced",
                        "--kv-budget", "64KiB", "-ctk", "f32", "-ctv", "f32"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(60, 0);
  json prompt = json::array();
  for (int i = 0; i < 400; ++i) prompt.push_back(3 + i % 500);
  const json plain_body = {{"prompt", prompt}, {"max_tokens", 4}};
  json stream_body = plain_body;
  stream_body["stream"] = true;
  auto plain = PostJson(client, "/v1/completions", plain_body.dump());
  auto streamed = PostJson(client, "/v1/completions", stream_body.dump());
  ASSERT_TRUE(plain);
  ASSERT_TRUE(streamed);
  EXPECT_EQ(plain->status, 400) << plain->body;
  EXPECT_EQ(streamed->status, 400) << streamed->body.substr(0, 400);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(ErrorOf(streamed)["code"], "kv_budget_exceeded") << streamed->body.substr(0, 400);
  EXPECT_EQ(ErrorOf(plain)["code"], "kv_budget_exceeded") << plain->body;
  // (As a prompt or, once admitted, as a sequence: which of the two found it may differ.)
  for (const auto* res : {&plain, &streamed}) {
    EXPECT_NE(ErrorOf(*res)["message"].get<std::string>().find("400 tokens"), std::string::npos)
        << (*res)->body;
  }

  const json chat = {
      {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}, {"stream", true}};
  auto fits = PostJson(client, "/v1/chat/completions", chat.dump());
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200) << fits->body;
  const std::vector<std::string> frames = testing::SseData(fits->body);
  ASSERT_GE(frames.size(), 3u) << fits->body;
  EXPECT_EQ(json::parse(frames.front())["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(frames.back(), "[DONE]");
  EXPECT_FALSE(fits->get_header_value("X-Request-Id").empty());
}

}  // namespace
}  // namespace kvl
