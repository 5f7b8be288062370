// One long word (nothing a pre-tokenizer splits at) must tokenize in time near-linear in its
// length, with the ids the merge rule defines: a hostile 4 MiB word to /tokenize must not hold a
// thread for long (issue 37). The ids are checked against the rule written the slow, obvious way
// (merge the best-scoring adjacent pair, leftmost first, until none is a token); the time as the
// growth of this thread's CPU time from 1 MiB to 4 MiB, which a loaded machine does not inflate
// as it does wall time: ~4x for n log n, 16x for a quadratic step.
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"
#include "test_paths.h"
#include "tokenizer/llama_vocab_files.h"

namespace kvl {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct LoadedTokenizer {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

LoadedTokenizer Load(const std::string& path) {
  LoadedTokenizer loaded;
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return loaded;
  auto tok = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (!tok.ok()) return loaded;
  loaded.file = std::move(*file);
  loaded.tokenizer = std::move(*tok);
  return loaded;
}

std::string RandomWord(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string word(bytes, 'a');
  for (char& c : word) c = static_cast<char>('a' + rng() % 26);
  return word;
}

// SentencePiece's rule, quadratic and plain: the text after the dummy-prefix space, one symbol per
// character, then the adjacent pair whose concatenation is a token of the highest score (the
// leftmost among equals) merged, again and again. Letters only, so no byte fallback is needed.
std::vector<TokenId> SlowSentencePiece(const Tokenizer& tok, const std::string& text) {
  std::vector<std::string> symbols = {"\xE2\x96\x81"};
  for (char c : text) symbols.emplace_back(1, c);
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const TokenId id = tok.FindToken(symbols[i] + symbols[i + 1]);
      if (id >= 0 && (best < 0 || tok.score(id) > best_score)) {
        best = static_cast<int>(i);
        best_score = tok.score(id);
      }
    }
    if (best < 0) break;
    symbols[static_cast<size_t>(best)] += symbols[static_cast<size_t>(best) + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  std::vector<TokenId> ids;
  for (const std::string& s : symbols) ids.push_back(tok.FindToken(s));
  return ids;
}

TEST(TokenizerLongWordTest, LongWordsGetTheIdsOfTheMergeRule) {
  std::vector<std::string> paths = {testing::Stories260KPath()};
  std::string why_not;
  if (const std::string dir = testing::LlamaCppDir(&why_not); !dir.empty()) {
    paths.push_back(dir + "/models/ggml-vocab-llama-spm.gguf");  // 32k tokens, long merges
  }
  for (const std::string& path : paths) {
    LoadedTokenizer loaded = Load(path);
    ASSERT_NE(loaded.tokenizer, nullptr) << path;
    const Tokenizer& tok = *loaded.tokenizer;
    ASSERT_EQ(tok.model(), TokenizerModel::kSentencePiece);
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const std::string word = RandomWord(1200, seed);
      const std::vector<TokenId> ids = tok.Encode(word, EncodeOptions{false, false});
      EXPECT_EQ(ids, SlowSentencePiece(tok, word)) << path << ", seed " << seed;
      EXPECT_LT(ids.size(), word.size()) << path;  // merges happened: the rule was exercised
    }
  }
  if (paths.size() == 1) std::printf("llama-spm vocab not checked: %s\n", why_not.c_str());
}

// The least CPU time of `runs` encodings of `text` on this thread, and its token count.
double EncodeCpuSeconds(const Tokenizer& tok, const std::string& text, int runs, size_t* count) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const double start = ThreadCpuSeconds();
    const std::vector<TokenId> ids = tok.Encode(text, EncodeOptions{false, false});
    best = std::min(best, ThreadCpuSeconds() - start);
    *count = ids.size();
  }
  return best;
}

TEST(TokenizerLongWordTest, AMultiMebibyteWordTokenizesInNearLinearTime) {
  LoadedTokenizer loaded = Load(testing::Stories260KPath());
  ASSERT_NE(loaded.tokenizer, nullptr);
  const Tokenizer& tok = *loaded.tokenizer;

  // A run of one letter: stories260K has "▁a" and "a" but no "aa", so the count is exact.
  ASSERT_GE(tok.FindToken("\xE2\x96\x81"
                          "a"),
            0);
  ASSERT_LT(tok.FindToken("aa"), 0);
  const std::string run(4 << 20, 'a');
  const std::vector<TokenId> run_ids = tok.Encode(run, EncodeOptions{false, false});
  EXPECT_EQ(run_ids.size(), run.size());

  const std::string small = RandomWord(1 << 20, 7);
  const std::string large = RandomWord(4 << 20, 8);
  size_t small_count = 0, large_count = 0;
  const double small_seconds = EncodeCpuSeconds(tok, small, 2, &small_count);
  const double large_seconds = EncodeCpuSeconds(tok, large, 2, &large_count);
  // Every id spells its part of the word: the text comes back whole.
  const std::vector<TokenId> large_ids = tok.Encode(large, EncodeOptions{false, false});
  EXPECT_EQ(tok.Decode(large_ids), large);
  EXPECT_LT(large_count, large.size());
  // Merges happen about as often at either size (random letters): the counts scale with the text.
  EXPECT_NEAR(static_cast<double>(large_count) / static_cast<double>(small_count), 4.0, 0.2);
  const double growth = large_seconds / small_seconds;
  std::printf("1 MiB word: %.3f s CPU, %zu tokens; 4 MiB: %.3f s, %zu tokens; growth %.2fx\n",
              small_seconds, small_count, large_seconds, large_count, growth);
  EXPECT_LT(growth, 8.0) << "tokenizing grows faster than n log n with the word's length";
}

}  // namespace
}  // namespace kvl
