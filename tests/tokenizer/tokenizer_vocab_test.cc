// Tokenizer behaviour on small hand-made vocabularies (no file needed): merge priority, ties,
// byte fallback, UNK, the space prefix, decoding rules, and the priority-queue BPE against a
// naive reference on random texts.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvl/tokenizer.h"

namespace kvl {
namespace {

constexpr const char* kSpace = "\xE2\x96\x81";  // ▁

struct Piece {
  std::string text;
  float score;
};

// <unk>, <s>, </s>, then optionally the 256 byte tokens, then `pieces`.
TokenizerVocab MakeVocab(const std::vector<Piece>& pieces, bool with_bytes,
                         bool add_space_prefix = false) {
  TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  v.scores = {0, 0, 0};
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      char text[8];
      std::snprintf(text, sizeof(text), "<0x%02X>", b);
      v.tokens.push_back(text);
      v.types.push_back(TokenType::kByte);
      v.scores.push_back(0);
    }
  }
  for (const Piece& p : pieces) {
    v.tokens.push_back(p.text);
    v.types.push_back(TokenType::kNormal);
    v.scores.push_back(p.score);
  }
  v.add_space_prefix = add_space_prefix;
  return v;
}

std::unique_ptr<Tokenizer> Build(TokenizerVocab v) {
  auto tok = Tokenizer::FromVocab(std::move(v));
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// Token texts of an encoding, for readable expectations.
std::vector<std::string> Pieces(const Tokenizer& tok, std::string_view text) {
  std::vector<std::string> out;
  for (TokenId id : tok.Encode(text, false)) out.push_back(tok.token_text(id));
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenizerVocabTest, HigherScoreMergesFirst) {
  // "bc" outscores "ab", so "abc" becomes a + bc, not ab + c.
  auto tok = Build(MakeVocab({{"a", -10}, {"b", -10}, {"c", -10}, {"ab", -2}, {"bc", -1}}, true));
  EXPECT_EQ(Pieces(*tok, "abc"), (Strings{"a", "bc"}));
  // Reverse the scores and the other pair wins.
  tok = Build(MakeVocab({{"a", -10}, {"b", -10}, {"c", -10}, {"ab", -1}, {"bc", -2}}, true));
  EXPECT_EQ(Pieces(*tok, "abc"), (Strings{"ab", "c"}));
}

TEST(TokenizerVocabTest, MergesChainThroughIntermediatePieces) {
  // "abc" is reachable only through "bc": a + bc -> abc.
  auto tok = Build(MakeVocab(
      {{"a", -10}, {"b", -10}, {"c", -10}, {"ab", -2}, {"bc", -1}, {"abc", -3}}, true));
  EXPECT_EQ(Pieces(*tok, "abc"), (Strings{"abc"}));
  // A whole-word token without its intermediate pieces is never formed (BPE, not longest match).
  tok = Build(MakeVocab({{"a", -10}, {"b", -10}, {"c", -10}, {"abc", 0}}, true));
  EXPECT_EQ(Pieces(*tok, "abc"), (Strings{"a", "b", "c"}));
}

TEST(TokenizerVocabTest, TiesMergeTheLeftmostPair) {
  auto tok = Build(MakeVocab({{"a", -10}, {"b", -10}, {"c", -10}, {"ab", -1}, {"bc", -1}}, true));
  EXPECT_EQ(Pieces(*tok, "abc"), (Strings{"ab", "c"}));
  tok = Build(MakeVocab({{"a", -10}, {"aa", -1}}, true));
  EXPECT_EQ(Pieces(*tok, "aaa"), (Strings{"aa", "a"}));
  EXPECT_EQ(Pieces(*tok, "aaaaa"), (Strings{"aa", "aa", "a"}));
}

TEST(TokenizerVocabTest, SpacesBecomeTheSpaceSymbolWithOptionalPrefix) {
  const std::string s = kSpace;
  std::vector<Piece> pieces = {{s, -5}, {"a", -5}, {"b", -5}, {s + "a", -1}, {s + "b", -1}};
  auto with_prefix = Build(MakeVocab(pieces, true, /*add_space_prefix=*/true));
  EXPECT_EQ(Pieces(*with_prefix, "a b"), (Strings{s + "a", s + "b"}));
  EXPECT_EQ(Pieces(*with_prefix, "a  b"), (Strings{s + "a", s, s + "b"}));
  auto without = Build(MakeVocab(pieces, true, /*add_space_prefix=*/false));
  EXPECT_EQ(Pieces(*without, "a b"), (Strings{"a", s + "b"}));
}

TEST(TokenizerVocabTest, UncoveredTextFallsBackToByteTokens) {
  auto tok = Build(MakeVocab({{"a", -1}}, true));
  // 'x' and the two bytes of é (C3 A9) have no piece.
  EXPECT_EQ(Pieces(*tok, "ax\xC3\xA9"), (Strings{"a", "<0x78>", "<0xC3>", "<0xA9>"}));
  // Characters are cut by their lead byte alone, as llama.cpp cuts them: a stray continuation
  // byte is one symbol, and 0xFF (read as a 4-byte lead) takes the rest of the text with it into
  // one symbol that no piece matches, so all of it falls back to bytes.
  EXPECT_EQ(Pieces(*tok, "\x80" "a"), (Strings{"<0x80>", "a"}));
  EXPECT_EQ(Pieces(*tok, "\xFF" "a\x80"), (Strings{"<0xFF>", "<0x61>", "<0x80>"}));
  // A truncated multi-byte sequence at the end is bytes too.
  EXPECT_EQ(Pieces(*tok, "a\xE4\xB8"), (Strings{"a", "<0xE4>", "<0xB8>"}));
}

TEST(TokenizerVocabTest, WithoutByteTokensUncoveredCharactersAreUnk) {
  auto tok = Build(MakeVocab({{"a", -1}}, false));
  EXPECT_EQ(tok->Encode("axa\xC3\xA9", false), (std::vector<TokenId>{3, 0, 3, 0}));
}

TEST(TokenizerVocabTest, ControlTokenTextIsSplitOnlyWhenParsingSpecial) {
  auto tok = Build(MakeVocab({{"<", -1}, {"s", -1}, {">", -1}}, true));
  // Plain text: "<s>" is spelled with pieces.
  EXPECT_EQ(Pieces(*tok, "<s>"), (Strings{"<", "s", ">"}));
  // parse_special: it is the control token.
  EXPECT_EQ(tok->Encode(">" "<s>", EncodeOptions{false, true}),
            (std::vector<TokenId>{tok->FindToken(">"), tok->bos()}));
}

TEST(TokenizerVocabTest, MergesReachEveryTokenAsLlamaCppDoes) {
  // llama.cpp's SentencePiece merges any token the pair spells, control tokens included, so
  // "<s" + ">" becomes <s> even as plain text: kept for exactness with llama.cpp.
  auto tok = Build(MakeVocab({{"<", -1}, {"s", -1}, {">", -1}, {"<s", -1}}, true, false));
  EXPECT_EQ(tok->Encode("<s>", false), (std::vector<TokenId>{tok->bos()}));
}

TEST(TokenizerVocabTest, EncodeAddsBosOnRequestAndEmptyTextIsEmpty) {
  auto tok = Build(MakeVocab({{"a", -1}}, true, true));
  EXPECT_EQ(tok->Encode("", true), (std::vector<TokenId>{1}));
  EXPECT_TRUE(tok->Encode("", false).empty());
  EXPECT_EQ(tok->Encode("a", true).front(), 1);
}

TEST(TokenizerVocabTest, DecodeRules) {
  const std::string s = kSpace;
  auto tok = Build(MakeVocab({{s + "hi", -1}, {s, -1}, {"a", -1}}, true, true));
  const TokenId hi = 259, space = 260, a = 261;
  // The first piece loses its leading space, after BOS or at the start; later ones keep it.
  EXPECT_EQ(tok->Decode({1, hi, hi}), "hi hi");
  EXPECT_EQ(tok->Decode({hi, hi}), "hi hi");
  EXPECT_EQ(tok->DecodeToken(a, hi), " hi");
  EXPECT_EQ(tok->DecodeToken(1, hi), "hi");
  EXPECT_EQ(tok->DecodeToken(-1, hi), "hi");
  EXPECT_EQ(tok->Decode({1, space, hi}), " hi");
  // Control and unknown tokens print nothing unless asked, then their text; out-of-range ids
  // print nothing.
  EXPECT_EQ(tok->Decode({1, a, 2, 1}), "a");
  EXPECT_EQ(tok->Decode({a, 0}), "a");
  EXPECT_EQ(tok->Decode({1, a, 2, 0}, /*special=*/true), "<s>a</s><unk>");
  EXPECT_EQ(tok->DecodeToken(a, 100000), "");
  EXPECT_EQ(tok->DecodeToken(a, -5), "");
  // Byte tokens become raw bytes that assemble a multi-byte character across tokens.
  const TokenId e4 = 3 + 0xE4, b8 = 3 + 0xB8, ad = 3 + 0xAD;
  EXPECT_EQ(tok->Decode({a, e4, b8, ad}), "a\xE4\xB8\xAD");  // a中
  EXPECT_EQ(tok->DecodeToken(a, e4), "\xE4");
}

TEST(TokenizerVocabTest, RoundTripsArbitraryBytes) {
  const std::string s = kSpace;
  auto tok = Build(MakeVocab({{s, -3}, {"a", -1}, {"b", -1}, {s + "a", 0}, {"ab", -2}}, true, true));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 20);
    for (int i = 0; i < len; ++i) {
      const uint32_t r = rng() % 6;
      // Any byte below 0x80 (a byte above would read as a lead byte that takes the next
      // characters, spaces included, into byte fallback: see UncoveredTextFallsBackToByteTokens).
      text.push_back(r == 0 ? ' ' : r == 1 ? 'a' : r == 2 ? 'b' : static_cast<char>(rng() % 128));
    }
    EXPECT_EQ(tok->Decode(tok->Encode(text, true)), text);
    EXPECT_EQ(tok->Decode(tok->Encode(text, false)), text);
  }
}

