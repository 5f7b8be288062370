// `kvl serve` as a real process on a free loopback port, driven over HTTP: completions and chat
// (plain and streamed) against Engine::Generate, every class of bad request, 16 concurrent
// clients, a client leaving mid-stream, /metrics as Prometheus text, SIGTERM.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kvl/engine.h"
#include "prometheus_check.h"
#include "server_process.h"
#include "test_paths.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::FreeLoopbackPort;
using testing::GreedyReference;
using testing::PostJson;
using testing::ServerProcess;
using testing::SseData;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"-np", "8", "--max-body", "64KiB"});
    ASSERT_TRUE(server_->WaitReady()) << "kvl serve did not become ready";
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  double Metric(const std::string& line_prefix) {
    auto client = Client();
    auto res = client.Get("/metrics");
    if (!res) return -1;
    size_t pos = res->body.find("\n" + line_prefix + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(res->body.substr(pos + line_prefix.size() + 2));
  }
  static ServerProcess* server_;
};
ServerProcess* ServerTest::server_ = nullptr;

TEST_F(ServerTest, CompletionEqualsEngineGenerate) {
  auto client = Client();
  auto res = PostJson(client, "/v1/completions",
                      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":40,"temperature":0})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(body["model"], "stories260K");
  EXPECT_GT(body["created"].get<int64_t>(), 0);
  EXPECT_EQ(body["choices"][0]["text"], GreedyReference("Once upon a time", 40));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 40);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 45);
  EXPECT_TRUE(body["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST_F(ServerTest, ChatEqualsEngineGenerateThroughThePlainTemplate) {
  auto client = Client();
  auto res = PostJson(client, "/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"The little dog"}],
                          "max_completion_tokens":24,"temperature":0})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], GreedyReference("The little dog", 24));
}

TEST_F(ServerTest, StopStringEndsWithFinishReasonStop) {
  const std::string reference = GreedyReference("Once upon a time", 40);
  auto client = Client();
  auto res = PostJson(client, "/v1/completions",
                      R"({"prompt":"Once upon a time","max_tokens":40,"temperature":0,"stop":["Lily"]})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["text"], reference.substr(0, reference.find("Lily")));
}

TEST_F(ServerTest, StreamedChatSendsRoleTokensFinishUsageAndDone) {
  auto client = Client();
  auto res = PostJson(client, "/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":20,
                          "temperature":0,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<std::string> frames = SseData(res->body);
  ASSERT_GE(frames.size(), 4u) << res->body;
  EXPECT_EQ(frames.back(), "[DONE]");
  const json first = json::parse(frames[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 3 < frames.size(); ++i) {
    text += json::parse(frames[i])["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(frames.size(), 1 + 20 + 3u);  // role, one per token, finish, usage, [DONE]
  EXPECT_EQ(text, GreedyReference("Once upon a time", 20));
  const json finish = json::parse(frames[frames.size() - 3]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  const json usage = json::parse(frames[frames.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 20);
}

TEST_F(ServerTest, StreamedCompletionTextEqualsThePlainOne) {
  auto client = Client();
  auto res = PostJson(client, "/v1/completions",
                      R"({"prompt":"Lily wanted to","max_tokens":16,"temperature":0,"stream":true})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::vector<std::string> frames = SseData(res->body);
  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 2 < frames.size(); ++i) {
    text += json::parse(frames[i])["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, GreedyReference("Lily wanted to", 16));
  EXPECT_EQ(json::parse(frames[frames.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, ModelsAndHealth) {
  auto client = Client();
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "stories260K");
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

struct BadRequest {
  std::string path;
  std::string body;
  int status;
  std::string param;  // expected error.param; "" = not checked
};

TEST_F(ServerTest, EveryBadRequestGetsA4xxWithOpenAiErrorJson) {
  const std::string long_prompt = [] {
    std::string p;
    for (int i = 0; i < 1200; ++i) p += "Once upon a time ";
    return p;
  }();
  const std::vector<BadRequest> cases = {
      {"/v1/completions", "not json", 400, ""},
      {"/v1/completions", "[1,2]", 400, ""},
      {"/v1/completions", "\"text\"", 400, ""},
      {"/v1/completions", std::string(200, '[') + std::string(200, ']'), 400, ""},
      {"/v1/completions", "{\"prompt\":\"\xff\xfe\"}", 400, ""},
      {"/v1/completions", "{}", 400, "prompt"},
      {"/v1/completions", R"({"prompt":""})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":["a","b"]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[99999999]})", 400, "prompt"},
      {"/v1/completions", "{\"prompt\":\"" + long_prompt + "\"}", 400, "prompt"},
      {"/v1/completions", R"({"prompt":"x","model":"gpt-4"})", 404, "model"},
      {"/v1/completions", R"({"prompt":"x","model":7})", 400, "model"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":-1})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":100000000000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":"10"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":1.5})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","temperature":-1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"x","temperature":"hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"x","top_p":0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt":"x","top_p":1.5})", 400, "top_p"},
      {"/v1/completions", R"({"prompt":"x","top_k":-5})", 400, "top_k"},
      {"/v1/completions", R"({"prompt":"x","min_p":2})", 400, "min_p"},
      {"/v1/completions", R"({"prompt":"x","seed":"abc"})", 400, "seed"},
      {"/v1/completions", R"({"prompt":"x","stop":5})", 400, "stop"},
      {"/v1/completions", R"({"prompt":"x","stop":[""]})", 400, "stop"},
      {"/v1/completions", R"({"prompt":"x","n":2})", 400, "n"},
      {"/v1/completions", R"({"prompt":"x","stream":"yes"})", 400, "stream"},
      {"/v1/completions", R"({"prompt":"x","stream_options":3})", 400, "stream_options"},
      {"/v1/completions", R"({"prompt":"x","logprobs":21})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt":"x","logprobs":-1})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt":"x","logprobs":true})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt":"x","logprobs":"5"})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt":"x","logprobs":2.5})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt":"x","echo":true})", 400, "echo"},
      {"/v1/chat/completions", "{}", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[]})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":"hi"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[5]})", 400, "messages[0]"},
      {"/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"x"}]})", 400,
       "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user"}]})", 400, "messages[0].content"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":7}]})", 400,
       "messages[0].content"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":""}]})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", 400,
       "logprobs"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", 400,
       "top_logprobs"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1})", 400,
       "top_logprobs"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":"3"})", 400,
       "top_logprobs"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})",
       400, "top_logprobs"},
      {"/v1/completions", std::string(100 * 1024, ' '), 413, ""},
  };
  auto client = Client();
  for (const BadRequest& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body.substr(0, 120));
    auto res = PostJson(client, c.path, c.body);
    ASSERT_TRUE(res) << "no response";
    EXPECT_EQ(res->status, c.status) << res->body;
    const json body = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << res->body;
    ASSERT_TRUE(body.contains("error"));
    const json& e = body["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("param"));
    EXPECT_TRUE(e.contains("code"));
    if (!c.param.empty()) {
      EXPECT_EQ(e["param"], c.param) << res->body;
    }
  }
  auto not_found = client.Get("/v1/nothing");
  ASSERT_TRUE(not_found);
  EXPECT_EQ(not_found->status, 404);
  EXPECT_TRUE(json::parse(not_found->body)["error"]["message"].is_string());
  auto wrong_method = client.Get("/v1/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "POST");
  auto wrong_method2 = client.Delete("/v1/models");
  ASSERT_TRUE(wrong_method2);
  EXPECT_EQ(wrong_method2->status, 405);
  // Still serving.
  auto ok = PostJson(client, "/v1/completions", R"({"prompt":"x","max_tokens":2})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// choices[0].text of a completion body or chunk; nothing when it has none.
std::optional<std::string> ChoiceText(const json& j) {
  if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
      j["choices"].empty()) {
    return std::nullopt;
  }
  const json& choice = j["choices"][0];
  if (!choice.is_object() || !choice.contains("text") || !choice["text"].is_string()) {
    return std::nullopt;
  }
  return choice["text"].get<std::string>();
}

TEST_F(ServerTest, SixteenConcurrentClientsGetTheirAloneOutputs) {
  const std::vector<std::string>& prompts = testing::StoryPrompts();
  std::vector<std::string> references;
  for (const std::string& p : prompts) references.push_back(GreedyReference(p, 32));
  constexpr int kClients = 16;
  // The threads only record what came back; everything is parsed and checked here, so a bad
  // answer fails with its body instead of throwing in a thread (which would abort the binary).
  std::vector<int> statuses(kClients, 0);
  std::vector<std::string> bodies(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto client = Client();
      const json request = {{"prompt", prompts[size_t(i) % prompts.size()]},
                            {"max_tokens", 32},
                            {"temperature", 0},
                            {"stream", i % 2 == 1}};
      auto res = PostJson(client, "/v1/completions", request.dump());
      if (!res) {
        bodies[size_t(i)] = "no response: " + httplib::to_string(res.error());
        return;
      }
      statuses[size_t(i)] = res->status;
      bodies[size_t(i)] = res->body;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    SCOPED_TRACE(fmt::format("client {}: {}", i, bodies[size_t(i)].substr(0, 2000)));
    EXPECT_EQ(statuses[size_t(i)], 200);
    std::string text;
    bool parsed = true;
    if (i % 2 == 0) {
      const std::optional<std::string> t =
          ChoiceText(json::parse(bodies[size_t(i)], nullptr, false));
      parsed = t.has_value();
      text = t.value_or("");
    } else {
      for (const std::string& frame : SseData(bodies[size_t(i)])) {
        if (frame == "[DONE]") break;
        const std::optional<std::string> t = ChoiceText(json::parse(frame, nullptr, false));
        parsed = parsed && t.has_value();
        text += t.value_or("");
      }
    }
    EXPECT_TRUE(parsed);
    EXPECT_EQ(text, references[size_t(i) % prompts.size()]);
  }
}

TEST_F(ServerTest, ClientLeavingMidStreamCancelsItsRequest) {
  const double cancels_before = Metric("kvl:request_disconnect_cancels_total");
  const double aborts_before = Metric("kvl:request_success_total{finished_reason=\"abort\"}");
  auto client = Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt":"Once upon a time","max_tokens":2000,"temperature":0,"stream":true})";
  req.set_header("Content-Type", "application/json");
  int frames = 0;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    frames += static_cast<int>(std::string(data, len).find("data: ") != std::string::npos);
    return frames < 3;  // leave after a few tokens
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  client.send(req, res, error);
  EXPECT_GE(frames, 3);
  // The server notices at its next write, cancels, and the request ends as "abort" long before
  // its 2000 tokens.
  bool cancelled = false;
  for (int i = 0; i < 200 && !cancelled; ++i) {
    cancelled = Metric("kvl:request_disconnect_cancels_total") > cancels_before &&
                Metric("kvl:request_success_total{finished_reason=\"abort\"}") > aborts_before;
    if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(cancelled);
}

TEST_F(ServerTest, MetricsAreValidPrometheusText) {
  auto client = Client();
  ASSERT_TRUE(PostJson(client, "/v1/completions", R"({"prompt":"The cat sat on","max_tokens":8})"));
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_TRUE(res->get_header_value("Content-Type").starts_with("text/plain"));
  const testing::PrometheusCheck check = testing::CheckPrometheusText(res->body);
  EXPECT_TRUE(check.errors.empty()) << check.errors.front();
  for (const char* family :
       {"kvl:kv_tier_bytes_used", "kvl:kv_tier_pages_in_total", "kvl:num_requests_running",
        "kvl:num_requests_waiting", "kvl:prompt_tokens_total", "kvl:generation_tokens_total",
        "kvl:time_to_first_token_seconds", "kvl:inter_token_latency_seconds",
        "kvl:e2e_request_latency_seconds", "kvl:kv_cache_usage_perc",
        "kvl:prefix_cache_queries_total", "kvl:prefix_cache_hits_total", "kvl:kv_pages_total",
        "kvl:kv_bytes_total", "kvl:kv_checksum_failures_total",
        "kvl:kv_pages_promoted_back_total",
        // speculative decoding (issue 26)
        "kvl:spec_draft_tokens_total", "kvl:spec_accepted_tokens_total",
        "kvl:spec_acceptance_rate", "kvl:spec_tokens_per_step"}) {
    EXPECT_TRUE(check.types.count(family)) << family;
  }
  EXPECT_EQ(check.types.at("kvl:time_to_first_token_seconds"), "histogram");
  EXPECT_GT(Metric("kvl:generation_tokens_total"), 0);
  EXPECT_GE(Metric("kvl:spec_tokens_per_step"), 1.0);  // a token a step at least
}

// Each --kv-tier is exported as its own series, labelled tier="<name>".
TEST(ServeProcessTest, MetricsExportEachKvTier) {
  ServerProcess server({"--kv-tier", "ram:64MiB", "-np", "2"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  ASSERT_TRUE(PostJson(client, "/v1/completions", R"({"prompt":"The cat sat on","max_tokens":8})"));
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const testing::PrometheusCheck check = testing::CheckPrometheusText(res->body);
  EXPECT_TRUE(check.errors.empty()) << check.errors.front();
  const std::map<std::string, std::string> families = {
      {"kvl:kv_tier_capacity_bytes", "gauge"},
      {"kvl:kv_tier_bytes_used", "gauge"},
      {"kvl:kv_tier_pages", "gauge"},
      {"kvl:kv_tier_lookups_total", "counter"},
      {"kvl:kv_tier_hits_total", "counter"},
      {"kvl:kv_tier_hit_tokens_total", "counter"},
      {"kvl:kv_tier_pages_in_total", "counter"},
      {"kvl:kv_tier_bytes_in_total", "counter"},
      {"kvl:kv_tier_pages_out_total", "counter"},
      {"kvl:kv_tier_bytes_out_total", "counter"},
      {"kvl:kv_tier_checksum_failures_total", "counter"},
      {"kvl:kv_tier_evictions_total", "counter"},
      {"kvl:kv_tier_errors_total", "counter"},
      {"kvl:kv_tier_blocks_promoted_total", "counter"},
      {"kvl:kv_tier_promote_predicted_seconds_total", "counter"},
      {"kvl:kv_tier_promote_seconds_total", "counter"}};
  for (const auto& [family, type] : families) {
    ASSERT_TRUE(check.types.count(family)) << family;
    EXPECT_EQ(check.types.at(family), type) << family;
    // Family names are [a-z_:]: nothing in them is special to a regex.
    const std::regex sample("\n" + family + R"(\{tier="ram"\} [0-9.e+]+\n)");
    EXPECT_TRUE(std::regex_search(res->body, sample)) << family << "\n" << res->body;
  }
  const std::regex capacity(R"(\nkvl:kv_tier_capacity_bytes\{tier="ram"\} (\S+)\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(res->body, m, capacity));
  EXPECT_EQ(std::stod(m[1]), 64.0 * 1024 * 1024);
}

// `kvl bench serve` run as a process (under `timeout`, so a hang fails the test): stdout and the
// exit status.
struct BenchServeRun {
  int status = -1;
  std::string out;
};
BenchServeRun RunBenchServe(const std::string& flags) {
  const std::string command =
      std::string("timeout 120 ") + KVL_KVL_BINARY + " bench serve " + flags + " 2>/dev/null";
  BenchServeRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) run.out.append(buf, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

TEST_F(ServerTest, BenchServeLoadsTheServerPlainAndStreamed) {
  for (const char* stream : {"", " --stream"}) {
    SCOPED_TRACE(stream);
    const BenchServeRun run = RunBenchServe(
        fmt::format("--host 127.0.0.1 --port {} -n 8 --concurrency 4 --max-tokens 8 "
                    "--prompt-tokens 12 --shared-prefix 6 -o json{}",
                    server_->port(), stream));
    ASSERT_EQ(run.status, 0) << run.out;
    const json j = json::parse(run.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << run.out;
    EXPECT_EQ(j["requests_ok"], 8);
    EXPECT_EQ(j["requests_failed"], 0);
    EXPECT_EQ(j["output_tokens"], 64);  // ignore_eos: every request makes max_tokens
    EXPECT_GT(j["ttft_ms"]["mean"].get<double>(), 0);
    EXPECT_GT(j["ttft_ms"]["p99"].get<double>(), 0);
    EXPECT_GT(j["output_throughput"].get<double>(), 0);
    EXPECT_GT(j["duration_s"].get<double>(), 0);
    if (*stream) {
      // Frames that reach the client in one read share its arrival time, so on a loaded machine
      // every gap can be 0 (seen once in 9 runs beside two busy loops); TPOT spans the request.
      EXPECT_GE(j["itl_ms"]["mean"].get<double>(), 0);
      EXPECT_LE(j["itl_ms"]["mean"].get<double>(), j["e2e_ms"]["mean"].get<double>());
      EXPECT_GT(j["tpot_ms"]["mean"].get<double>(), 0);
      // TTFT is the first token frame, before the end of the request.
      EXPECT_LT(j["ttft_ms"]["mean"].get<double>(), j["e2e_ms"]["mean"].get<double>());
    }
  }
  // Random token ids: exact prompt lengths, and the shared 16 tokens (one block) are found in the
  // prefix cache by every request after the first (run one at a time).
  const BenchServeRun ids = RunBenchServe(
      fmt::format("--port {} -n 4 --concurrency 1 --max-tokens 4 --random-ids --prompt-tokens 20 "
                  "--shared-prefix 16 -o json --seed 7",
                  server_->port()));
  ASSERT_EQ(ids.status, 0) << ids.out;
  const json j = json::parse(ids.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ids.out;
  EXPECT_EQ(j["requests_ok"], 4);
  EXPECT_EQ(j["prompt_tokens_mean"], 20.0);
  EXPECT_EQ(j["cached_tokens_mean"], 12.0);  // 0, 16, 16, 16
  // The markdown table, at a Poisson rate.
  const BenchServeRun md = RunBenchServe(fmt::format(
      "--port {} -n 4 --rate 50 --max-tokens 4 --prompt-tokens 8", server_->port()));
  ASSERT_EQ(md.status, 0) << md.out;
  EXPECT_NE(md.out.find("| requests ok | 4 |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("TTFT"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| prompt tokens, mean (cached) |"), std::string::npos) << md.out;
}

// Nobody listening: every request fails at once, the report says so and the exit status is 1.
TEST(BenchServeTest, NoServerFailsEveryRequestAndExitsNonzero) {
  const int port = FreeLoopbackPort();
  const auto start = std::chrono::steady_clock::now();
  const BenchServeRun run = RunBenchServe(
      fmt::format("--port {} -n 4 --concurrency 2 --max-tokens 4 --timeout 5 -o json", port));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(run.status, 1) << run.out;
  const json j = json::parse(run.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << run.out;
  EXPECT_EQ(j["requests_ok"], 0);
  EXPECT_EQ(j["requests_failed"], 4);
  EXPECT_TRUE(j.contains("first_error"));
}

TEST(BenchServeTest, BadFlagsAreRefused) {
  EXPECT_EQ(RunBenchServe("--port 0").status, 1);
  EXPECT_EQ(RunBenchServe("--port 8080 --concurrency 2 --rate 3").status, 1);
  EXPECT_EQ(RunBenchServe("--port 8080 -o xml").status, 1);
}

TEST(PrometheusCheckTest, RefusesMalformedText) {
  EXPECT_TRUE(testing::CheckPrometheusText("# TYPE a counter\na 1\n").errors.empty());
  EXPECT_FALSE(testing::CheckPrometheusText("a 1\n").errors.empty());            // no TYPE
  EXPECT_FALSE(testing::CheckPrometheusText("# TYPE a counter\na x\n").errors.empty());
  EXPECT_FALSE(testing::CheckPrometheusText("# TYPE a counter\na{b=c} 1\n").errors.empty());
  EXPECT_FALSE(testing::CheckPrometheusText("# TYPE 1a counter\n1a 1\n").errors.empty());
  EXPECT_FALSE(testing::CheckPrometheusText("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                            "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n")
                   .errors.empty());  // buckets not cumulative
}

TEST(ServeProcessTest, ApiKeyIsRequiredAndSigtermExitsZeroAfterRunningRequests) {
  ServerProcess server({"--api-key", "sekret", "-np", "2"});
  ASSERT_TRUE(server.WaitReady());
  httplib::Client client("127.0.0.1", server.port());
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":4})";
  auto missing = PostJson(client, "/v1/completions", body);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], "invalid_api_key");
  auto wrong = PostJson(client, "/v1/completions", body, {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto right = PostJson(client, "/v1/completions", body, {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);

  // A long request in flight when SIGTERM comes: it is finished (or cancelled after the grace
  // period) and the server exits 0.
  int in_flight_status = 0;
  std::thread in_flight([&] {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(30, 0);
    auto res = PostJson(c, "/v1/completions", R"({"prompt":"Once upon a time","max_tokens":1500})",
                        {{"Authorization", "Bearer sekret"}});
    in_flight_status = res ? res->status : -1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(server.Terminate(/*seconds=*/20), 0);
  in_flight.join();
  EXPECT_EQ(in_flight_status, 200);
}

}  // namespace
}  // namespace kvl
