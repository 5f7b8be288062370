// Log-probabilities over HTTP: legacy completions' `logprobs: N` and chat's `logprobs` /
// `top_logprobs`, plain and streamed, checked against the log-softmax of the forward pass's
// logits computed here in double (a Forward on a contiguous cache, apart from the engine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "forward/forward_harness.h"
#include "kvl/tokenizer.h"
#include "server_process.h"
#include "test_paths.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;
using testing::SseData;

constexpr double kTolerance = 1e-4;  // float logits summed in another order; values are ~1..10

// One greedy step of the reference: the chosen token, its log-probability, every token's.
struct ReferenceStep {
  int32_t token = -1;
  std::vector<double> logprobs;  // [vocab]
};

// Greedy decoding of `prompt` for `n` tokens with its log-softmax at every step.
std::vector<ReferenceStep> ReferenceGreedy(const std::string& prompt, int n,
                                           std::vector<int32_t>* prompt_ids) {
  Harness h(testing::Stories260KPath(), ops::BestIsa(), 1, 64);
  auto tokenizer = Tokenizer::FromGguf(h.model->file());
  EXPECT_TRUE(tokenizer.ok());
  std::vector<int32_t> ids = (*tokenizer)->Encode(prompt, /*add_bos=*/true);
  *prompt_ids = ids;
  std::vector<float> row = h.AllLogits(ids, 64).back();
  std::vector<ReferenceStep> steps;
  for (int i = 0; i < n; ++i) {
    ReferenceStep& step = steps.emplace_back();
    const double max = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float l : row) sum += std::exp(double(l) - max);
    const double log_z = max + std::log(sum);
    for (float l : row) step.logprobs.push_back(double(l) - log_z);
    step.token = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    ids.push_back(step.token);
    TokenBatch batch;
    batch.Add(step.token, static_cast<int64_t>(ids.size()) - 1, 0, true);
    h.forward.Run(batch, *h.kv);
    row.assign(h.forward.logits(0), h.forward.logits(0) + row.size());
  }
  return steps;
}

class LogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // f32 KV, as the reference forward below runs (the server's default is f16).
    server_ = new ServerProcess({"-np", "4", "-ctk", "f32", "-ctv", "f32"});
    ASSERT_TRUE(server_->WaitReady()) << "kvl serve did not become ready";
    auto model = Model::Load(testing::Stories260KPath());
    ASSERT_TRUE(model.ok());
    auto tokenizer = Tokenizer::FromGguf((*model)->file());
    ASSERT_TRUE(tokenizer.ok());
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete tokenizer_;
  }
  json Post(const std::string& path, const json& body) {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(30, 0);
    auto res = PostJson(client, path, body.dump());
    if (!res) return json();
    EXPECT_EQ(res->status, 200) << res->body;
    if (body.value("stream", false)) {
      json frames = json::array();
      for (const std::string& frame : SseData(res->body)) {
        if (frame != "[DONE]") frames.push_back(json::parse(frame));
      }
      return frames;
    }
    return json::parse(res->body, nullptr, false);
  }
  static ServerProcess* server_;
  static Tokenizer* tokenizer_;
};
ServerProcess* LogprobsTest::server_ = nullptr;
Tokenizer* LogprobsTest::tokenizer_ = nullptr;

TEST_F(LogprobsTest, CompletionLogprobsAreTheForwardsLogSoftmax) {
  constexpr int kTokens = 12;
  const std::string prompt = "Once upon a time";
  std::vector<int32_t> prompt_ids;
  const std::vector<ReferenceStep> reference = ReferenceGreedy(prompt, kTokens, &prompt_ids);
  const json body =
      Post("/v1/completions",
           {{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}, {"logprobs", 20}});
  ASSERT_TRUE(body.is_object());
  const json& choice = body["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_TRUE(lp.is_object()) << body.dump();
  ASSERT_EQ(lp["tokens"].size(), size_t(kTokens)) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), size_t(kTokens));
  ASSERT_EQ(lp["top_logprobs"].size(), size_t(kTokens));
  ASSERT_EQ(lp["text_offset"].size(), size_t(kTokens));
  std::string joined;
  int32_t prev = prompt_ids.back();
  for (int i = 0; i < kTokens; ++i) {
    SCOPED_TRACE(i);
    const ReferenceStep& ref = reference[size_t(i)];
    const std::string token = lp["tokens"][i];
    EXPECT_EQ(token, tokenizer_->DecodeToken(prev, ref.token));
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), static_cast<int64_t>(joined.size()));
    joined += token;
    // The sampled token's log-probability is the forward's, and greedy makes it the largest.
    const double logprob = lp["token_logprobs"][i];
    EXPECT_NEAR(logprob, ref.logprobs[size_t(ref.token)], kTolerance);
    const json& top = lp["top_logprobs"][i];
    EXPECT_GE(top.size(), 15u);  // 20, less where two tokens print the same text
    EXPECT_LE(top.size(), 20u);
    double max = -1e300, exp_sum = 0;
    for (const auto& [text, value] : top.items()) {
      max = std::max(max, value.get<double>());
      exp_sum += std::exp(value.get<double>());
    }
    EXPECT_DOUBLE_EQ(max, logprob);
    EXPECT_LE(exp_sum, 1.0 + 1e-6);
    // Every alternative listed is one of the reference's 20 most likely, at its log-probability.
    std::vector<int32_t> order(ref.logprobs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return ref.logprobs[size_t(a)] > ref.logprobs[size_t(b)];
    });
    std::map<std::string, double> expected;  // text -> the most likely token printing it
    for (size_t k = 0; k < 20; ++k) {
      expected.emplace(tokenizer_->DecodeToken(prev, order[k]), ref.logprobs[size_t(order[k])]);
    }
    for (const auto& [text, value] : top.items()) {
      ASSERT_TRUE(expected.count(text)) << "'" << text << "' is not among the top 20";
      EXPECT_NEAR(value.get<double>(), expected[text], kTolerance) << text;
    }
    // Over the whole vocabulary the probabilities sum to 1 (the reference's own check).
    double vocab_sum = 0;
    for (double v : ref.logprobs) vocab_sum += std::exp(v);
    EXPECT_NEAR(vocab_sum, 1.0, 1e-9);
    prev = ref.token;
  }
  EXPECT_EQ(joined, choice["text"]);
}

TEST_F(LogprobsTest, ZeroAlternativesListOnlyTheSampledToken) {
  const json body = Post("/v1/completions", {{"prompt", "The little dog"},
                                             {"max_tokens", 6},
                                             {"logprobs", 0},
                                             {"temperature", 0.9},
                                             {"seed", 3}});
  const json& lp = body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u) << body.dump();
  for (size_t i = 0; i < 6; ++i) {
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 1u) << top.dump();
    EXPECT_EQ(top.begin().key(), lp["tokens"][i]);
    EXPECT_EQ(top.begin().value(), lp["token_logprobs"][i]);
    EXPECT_LT(lp["token_logprobs"][i].get<double>(), 0.0);
  }
}

// What is reported is the model's distribution, not the sampler's: the first step's top tokens
// are the same at temperature 0 and at 1.7.
TEST_F(LogprobsTest, TemperatureDoesNotChangeTheReportedLogprobs) {
  const json greedy =
      Post("/v1/completions",
           {{"prompt", "Lily wanted to"}, {"max_tokens", 1}, {"logprobs", 5}, {"temperature", 0}});
  const json hot = Post("/v1/completions", {{"prompt", "Lily wanted to"},
                                            {"max_tokens", 1},
                                            {"logprobs", 5},
                                            {"temperature", 1.7},
                                            {"seed", 11}});
  const json& a = greedy["choices"][0]["logprobs"]["top_logprobs"][0];
  const json& b = hot["choices"][0]["logprobs"]["top_logprobs"][0];
  ASSERT_EQ(a.size(), 5u) << greedy.dump();
  for (const auto& [text, value] : a.items()) {
    ASSERT_TRUE(b.contains(text)) << b.dump();
    EXPECT_EQ(b[text], value);
  }
}

TEST_F(LogprobsTest, StreamedCompletionChunksCarryEachTokensLogprobs) {
  const json request = {
      {"prompt", "The sun was shining"}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 3}};
  const json plain = Post("/v1/completions", request);
  json streamed_request = request;
  streamed_request["stream"] = true;
  const json frames = Post("/v1/completions", streamed_request);
  json tokens = json::array(), logprobs = json::array(), offsets = json::array();
  for (const json& frame : frames) {
    const json& lp = frame["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      tokens.push_back(lp["tokens"][i]);
      logprobs.push_back(lp["token_logprobs"][i]);
      offsets.push_back(lp["text_offset"][i]);
      EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    }
  }
  const json& expected = plain["choices"][0]["logprobs"];
  EXPECT_EQ(tokens, expected["tokens"]);
  EXPECT_EQ(logprobs, expected["token_logprobs"]);
  EXPECT_EQ(offsets, expected["text_offset"]);
}

TEST_F(LogprobsTest, ChatLogprobsPlainAndStreamed) {
  const json request = {{"messages", {{{"role", "user"}, {"content", "Sam and his mom went"}}}},
                        {"max_tokens", 8},
                        {"temperature", 0},
                        {"logprobs", true},
                        {"top_logprobs", 4}};
  const json plain = Post("/v1/chat/completions", request);
  const json& content = plain["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 8u) << plain.dump();
  std::string text;
  for (const json& entry : content) {
    const std::string token = entry["token"];
    text += token;
    std::vector<int> bytes(token.begin(), token.end());
    for (int& b : bytes) b &= 0xff;
    EXPECT_EQ(entry["bytes"], json(bytes));
    const json& top = entry["top_logprobs"];
    ASSERT_EQ(top.size(), 4u);
    for (size_t k = 1; k < top.size(); ++k) {
      EXPECT_GE(top[k - 1]["logprob"].get<double>(), top[k]["logprob"].get<double>());
    }
    EXPECT_EQ(top[0]["token"], entry["token"]);  // greedy: the most likely
    EXPECT_EQ(top[0]["logprob"], entry["logprob"]);
  }
  EXPECT_EQ(text, plain["choices"][0]["message"]["content"]);

  json streamed_request = request;
  streamed_request["stream"] = true;
  json streamed = json::array();
  for (const json& frame : Post("/v1/chat/completions", streamed_request)) {
    const json& lp = frame["choices"][0]["logprobs"];
    if (!lp.is_null()) streamed.insert(streamed.end(), lp["content"].begin(), lp["content"].end());
  }
  EXPECT_EQ(streamed, content);

  // logprobs without top_logprobs: no alternatives; without logprobs: null.
  json no_top = request;
  no_top.erase("top_logprobs");
  const json bare = Post("/v1/chat/completions", no_top);
  for (const json& entry : bare["choices"][0]["logprobs"]["content"]) {
    EXPECT_TRUE(entry["top_logprobs"].empty());
  }
  json off = request;
  off.erase("top_logprobs");
  off["logprobs"] = false;
  EXPECT_TRUE(Post("/v1/chat/completions", off)["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace kvl
