// Streaming a generation's text token by token must not touch the heap once the caller's string
// has room. This file also holds test_tokenizer's allocation hooks.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "alloc_counter.h"
#include "kvl/gguf.h"
#include "kvl/tokenizer.h"

KVL_ALLOC_COUNTER_HOOKS()

namespace kvl {
namespace {

using ::kvl::testing::AllocCounter;

TEST(TokenizerAllocTest, AppendTokenTextDoesNotAllocateOnceThereIsRoom) {
  auto file = GgufFile::Open(KVL_SHARED_MODELS_DIR "/stories260K.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok_or = Tokenizer::FromGguf(*file.value());
  ASSERT_TRUE(tok_or.ok()) << tok_or.status().ToString();
  const Tokenizer& tok = *tok_or.value();

  // Every token after BOS and after an ordinary one, plus out-of-range ids: all token kinds.
  std::vector<TokenId> ids = {tok.bos()};
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    ids.push_back(id);
    ids.push_back(tok.bos());
  }
  ids.push_back(-1);
  ids.push_back(tok.vocab_size());

  std::string piece;
  piece.reserve(64);
  std::string streamed;
  streamed.reserve(16 * ids.size());
  AllocCounter counter;
  TokenId prev = -1;
  for (int rep = 0; rep < 100; ++rep) {
    streamed.clear();
    for (TokenId id : ids) {
      piece.clear();
      tok.AppendTokenText(prev, id, &piece);
      streamed.append(piece);
      prev = id;
    }
    prev = -1;
  }
  const int64_t allocations = counter.Stop();
  EXPECT_EQ(allocations, 0);

  // The same text as DecodeToken token by token, and as Decode of the whole sequence.
  std::string expected;
  prev = -1;
  for (TokenId id : ids) {
    expected += tok.DecodeToken(prev, id);
    prev = id;
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(streamed, tok.Decode(ids));
}

}  // namespace
}  // namespace kvl