// The textbook O(n^2) algorithm: merge the best-scoring adjacent pair (leftmost on ties) until
// none is a token. The priority-queue encoder must agree with it exactly.
std::vector<std::string> NaiveBpe(const std::vector<Piece>& pieces, const std::string& text) {
  std::vector<std::string> symbols;
  for (char c : text) symbols.emplace_back(1, c);
  const auto score_of = [&](const std::string& s, float* score) {
    for (const Piece& p : pieces) {
      if (p.text == s) {
        *score = p.score;
        return true;
      }
    }
    return false;
  };
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      float score;
      if (score_of(symbols[i] + symbols[i + 1], &score) && (best < 0 || score > best_score)) {
        best = static_cast<int>(i);
        best_score = score;
      }
    }
    if (best < 0) return symbols;
    symbols[static_cast<size_t>(best)] += symbols[static_cast<size_t>(best) + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
}

TEST(TokenizerVocabTest, MatchesNaiveBpeOnRandomTexts) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    // A random vocab over {a, b, c}: all single letters plus random strings of length 2..4 with
    // scores from a small set, so ties happen often.
    std::vector<Piece> pieces = {{"a", -100}, {"b", -100}, {"c", -100}};
    for (int k = 0; k < 25; ++k) {
      std::string s;
      const int len = 2 + static_cast<int>(rng() % 3);
      for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('a' + rng() % 3));
      const bool duplicate = std::any_of(pieces.begin(), pieces.end(),
                                         [&](const Piece& p) { return p.text == s; });
      if (!duplicate) pieces.push_back({s, -static_cast<float>(rng() % 4)});
    }
    auto tok = Build(MakeVocab(pieces, true));
    for (int t = 0; t < 20; ++t) {
      std::string text;
      const int len = static_cast<int>(rng() % 40);
      for (int i = 0; i < len; ++i) text.push_back(static_cast<char>('a' + rng() % 3));
      EXPECT_EQ(Pieces(*tok, text), NaiveBpe(pieces, text)) << text;
    }
  }
}

