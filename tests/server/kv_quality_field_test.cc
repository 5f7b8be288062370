// The request-body extension field `kv_quality` of /v1/completions and /v1/chat/completions, on
// real `kvl serve` processes: accepted where the server can honour it (200), a 400 naming the
// field for a value that is not a quality, and for a lossy quality on a server started lossless.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::GreedyReference;
using testing::PostJson;
using testing::ServerProcess;

std::string Completion(const std::string& quality_field) {
  return R"({"prompt":"Once upon a time","max_tokens":24,"temperature":0)" + quality_field + "}";
}

std::string Chat(const std::string& quality_field) {
  return R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0)" +
         quality_field + "}";
}

void ExpectBadField(httplib::Client& client, const std::string& path, const std::string& body,
                    const std::string& in_message) {
  auto res = PostJson(client, path, body);
  ASSERT_TRUE(res) << body;
  EXPECT_EQ(res->status, 400) << body << " -> " << res->body;
  const json error = json::parse(res->body)["error"];
  EXPECT_EQ(error["param"], "kv_quality") << res->body;
  EXPECT_NE(error["message"].get<std::string>().find(in_message), std::string::npos)
      << res->body;
}

TEST(KvQualityFieldTest, ALosslessServerTakesLosslessAndRefusesLossyOrUnknownQualities) {
  ServerProcess server({"-np", "2"});  // --kv-quality unset: lossless
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);

  auto ok = PostJson(client, "/v1/completions", Completion(R"(,"kv_quality":"lossless")"));
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["choices"][0]["text"], GreedyReference("Once upon a time", 24));
  auto null_field = PostJson(client, "/v1/chat/completions", Chat(R"(,"kv_quality":null)"));
  ASSERT_TRUE(null_field);
  EXPECT_EQ(null_field->status, 200) << null_field->body;  // null: the server's quality

  for (const std::string& path : {"/v1/completions", "/v1/chat/completions"}) {
    const bool chat = path == "/v1/chat/completions";
    auto body = [chat](const std::string& field) { return chat ? Chat(field) : Completion(field); };
    ExpectBadField(client, path, body(R"(,"kv_quality":"aggressive")"), "started lossless");
    ExpectBadField(client, path, body(R"(,"kv_quality":"best")"), R"(got "best")");
    ExpectBadField(client, path, body(R"(,"kv_quality":"")"), "must be");
    ExpectBadField(client, path, body(R"(,"kv_quality":5)"), "got 5");
    ExpectBadField(client, path, body(R"(,"kv_quality":")" + std::string(5000, 'x') + "\""),
                   "...");
  }
}

TEST(KvQualityFieldTest, ABalancedServerTakesEveryQuality) {
  ServerProcess server({"-np", "2", "--kv-quality", "balanced"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  for (const std::string quality : {"lossless", "balanced", "aggressive"}) {
    const std::string field = R"(,"kv_quality":")" + quality + "\"";
    auto completion = PostJson(client, "/v1/completions", Completion(field));
    ASSERT_TRUE(completion);
    ASSERT_EQ(completion->status, 200) << quality << ": " << completion->body;
    // Room for everything: no page is touched, whatever the request tolerates.
    EXPECT_EQ(json::parse(completion->body)["choices"][0]["text"],
              GreedyReference("Once upon a time", 24));
    auto chat = PostJson(client, "/v1/chat/completions", Chat(field));
    ASSERT_TRUE(chat);
    EXPECT_EQ(chat->status, 200) << quality << ": " << chat->body;
  }
}

}  // namespace
}  // namespace kvl
