// Tokenizer::FromGguf on the real stories260K file (reference encodings and decodings from
// shared/models/README.md) and on small GGUF files with malformed tokenizer metadata.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"

namespace kvl {
namespace {

const char* const kStoriesPath = KVL_SHARED_MODELS_DIR "/stories260K.gguf";

class StoriesTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = GgufFile::Open(kStoriesPath);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    file_ = std::move(file).value().release();
    auto tok = Tokenizer::FromGguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(tok).value().release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
  }
  static GgufFile* file_;
  static Tokenizer* tok_;
};
GgufFile* StoriesTokenizerTest::file_ = nullptr;
Tokenizer* StoriesTokenizerTest::tok_ = nullptr;

TEST_F(StoriesTokenizerTest, VocabAndSpecialTokens) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_EQ(tok_->unk(), 0);
  EXPECT_EQ(tok_->type(1), TokenType::kControl);
  EXPECT_EQ(tok_->type(3), TokenType::kByte);
  EXPECT_EQ(tok_->token_text(13), "<0x0A>");
}

TEST_F(StoriesTokenizerTest, EncodesReferencePrompt) {
  EXPECT_EQ(tok_->Encode("Once upon a time", true), (std::vector<TokenId>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok_->Encode("Once upon a time", false), (std::vector<TokenId>{403, 407, 261, 378}));
}

TEST_F(StoriesTokenizerTest, DecodesReferenceGeneration) {
  const std::string ids_text =
      "403,407,261,378,432,383,286,261,376,298,315,421,395,317,426,338,401,396,267,337,410,408,"
      "419,292,411,322,265,282,295,433,426,385,328,432,358,394,261,370,432,352,266,268,388,426,"
      "338,391,266,267,337,335,312,432,398,312,286,267,414,270,333,415,426,13,438,310";
  std::vector<TokenId> ids = {1};  // generated after BOS
  std::stringstream in(ids_text);
  for (std::string id; std::getline(in, id, ',');) ids.push_back(std::stoi(id));
  ASSERT_EQ(ids.size(), 65u);
  const std::string expected =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too "
      "high.\nLily";
  EXPECT_EQ(tok_->Decode(ids), expected);
  // Token by token, as the engine streams it.
  std::string streamed;
  for (size_t i = 1; i < ids.size(); ++i) streamed += tok_->DecodeToken(ids[i - 1], ids[i]);
  EXPECT_EQ(streamed, expected);
  // Encoding the text again gives the same ids.
  EXPECT_EQ(tok_->Encode(expected, true), ids);
}

TEST_F(StoriesTokenizerTest, RoundTrips) {
  const std::vector<std::string> texts = {
      "",
      "Hello world",
      "Lily and Tom went to the park, and they played!",
      "Wait... what? \"Yes\", she said; (quietly) - 100% sure.",
      "12345 67.89 0",
      "a  b   c    d",
      " leading space",
      "   three leading",
      "trailing space ",
      "line one\nline two\n\ttabbed\r\n",
      "caf\xC3\xA9 na\xC3\xAFve",             // café naïve (é is a token, ï is bytes)
      "\xE4\xB8\xAD\xE6\x96\x87",             // 中文
      "emoji \xF0\x9F\x98\x80!",              // 😀 (4-byte fallback)
      "invalid \x80 utf8 \xE4\xB8",  // stray and truncated bytes survive too
      "<s> and </s> are text here",
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(tok_->Decode(tok_->Encode(text, true)), text) << text;
    EXPECT_EQ(tok_->Decode(tok_->Encode(text, false)), text) << text;
  }
}

TEST_F(StoriesTokenizerTest, EmojiUsesByteFallback) {
  // "▁" then F0 9F 98 80 as byte tokens (id = 3 + byte).
  EXPECT_EQ(tok_->Encode("\xF0\x9F\x98\x80", false), (std::vector<TokenId>{410, 3 + 0xF0,
                                                                            3 + 0x9F, 3 + 0x98,
                                                                            3 + 0x80}));
}

TEST_F(StoriesTokenizerTest, ControlTokenTextIsNotParsed) {
  std::vector<TokenId> ids = tok_->Encode("<s></s>", false);
  for (TokenId id : ids) {
    EXPECT_NE(id, 1);
    EXPECT_NE(id, 2);
  }
}

// A minimal valid llama tokenizer block; each test breaks one thing.
struct TokenizerKeys {
  std::string model = "llama";
  bool with_tokens = true;
  bool with_scores = true;
  bool scores_as_int = false;
  size_t scores_len = 4;
  bool with_types = true;
  size_t types_len = 4;
  int32_t bos = 1;
  int32_t eos = 2;
  bool with_model = true;
};

// The tokenizer of the metadata written so far. The buffer must outlive the parse only; the
// tokenizer copies what it keeps.
StatusOr<std::unique_ptr<Tokenizer>> FromWriter(const GgufWriter& w) {
  const std::vector<uint8_t> bytes = w.WriteToBuffer();
  auto file = GgufFile::FromBuffer(bytes.data(), bytes.size());
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

void ExpectFailure(const StatusOr<std::unique_ptr<Tokenizer>>& tok, StatusCode code,
                   const std::string& needle) {
  ASSERT_FALSE(tok.ok()) << needle;
  EXPECT_EQ(tok.status().code(), code) << tok.status().ToString();
  EXPECT_NE(tok.status().message().find(needle), std::string::npos) << tok.status().ToString();
}

StatusOr<std::unique_ptr<Tokenizer>> FromKeys(const TokenizerKeys& k) {
  GgufWriter w;
  if (k.with_model) w.AddString("tokenizer.ggml.model", k.model);
  if (k.with_tokens) w.AddStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  if (k.with_scores) {
    if (k.scores_as_int) {
      w.AddInt32Array("tokenizer.ggml.scores", std::vector<int32_t>(k.scores_len, 0));
    } else {
      w.AddFloat32Array("tokenizer.ggml.scores", std::vector<float>(k.scores_len, 0.0f));
    }
  }
  if (k.with_types) {
    std::vector<int32_t> types = {2, 3, 3, 1};
    types.resize(k.types_len, 1);
    w.AddInt32Array("tokenizer.ggml.token_type", types);
  }
  w.AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(k.bos));
  w.AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(k.eos));
  w.AddBool("tokenizer.ggml.add_space_prefix", false);
  return FromWriter(w);
}