TEST(TokenizerVocabTest, LongTextEncodesQuickly) {
  // 200k characters; an O(n^2) rescan would take minutes here.
  auto tok = Build(MakeVocab({{"a", -3}, {"b", -3}, {"ab", -1}, {"abab", -2}}, true));
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "ab";
  std::vector<TokenId> ids = tok->Encode(text, false);
  EXPECT_EQ(ids.size(), 50000u);
  EXPECT_EQ(tok->Decode(ids), text);
}

TEST(TokenizerVocabTest, InfersTypesWhenNotGiven) {
  TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "<0x41>", "x"};
  v.add_space_prefix = false;
  auto tok = Build(v);
  EXPECT_EQ(tok->type(0), TokenType::kUnknown);
  EXPECT_EQ(tok->type(1), TokenType::kControl);
  EXPECT_EQ(tok->type(3), TokenType::kByte);
  EXPECT_EQ(tok->type(4), TokenType::kNormal);
  EXPECT_EQ(tok->score(4), 0.0f);
  EXPECT_EQ(Pieces(*tok, "xA"), (Strings{"x", "<0x41>"}));
}

TEST(TokenizerVocabTest, RejectsMalformedVocabs) {
  TokenizerVocab empty;
  EXPECT_EQ(Tokenizer::FromVocab(empty).status().code(), StatusCode::kInvalidArgument);

  TokenizerVocab v = MakeVocab({{"a", -1}}, false);
  v.scores.pop_back();
  auto r = Tokenizer::FromVocab(v);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("scores"), std::string::npos) << r.status().message();

  v = MakeVocab({{"a", -1}}, false);
  v.types.push_back(TokenType::kNormal);
  r = Tokenizer::FromVocab(v);
  EXPECT_NE(r.status().message().find("types"), std::string::npos) << r.status().message();

  v = MakeVocab({{"a", -1}}, false);
  v.bos = 4;
  r = Tokenizer::FromVocab(v);
  EXPECT_NE(r.status().message().find("bos"), std::string::npos) << r.status().message();
  v = MakeVocab({{"a", -1}}, false);
  v.eos = -2;
  r = Tokenizer::FromVocab(v);
  EXPECT_NE(r.status().message().find("eos"), std::string::npos) << r.status().message();

  v = MakeVocab({{"a", -1}}, false);
  v.types[3] = TokenType::kByte;  // "a" is not spelled <0xNN>
  r = Tokenizer::FromVocab(v);
  EXPECT_NE(r.status().message().find("BYTE"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvl
