// llama-server's own endpoints on a real `kvl serve`: POST /completion (plain and streamed, the
// shapes of tools/server/README.md), GET /props, GET /slots, --alias, and --api-key guarding
// every route but /health and /v1/models.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::GreedyReference;
using testing::PostJson;
using testing::ServerProcess;
using testing::SseData;

constexpr const char* kPrompt = "Once upon a time";

class LlamaEndpointsTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"-np", "2", "--alias", "my-model"});
    ASSERT_TRUE(server_->WaitReady()) << server_->Log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static httplib::Client Client() {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(30, 0);
    return client;
  }
  static json PostOk(const std::string& path, const std::string& body) {
    httplib::Client client = Client();
    auto res = PostJson(client, path, body);
    EXPECT_TRUE(res);
    if (!res) return json();
    EXPECT_EQ(res->status, 200) << body << " -> " << res->body;
    return json::parse(res->body, nullptr, false);
  }
  static json GetOk(const std::string& path) {
    httplib::Client client = Client();
    auto res = client.Get(path.c_str());
    EXPECT_TRUE(res);
    if (!res) return json();
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body, nullptr, false);
  }
  static int64_t PromptTokens(const std::string& prompt) {
    // /tokenize adds no BOS unless asked; /completion's prompt gets one.
    const json ids = PostOk("/tokenize", json{{"content", prompt}, {"add_special", true}}.dump());
    return static_cast<int64_t>(ids["tokens"].size());
  }
  static ServerProcess* server_;
};
ServerProcess* LlamaEndpointsTest::server_ = nullptr;

TEST_F(LlamaEndpointsTest, CompletionAnswersInLlamaServersShape) {
  const std::string want = GreedyReference(kPrompt, 8);
  const json r = PostOk("/completion", R"({"prompt":"Once upon a time","n_predict":8,)"
                                       R"("temperature":0,"ignore_eos":true,"return_tokens":true})");
  EXPECT_EQ(r["content"], want);
  EXPECT_EQ(r["stop"], true);
  EXPECT_EQ(r["model"], "my-model");
  EXPECT_EQ(r["tokens_predicted"], 8);
  EXPECT_EQ(r["tokens"].size(), 8u);
  EXPECT_EQ(r["tokens_evaluated"], PromptTokens(kPrompt));
  EXPECT_EQ(r["stop_type"], "limit");
  EXPECT_EQ(r["stopping_word"], "");
  EXPECT_EQ(r["prompt"], kPrompt);
  EXPECT_EQ(r["truncated"], false);
  EXPECT_EQ(r["generation_settings"]["n_predict"], 8);
  EXPECT_EQ(r["generation_settings"]["temperature"], 0.0);
  EXPECT_EQ(r["generation_settings"]["top_k"], 40);  // llama-server's defaults on /completion
  const json& t = r["timings"];
  for (const char* key : {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms",
                          "prompt_per_second", "predicted_n", "predicted_ms",
                          "predicted_per_token_ms", "predicted_per_second"}) {
    EXPECT_TRUE(t.contains(key)) << key << " in " << t.dump();
  }
  EXPECT_EQ(t["predicted_n"], 8);
  EXPECT_EQ(t["prompt_n"].get<int64_t>() + t["cache_n"].get<int64_t>(), r["tokens_evaluated"]);
  EXPECT_GT(t["predicted_ms"].get<double>(), 0.0);
}

TEST_F(LlamaEndpointsTest, CompletionStreamsChunksThenTheFinalObjectWithoutDone) {
  const std::string want = GreedyReference(kPrompt, 12);
  httplib::Client client = Client();
  auto res = PostJson(client, "/completion",
                      R"({"prompt":"Once upon a time","n_predict":12,"temperature":0,)"
                      R"("ignore_eos":true,"stream":true})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
  EXPECT_EQ(res->body.find("[DONE]"), std::string::npos);
  const std::vector<std::string> frames = SseData(res->body);
  ASSERT_GE(frames.size(), 2u);
  std::string text;
  size_t tokens = 0;
  const int64_t prompt_tokens = PromptTokens(kPrompt);
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    const json chunk = json::parse(frames[i]);
    EXPECT_EQ(chunk["stop"], false) << frames[i];
    EXPECT_EQ(chunk["tokens_evaluated"], prompt_tokens);
    text += chunk["content"].get<std::string>();
    tokens += chunk["tokens"].size();
    EXPECT_EQ(chunk["tokens_predicted"], tokens) << frames[i];
  }
  EXPECT_EQ(text, want);
  EXPECT_EQ(tokens, 12u);
  const json last = json::parse(frames.back());
  EXPECT_EQ(last["stop"], true);
  EXPECT_EQ(last["content"], "");
  EXPECT_EQ(last["tokens_predicted"], 12);
  EXPECT_EQ(last["stop_type"], "limit");
  EXPECT_EQ(last["timings"]["predicted_n"], 12);
}