void ExpectError(const TokenizerKeys& keys, StatusCode code, const std::string& needle) {
  ExpectFailure(FromKeys(keys), code, needle);
}

TEST(TokenizerGgufTest, MinimalVocabLoads) {
  auto tok = FromKeys({});
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 4);
  EXPECT_FALSE((*tok)->add_space_prefix());  // the key overrides the default
  EXPECT_EQ((*tok)->Encode("aa", true), (std::vector<TokenId>{1, 3, 3}));
}

TEST(TokenizerGgufTest, MissingModelOrTokensNameTheKey) {
  TokenizerKeys k;
  k.with_model = false;
  ExpectError(k, StatusCode::kNotFound, "tokenizer.ggml.model");
  k = {};
  k.with_tokens = false;
  ExpectError(k, StatusCode::kNotFound, "tokenizer.ggml.tokens");
}

TEST(TokenizerGgufTest, WrongLengthOrTypeArraysNameTheKey) {
  TokenizerKeys k;
  k.scores_len = 3;
  ExpectError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.scores");
  k = {};
  k.scores_as_int = true;
  ExpectError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.scores");
  k = {};
  k.types_len = 5;
  ExpectError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.token_type");
}

TEST(TokenizerGgufTest, SpecialIdsOutOfRangeNameTheKey) {
  TokenizerKeys k;
  k.bos = 4;
  ExpectError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.bos_token_id");
  k = {};
  k.eos = 1000;
  ExpectError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.eos_token_id");
}

