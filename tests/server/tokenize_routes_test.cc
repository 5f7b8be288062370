// POST /tokenize and /detokenize over HTTP on a real `kvl serve` (stories260K): the ids are the
// tokenizer's own, the defaults are llama-server's (add_special off, parse_special on), pieces
// that are not UTF-8 come as bytes, and bad bodies are 400s naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"
#include "server_process.h"
#include "test_paths.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;

class TokenizeRoutesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({});
    ASSERT_TRUE(server_->WaitReady()) << "kvl serve did not become ready";
    auto file = GgufFile::Open(testing::Stories260KPath());
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    auto tok = Tokenizer::FromGguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete tokenizer_;
  }
  // The answer's JSON; the HTTP status in *status.
  static json Post(const std::string& path, const std::string& body, int* status = nullptr) {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(30, 0);
    auto res = PostJson(client, path, body);
    EXPECT_TRUE(res) << path;
    if (!res) return json();
    if (status != nullptr) *status = res->status;
    return json::parse(res->body, nullptr, false);
  }
  static std::vector<TokenId> Ids(const json& tokens) { return tokens.get<std::vector<TokenId>>(); }

  static ServerProcess* server_;
  static Tokenizer* tokenizer_;
};
ServerProcess* TokenizeRoutesTest::server_ = nullptr;
Tokenizer* TokenizeRoutesTest::tokenizer_ = nullptr;

TEST_F(TokenizeRoutesTest, TokenizeGivesTheTokenizersIdsWithLlamaServerDefaults) {
  const json plain = Post("/tokenize", R"({"content": "Once upon a time"})");
  EXPECT_EQ(Ids(plain["tokens"]), (std::vector<TokenId>{403, 407, 261, 378}));
  const json with_bos = Post("/tokenize", R"({"content": "Once upon a time", "add_special": true})");
  EXPECT_EQ(Ids(with_bos["tokens"]), (std::vector<TokenId>{1, 403, 407, 261, 378}));
  // parse_special is on by default: "<s>" is BOS, and the text after it gets its prefix space.
  const json special = Post("/tokenize", R"({"content": "<s>Once"})");
  EXPECT_EQ(Ids(special["tokens"]), (std::vector<TokenId>{1, 403}));
  const json text = Post("/tokenize", R"({"content": "<s>Once", "parse_special": false})");
  EXPECT_EQ(Ids(text["tokens"]), tokenizer_->Encode("<s>Once", EncodeOptions{false, false}));
  EXPECT_EQ(std::count(text["tokens"].begin(), text["tokens"].end(), 1), 0);
  // Mixed content: strings and ids, BOS only before the first string.
  const json mixed =
      Post("/tokenize", R"({"content": ["Once", 2, "upon"], "add_special": true})");
  std::vector<TokenId> expected = tokenizer_->Encode("Once", true);
  expected.push_back(2);
  for (TokenId id : tokenizer_->Encode("upon", false)) expected.push_back(id);
  EXPECT_EQ(Ids(mixed["tokens"]), expected);
  EXPECT_EQ(Ids(Post("/tokenize", "{}")["tokens"]), std::vector<TokenId>{});
}

TEST_F(TokenizeRoutesTest, PiecesAreTextOrBytes) {
  const json pieces = Post("/tokenize", R"({"content": "Once", "with_pieces": true})");
  ASSERT_EQ(pieces["tokens"].size(), 1u);
  EXPECT_EQ(pieces["tokens"][0]["id"], 403);
  EXPECT_EQ(pieces["tokens"][0]["piece"], " Once");
  // An emoji falls back to byte tokens: each piece is one byte of it, not valid UTF-8 alone.
  const json bytes = Post("/tokenize", "{\"content\": \"\xF0\x9F\x98\x80\", \"with_pieces\": true}");
  ASSERT_EQ(bytes["tokens"].size(), 5u) << bytes.dump();
  EXPECT_EQ(bytes["tokens"][1]["piece"], json::array({0xF0}));
  EXPECT_EQ(bytes["tokens"][4]["piece"], json::array({0x80}));
}

TEST_F(TokenizeRoutesTest, DetokenizeJoinsPiecesWithControlTokenTexts) {
  EXPECT_EQ(Post("/detokenize", R"({"tokens": [1, 403, 407, 261, 378]})")["content"],
            "<s> Once upon a time");
  EXPECT_EQ(Post("/detokenize", R"({"tokens": []})")["content"], "");
  EXPECT_EQ(Post("/detokenize", "{}")["content"], "");
  // A round trip through both routes gives the text back (after the prefix space).
  const json ids = Post("/tokenize", R"({"content": "Lily went to the park."})");
  EXPECT_EQ(Post("/detokenize", json{{"tokens", ids["tokens"]}}.dump())["content"],
            " Lily went to the park.");
}

TEST_F(TokenizeRoutesTest, BadBodiesAre400sNamingTheField) {
  int status = 0;
  json error = Post("/tokenize", "not json", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);
  error = Post("/tokenize", "[1, 2]", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("JSON object"), std::string::npos);
  error = Post("/tokenize", R"({"content": 5})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "content");
  error = Post("/tokenize", R"({"content": "a", "with_pieces": "yes"})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "with_pieces");
  error = Post("/detokenize", R"({"tokens": [1, 100000]})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("100000"), std::string::npos);
  error = Post("/detokenize", R"({"tokens": "1 2"})", &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "tokens");
  // The routes answer POST only.
  httplib::Client client("127.0.0.1", server_->port());
  auto res = client.Get("/tokenize");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
}

}  // namespace
}  // namespace kvl
