// `kvl serve` under the failures a hostile or unlucky user meets: a model that cannot load, a KV
// budget too small for what is asked, pressure that once made a request livelock.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server_process.h"
#include "test_paths.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;

// stories260K with its `general.architecture` value renamed: a well-formed GGUF of an
// architecture the engine does not run.
std::string UnsupportedArchitectureModel() {
  std::ifstream in(testing::Stories260KPath(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "general.architecture";
  const size_t at = bytes.find(key);
  EXPECT_NE(at, std::string::npos);
  // key, then the value's type (u32) and length (u64), then "llama".
  const size_t value = at + key.size() + 4 + 8;
  EXPECT_EQ(bytes.substr(value, 5), "llama");
  bytes.replace(value, 5, "zzzzz");
  const std::string path =
      ::testing::TempDir() + "kvl_unsupported_arch_" + std::to_string(::getpid()) + ".gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A load that fails at once used to race the listener thread's start: the stop came before the
// accept loop and was lost, and the server answered 503 "loading model" forever while SIGTERM
// stayed blocked. Every start must now exit non-zero with the error, also beside busy threads.
TEST(ServeLoadTest, AFailedLoadExitsNonzeroWithTheErrorEveryTime) {
  const std::string model = UnsupportedArchitectureModel();
  std::atomic<bool> busy{true};
  std::vector<std::thread> burners;
  for (int i = 0; i < 2; ++i) {
    burners.emplace_back([&busy] {
      volatile uint64_t x = 0;
      while (busy.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  int hung = 0;
  for (int run = 0; run < 12; ++run) {
    ServerProcess server(model, {});
    const int status = server.WaitExit(/*seconds=*/15);
    if (status == -1) ++hung;
    EXPECT_EQ(status, 1) << "run " << run << ":\n" << server.Log();
    EXPECT_NE(server.Log().find("architecture 'zzzzz'"), std::string::npos) << server.Log();
  }
  busy = false;
  for (std::thread& t : burners) t.join();
  EXPECT_EQ(hung, 0);
  std::remove(model.c_str());
}

// A greedy completion of a token-id prompt, to max_tokens when `ignore_eos`.
httplib::Result CompleteIds(httplib::Client& client, const json& prompt, int max_tokens,
                            bool ignore_eos = false) {
  json body{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (ignore_eos) body["ignore_eos"] = true;
  return PostJson(client, "/v1/completions", body.dump());
}

// A prompt far past the context is refused before it is tokenized (8 prompts of 7 MiB grew the
// server from 171 to 773 MB of token ids, only to be refused).
TEST(ServeAdmissionTest, AHugePromptIsRefusedBeforeItIsTokenized) {
  ServerProcess server({"--max-body", "16MiB"});
  ASSERT_TRUE(server.WaitReady());
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  const std::string text(4 << 20, 'a');
  auto refused =
      PostJson(client, "/v1/completions", json{{"prompt", text}, {"max_tokens", 4}}.dump());
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body.substr(0, 300);
  EXPECT_NE(refused->body.find("the prompt has 4194304 bytes"), std::string::npos)
      << refused->body.substr(0, 300);
}

// `-np 8 --kv-budget 1MiB`, a 500-token prompt with max_tokens 1000 ran ~316 tokens and then
// answered 500 (and SDKs retry a 5xx twice). Now a 400 before any work, naming the budget, the
// prompt and max_tokens, and the most that fits; what fits is served.
TEST(ServeAdmissionTest, ARequestTheBudgetCanNeverHoldIsRefusedAtOnce) {
  // f32 KV (the default is f16): the block arithmetic below is in f32 blocks.
  ServerProcess server({"-np", "8", "--kv-budget", "1MiB", "-ctk", "f32", "-ctv", "f32"});
  ASSERT_TRUE(server.WaitReady());
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  json prompt = json::array();
  for (int i = 0; i < 500; ++i) prompt.push_back(3 + i % 500);
  auto refused = CompleteIds(client, prompt, 1000);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  const std::string message = json::parse(refused->body)["error"]["message"];
  EXPECT_NE(message.find("KV budget"), std::string::npos) << message;
  EXPECT_NE(message.find("500 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("max_tokens (1000)"), std::string::npos) << message;
  // 51 blocks of 16 tokens: 816 of one sequence, 316 after the prompt.
  EXPECT_NE(message.find("at most 316 tokens"), std::string::npos) << message;
  auto served = CompleteIds(client, prompt, 300, /*ignore_eos=*/true);
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200) << served->body;
  EXPECT_EQ(json::parse(served->body)["usage"]["completion_tokens"], 300);
}

// Where pages of running sequences move (the lossless lattice with a RAM tier), the admission
// check used to admit everything: a request longer than the pool, the staging buffers and the
// RAM tier together ran until it outgrew them and ended late. It is refused at once too, naming
// what bounds it; what fits is served.
TEST(ServeAdmissionTest, ARequestPastWhatPagingCanReachIsRefusedAtOnce) {
  ServerProcess server(
      // The budget holds the RAM tier: 200 KiB for the pool, 100 KiB for the tier's pages and
      // 9 KiB for its map of them (50 f16 layer pages of 2 KiB, 168 bytes each).
      {"-np", "1", "-c", "2048", "--kv-budget", "309KiB", "--kv-tier", "ram:100KiB"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(60, 0);
  json prompt = json::array();
  for (int i = 0; i < 100; ++i) prompt.push_back(3 + i);
  auto refused = CompleteIds(client, prompt, 1000);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  const std::string message = json::parse(refused->body)["error"]["message"];
  EXPECT_NE(message.find("KV budget"), std::string::npos) << message;
  EXPECT_NE(message.find("read in place from RAM"), std::string::npos) << message;
  EXPECT_NE(message.find("100 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("max_tokens (1000)"), std::string::npos) << message;
  auto served = CompleteIds(client, prompt, 40, /*ignore_eos=*/true);
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200) << served->body;
  EXPECT_EQ(json::parse(served->body)["usage"]["completion_tokens"], 40);
}

// `scripts/soak --kv-budget 400KiB` ended requests with a late 500 ("its pages streamed from
// tiers fill the staging"): the RAM tier filled with pages pinned for waiting requests (kept at
// their preemption, or found in the store for an admission that then waited), so a running
// request's pages went to the disk tier, through the few staging buffers, and a request the
// budget holds alone was stopped. Those pages now give way: every request runs to its
// max_tokens, with the text of a server whose budget holds everything.
TEST(ServeAdmissionTest, PagesHeldForWaitingRequestsGiveWayToRunningOnes) {
  const std::string disk =
      ::testing::TempDir() + "kvl_give_way_" + std::to_string(::getpid()) + ".pages";
  // The budget holds the RAM tier: 300 KiB for the pool, 600 KiB for the tier's pages and 50 KiB
  // for its map of them (300 f16 layer pages of 2 KiB, 168 bytes each).
  ServerProcess server({"-np", "4", "-c", "512", "--kv-budget", "950KiB", "--kv-tier", "ram:600KiB",
                        "--kv-tier", "disk:" + disk + ":16MiB"});
  ServerProcess reference({"-np", "4", "-c", "512", "--kv-budget", "16MiB"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  ASSERT_TRUE(reference.WaitReady()) << reference.Log();
  // Long token-id prompts that share a prefix: pages go to the tiers and are found there again.
  std::mt19937 rng(4);
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<int> prefix(460);
  for (int& id : prefix) id = pick(3, 510);
  std::vector<json> requests;
  for (int i = 0; i < 40; ++i) {
    const int length = pick(250, 439);
    json prompt(std::vector<int>(prefix.begin(), prefix.begin() + pick(0, length - 1)));
    while (static_cast<int>(prompt.size()) < length) prompt.push_back(pick(3, 510));
    requests.push_back({{"prompt", prompt},
                        {"max_tokens", std::min(500 - length, 60)},
                        {"temperature", 0},
                        {"ignore_eos", true}});
  }
  // Eight clients at once, five rounds.
  std::vector<std::string> answers(requests.size());
  for (size_t round = 0; round < requests.size(); round += 8) {
    std::vector<std::thread> clients;
    for (size_t i = round; i < round + 8; ++i) {
      clients.emplace_back([&, i] {
        httplib::Client client("127.0.0.1", server.port());
        client.set_read_timeout(120, 0);
        auto res = PostJson(client, "/v1/completions", requests[i].dump());
        answers[i] = res ? std::to_string(res->status) + " " + res->body : "no answer";
      });
    }
    for (std::thread& t : clients) t.join();
  }
  httplib::Client client("127.0.0.1", reference.port());
  client.set_read_timeout(120, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(answers[i].starts_with("200 ")) << "request " << i << ": " << answers[i];
    const json body = json::parse(answers[i].substr(4));
    EXPECT_EQ(body["usage"]["completion_tokens"], requests[i]["max_tokens"])
        << "request " << i << " cut short: " << body.dump();
    auto expected = PostJson(client, "/v1/completions", requests[i].dump());
    ASSERT_TRUE(expected);
    EXPECT_EQ(body["choices"][0]["text"], json::parse(expected->body)["choices"][0]["text"])
        << "request " << i;
  }
  std::remove(disk.c_str());
}

// A stream running when SIGTERM comes: within the grace period it runs to its end; past it, it
// is cancelled with a finish frame ("abort") and [DONE]. Never cut without its last frames (it
// was: httplib's stop() ends chunked responses at their next write). The server exits 0.
std::string StreamThroughSigterm(const std::string& grace, int max_tokens) {
  ServerProcess server({"--shutdown-grace", grace, "-c", "2048"});
  EXPECT_TRUE(server.WaitReady());
  std::string body;
  std::atomic<bool> started{false};
  std::thread client([&] {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(30, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{
        {"prompt", "Once upon a time"},
        {"max_tokens", max_tokens},
        {"temperature", 0},
        {"ignore_eos", true},
        {"stream",
         true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      started = true;
      return true;
    };
    c.send(req);
  });
  // The first bytes of the stream, within 30 s (a request that failed sends none).
  for (int i = 0; i < 6000 && !started; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(started) << server.Log();
  EXPECT_EQ(server.Terminate(/*seconds=*/20), 0) << server.Log();
  client.join();
  return body;
}

TEST(ServeShutdownTest, SigtermLetsARunningStreamFinishWithinTheGrace) {
  const std::string body = StreamThroughSigterm("10", 1500);
  const std::vector<std::string> frames = testing::SseData(body);
  ASSERT_GE(frames.size(), 3u) << body;
  EXPECT_EQ(frames.back(), "[DONE]");
  const json finish = json::parse(frames[frames.size() - 2]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length") << finish.dump();
}

TEST(ServeShutdownTest, SigtermPastTheGraceCancelsAStreamWithItsLastFrames) {
  const std::string body = StreamThroughSigterm("0", 2000);
  const std::vector<std::string> frames = testing::SseData(body);
  ASSERT_GE(frames.size(), 2u) << body;
  EXPECT_EQ(frames.back(), "[DONE]");
  const json finish = json::parse(frames[frames.size() - 2]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "abort") << finish.dump();
}

// OpenAI fields: logit_bias is applied; fields this server cannot honour are refused by name
// (they were silently ignored: a client asking for JSON got prose).
TEST(ServeOpenAiFieldsTest, LogitBiasIsAppliedAndUnsupportedFieldsAreRefusedByName) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady());
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  auto completion = [&](json extra) {
    json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    if (extra.is_object()) body.update(extra);
    return PostJson(client, "/v1/completions", body.dump());
  };
  // Token 403 is " Once" in stories260K: forced, every token is it.
  auto forced = completion({{"logit_bias", {{"403", 100}}}});
  ASSERT_TRUE(forced);
  ASSERT_EQ(forced->status, 200) << forced->body;
  const std::string text = json::parse(forced->body)["choices"][0]["text"];
  auto plain = completion({});
  ASSERT_TRUE(plain);
  EXPECT_NE(text, json::parse(plain->body)["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(text.find(" Once Once"), 0u) << text;
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, json>>{{"response_format", {{"type", "json_yaml"}}},
                                                 {"best_of", 2},
                                                 {"suffix", "The end."},
                                                 {"tool_choice", "required"},
                                                 {"logit_bias", {{"abc", 1}}},
                                                 {"logit_bias", {{"5", 1000}}},
                                                 {"logit_bias", {{"999999", 1}}}}) {
    auto refused = completion({{field, value}});
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << field << ": " << refused->body;
    EXPECT_NE(refused->body.find(field.substr(0, 8)), std::string::npos) << refused->body;
  }
  // The values that ask for nothing are accepted.
  auto neutral = completion({{"response_format", {{"type", "text"}}},
                             {"best_of", 1},
                             {"suffix", ""},
                             {"tool_choice", "none"}});
  ASSERT_TRUE(neutral);
  EXPECT_EQ(neutral->status, 200) << neutral->body;
}

// vLLM's return_token_ids: the prompt's ids and the generated ids, plain and streamed, equal to
// what /tokenize and the engine give.
TEST(ServeOpenAiFieldsTest, ReturnTokenIdsAnswersThePromptAndGeneratedIds) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady());
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  const json request = {{"prompt", "Once upon a time"},
                        {"max_tokens", 12},
                        {"temperature", 0},
                        {"return_token_ids", true}};
  auto plain = PostJson(client, "/v1/completions", request.dump());
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  // The engine's number for the request, which the web page's KV view follows.
  EXPECT_GT(std::atoi(plain->get_header_value("X-Request-Id").c_str()), 0);
  const json body = json::parse(plain->body);
  // stories260K's reference (shared/models/README.md): BOS, then "Once upon a time".
  EXPECT_EQ(body["prompt_token_ids"], json({1, 403, 407, 261, 378})) << body.dump();
  const std::vector<int32_t> ids = body["choices"][0]["token_ids"];
  EXPECT_EQ(ids.size(), 12u);
  auto detok = PostJson(client, "/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["content"], body["choices"][0]["text"]) << detok->body;
  // Streamed: the same ids, spread over the frames; the prompt's on the first.
  json streamed = request;
  streamed["stream"] = true;
  auto stream = PostJson(client, "/v1/completions", streamed.dump());
  ASSERT_TRUE(stream);
  std::vector<int32_t> streamed_ids;
  json prompt_ids;
  for (const std::string& frame : testing::SseData(stream->body)) {
    if (frame == "[DONE]") break;
    const json chunk = json::parse(frame);
    if (chunk.contains("prompt_token_ids")) prompt_ids = chunk["prompt_token_ids"];
    if (chunk["choices"].empty() || !chunk["choices"][0].contains("token_ids")) continue;
    for (int32_t id : chunk["choices"][0]["token_ids"]) streamed_ids.push_back(id);
  }
  EXPECT_EQ(prompt_ids, body["prompt_token_ids"]);
  EXPECT_EQ(streamed_ids, ids);
  // Without the field, neither key appears.
  auto without = PostJson(client, "/v1/completions",
                          json{{"prompt", "Once upon a time"}, {"max_tokens", 2}}.dump());
  ASSERT_TRUE(without);
  EXPECT_EQ(without->body.find("token_ids"), std::string::npos) << without->body;
}

}  // namespace
}  // namespace kvl