TEST_F(LlamaEndpointsTest, CompletionNamesTheStopStringItEndedAt) {
  const std::string full = GreedyReference(kPrompt, 24);
  // A word from the middle of the greedy text, and a stop string it never reaches.
  const size_t space = full.find(' ', full.size() / 2);
  ASSERT_NE(space, std::string::npos) << full;
  const size_t end = full.find(' ', space + 1);
  const std::string word = full.substr(space, end == std::string::npos ? 3 : end - space);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "plain");
    json body = {{"prompt", kPrompt}, {"n_predict", 24},
                 {"temperature", 0},  {"stop", {"zzqx", word}},
                 {"stream", stream}};
    httplib::Client client = Client();
    auto res = PostJson(client, "/completion", body.dump());
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json last = stream ? json::parse(SseData(res->body).back()) : json::parse(res->body);
    EXPECT_EQ(last["stop_type"], "word") << last.dump();
    EXPECT_EQ(last["stopping_word"], word) << last.dump();
    if (!stream) {
      EXPECT_EQ(last["content"], full.substr(0, full.find(word))) << last.dump();
    }
  }
}

TEST_F(LlamaEndpointsTest, CompletionNProbsListsTheMostLikelyTokens) {
  const json r = PostOk("/completion", R"({"prompt":"Once upon a time","n_predict":3,)"
                                       R"("temperature":0,"ignore_eos":true,"n_probs":2})");
  const json& probs = r["completion_probabilities"];
  ASSERT_EQ(probs.size(), 3u) << r.dump();
  std::string text;
  for (const json& p : probs) {
    text += p["token"].get<std::string>();
    ASSERT_EQ(p["top_logprobs"].size(), 2u);
    // Greedy: the token taken is the most likely one.
    EXPECT_EQ(p["top_logprobs"][0]["id"], p["id"]);
    EXPECT_LE(p["logprob"].get<double>(), 0.0);
    EXPECT_EQ(p["bytes"].size(), p["token"].get<std::string>().size());
  }
  EXPECT_EQ(text, r["content"]);
}

TEST_F(LlamaEndpointsTest, PropsDescribesTheServer) {
  const json props = GetOk("/props");
  EXPECT_EQ(props["total_slots"], 2);
  EXPECT_EQ(props["model_alias"], "my-model");
  EXPECT_EQ(props["model_path"], testing::Stories260KPath());
  EXPECT_TRUE(props["chat_template"].is_string());
  EXPECT_TRUE(props["build_info"].is_string());
  const json& settings = props["default_generation_settings"];
  EXPECT_GT(settings["n_ctx"].get<int64_t>(), 0);
  EXPECT_FLOAT_EQ(settings["params"]["temperature"].get<float>(), 0.8f);
  EXPECT_EQ(settings["params"]["top_k"], 40);
  EXPECT_EQ(settings["params"]["n_predict"], -1);
}

TEST_F(LlamaEndpointsTest, AliasNamesTheModelInModelsAndReplies) {
  EXPECT_EQ(GetOk("/v1/models")["data"][0]["id"], "my-model");
  const json chat = PostOk("/v1/chat/completions",
                           R"({"model":"my-model","messages":[{"role":"user","content":"Hi"}],)"
                           R"("max_tokens":2})");
  EXPECT_EQ(chat["model"], "my-model");
}

TEST_F(LlamaEndpointsTest, SlotsListEachSlotAndWhatItLastRan) {
  const json before = GetOk("/slots");
  ASSERT_EQ(before.size(), 2u) << before.dump();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(before[i]["id"], i);
    EXPECT_EQ(before[i]["is_processing"], false);
    EXPECT_GT(before[i]["n_ctx"].get<int64_t>(), 0);
  }
  const json r = PostOk("/completion", R"({"prompt":"Once upon a time","n_predict":5,)"
                                       R"("temperature":0,"ignore_eos":true})");
  const json after = GetOk("/slots");
  ASSERT_EQ(after.size(), 2u);
  const json& slot = after[r["id_slot"].get<size_t>()];
  EXPECT_EQ(slot["is_processing"], false);
  EXPECT_EQ(slot["next_token"][0]["n_decoded"], 5) << slot.dump();
  EXPECT_EQ(slot["params"]["n_predict"], 5);
  EXPECT_EQ(slot["n_prompt_tokens"], r["tokens_evaluated"]);
}

TEST(LlamaApiKeyTest, KeyGuardsEveryRouteButHealthAndModels) {
  ServerProcess server({"--api-key", "sekrit"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  EXPECT_EQ(client.Get("/health")->status, 200);
  EXPECT_EQ(client.Get("/v1/models")->status, 200);
  const httplib::Headers key = {{"Authorization", "Bearer sekrit"}};
  for (const char* path : {"/metrics", "/props", "/slots"}) {
    EXPECT_EQ(client.Get(path)->status, 401) << path;
    EXPECT_EQ(client.Get(path, key)->status, 200) << path;
  }
  const std::vector<std::pair<std::string, std::string>> posts = {
      {"/tokenize", R"({"content":"Once"})"},
      {"/detokenize", R"({"tokens":[1]})"},
      {"/completion", R"({"prompt":"Once","n_predict":1})"},
      {"/v1/completions", R"({"prompt":"Once","max_tokens":1})"}};
  for (const auto& [path, body] : posts) {
    EXPECT_EQ(PostJson(client, path, body)->status, 401) << path;
    EXPECT_EQ(PostJson(client, path, body, key)->status, 200) << path;
  }
}

}  // namespace
}  // namespace kvl