TEST(TokenizerGgufTest, OtherModelsAreUnimplemented) {
  TokenizerKeys k;
  k.model = "bert";
  ExpectError(k, StatusCode::kUnimplemented, "bert");
}

}  // namespace
}  // namespace kvl

namespace kvl {
namespace {

// A byte-level BPE tokenizer block; each test breaks one thing.
struct BpeKeys {
  std::vector<std::string> tokens = {"a", "b", "ab", "<|endoftext|>"};
  std::vector<std::string> merges = {"a b"};
  std::vector<int32_t> types = {1, 1, 1, 3};
  std::string pre = "gpt-2";
  bool with_merges = true;
  int64_t eos = 3;
};

StatusOr<std::unique_ptr<Tokenizer>> FromBpeKeys(const BpeKeys& k) {
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", k.pre);
  w.AddStringArray("tokenizer.ggml.tokens", k.tokens);
  w.AddInt32Array("tokenizer.ggml.token_type", k.types);
  if (k.with_merges) w.AddStringArray("tokenizer.ggml.merges", k.merges);
  w.AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(k.eos));
  return FromWriter(w);
}

void ExpectBpeError(const BpeKeys& keys, StatusCode code, const std::string& needle) {
  ExpectFailure(FromBpeKeys(keys), code, needle);
}

TEST(TokenizerGgufBpeTest, MinimalVocabLoadsWithLlamaCppsDefaults) {
  auto tok = FromBpeKeys(BpeKeys{});
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->model(), TokenizerModel::kBytePairEncoding);
  EXPECT_EQ((*tok)->pre_tokenizer(), "gpt-2");
  EXPECT_FALSE((*tok)->add_bos_default());  // GPT-2 adds no BOS; Llama-3 does
  EXPECT_EQ((*tok)->Encode("abab", true), (std::vector<TokenId>{2, 2}));
  EXPECT_TRUE((*tok)->IsEndOfGeneration(3));
  BpeKeys llama3;
  llama3.pre = "llama-bpe";
  auto with_bos = FromBpeKeys(llama3);
  ASSERT_FALSE(with_bos.ok());  // llama-bpe adds a BOS, and this vocab has no BOS id 11
  EXPECT_NE(with_bos.status().message().find("bos_token_id"), std::string::npos);
}

TEST(TokenizerGgufBpeTest, BadMergesTypesAndIdsAreClearErrors) {
  BpeKeys k;
  k.merges = {"a c"};
  ExpectBpeError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.merges[0] = 'a c' names 'c'");
  k.merges = {"ab"};
  ExpectBpeError(k, StatusCode::kInvalidArgument, "not two tokens separated by a space");
  k = BpeKeys{};
  k.with_merges = false;
  ExpectBpeError(k, StatusCode::kNotFound, "tokenizer.ggml.merges");
  k = BpeKeys{};
  k.types = {1, 1, 1};
  ExpectBpeError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.token_type");
  k = BpeKeys{};
  k.eos = 4;
  ExpectBpeError(k, StatusCode::kInvalidArgument, "tokenizer.ggml.eos_token_id");
}

TEST(TokenizerGgufBpeTest, UnknownPreTokenizerIsNamedWithTheSupportedOnes) {
  BpeKeys k;
  k.pre = "brand-new-pre";
  auto tok = FromBpeKeys(k);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kUnimplemented);
  const std::string message(tok.status().message());
  for (const char* name : {"'brand-new-pre'", "llama-bpe", "qwen2", "smollm", "gpt-2", "tekken",
                           "deepseek-llm", "deepseek-v3", "default"}) {
    EXPECT_NE(message.find(name), std::string::npos) << name << " in " << message;
  }
}

}  // namespace
}  // namespace kvl
