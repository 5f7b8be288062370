// Special tokens: the split of a text at special-token texts must be llama.cpp's (each token in
// turn, the longest first, at its leftmost non-overlapping occurrences in what is left), checked
// against that algorithm written plainly here on random texts full of overlapping candidates;
// plus parse_special, user-defined tokens, Phi-3's space stripping and the end-of-generation set.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kvl/tokenizer.h"

namespace kvl {
namespace {

const std::vector<std::string> kSpecials = {"<a>", "<a>>", "a>", "<|", "|>", "<|a|>", "ab", "b",
                                            " <a", "\n<|"};

// <unk> <s> </s>, the 256 byte tokens, "a" and " ", then the special texts (control).
std::unique_ptr<Tokenizer> Build(const std::string& name, TokenType special_type) {
  TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    char text[8];
    std::snprintf(text, sizeof(text), "<0x%02X>", b);
    v.tokens.push_back(text);
    v.types.push_back(TokenType::kByte);
  }
  for (const std::string& s : kSpecials) {
    v.tokens.push_back(s);
    v.types.push_back(special_type);
  }
  v.add_space_prefix = false;
  v.name = name;
  auto tok = Tokenizer::FromVocab(std::move(v));
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(*tok);
}

std::unique_ptr<Tokenizer> Make(TokenizerVocab v) {
  auto tok = Tokenizer::FromVocab(std::move(v));
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(*tok);
}

bool IsAsciiSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// llama.cpp's partition, plainly: for each special (longest first, stable), split every raw
// fragment at each find() of its text; rstrip drops the spaces after a match.
std::vector<TokenId> Reference(const Tokenizer& tok, const std::string& text, bool rstrip) {
  struct Frag {
    size_t offset, length;
    TokenId token;
  };
  std::vector<TokenId> order;
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    const TokenType t = tok.type(id);
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      order.push_back(id);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return tok.token_text(a).size() > tok.token_text(b).size();
  });
  std::vector<Frag> frags = {{0, text.size(), -1}};
  for (TokenId special : order) {
    const std::string& needle = tok.token_text(special);
    const bool strip = rstrip && needle != "<unk>" && needle != "<s>";
    std::vector<Frag> next;
    for (const Frag& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.offset + f.length;
      size_t base = f.offset;
      while (base < end) {
        const size_t match = std::string_view(text).substr(0, end).find(needle, base);
        if (match == std::string::npos) break;
        if (match > base) next.push_back({base, match - base, -1});
        next.push_back({match, needle.size(), special});
        base = match + needle.size();
        while (strip && base < end && IsAsciiSpace(text[base])) ++base;
      }
      if (base < end) next.push_back({base, end - base, -1});
    }
    frags = next;
  }
  std::vector<TokenId> ids;
  for (const Frag& f : frags) {
    if (f.token >= 0) {
      ids.push_back(f.token);
    } else {
      for (TokenId id : tok.Encode(text.substr(f.offset, f.length), EncodeOptions{false, false})) {
        ids.push_back(id);
      }
    }
  }
  return ids;
}

TEST(SpecialTokensTest, SplitMatchesLlamaCppsAlgorithmOnRandomTexts) {
  for (const bool phi3 : {false, true}) {
    auto tok = Build(phi3 ? "Phi-3 mini" : "test", TokenType::kControl);
    const std::string alphabet = "<<a>>|b \n<|";
    std::mt19937 rng(phi3 ? 5 : 3);
    int with_specials = 0;
    for (int trial = 0; trial < 4000; ++trial) {
      std::string text;
      const size_t length = rng() % 24;
      for (size_t i = 0; i < length; ++i) text.push_back(alphabet[rng() % alphabet.size()]);
      const std::vector<TokenId> ids = tok->Encode(text, EncodeOptions{false, true});
      ASSERT_EQ(ids, Reference(*tok, text, phi3)) << "'" << text << "' phi3=" << phi3;
      with_specials += std::any_of(ids.begin(), ids.end(), [](TokenId id) { return id >= 259; });
    }
    EXPECT_GT(with_specials, 2000);  // the cases the test is for really happened
  }
}

TEST(SpecialTokensTest, ControlTokensNeedParseSpecialUserDefinedDoNot) {
  // "[CTL]" cannot be reached by merges (no two-character piece of it is a token), so as plain
  // text it is spelled in bytes.
  for (const TokenType type : {TokenType::kControl, TokenType::kUserDefined}) {
    TokenizerVocab v;
    v.tokens = {"<unk>", "<s>", "</s>"};
    for (int b = 0; b < 256; ++b) {
      char text[8];
      std::snprintf(text, sizeof(text), "<0x%02X>", b);
      v.tokens.push_back(text);
    }
    v.tokens.push_back("[CTL]");
    v.types.assign(v.tokens.size(), TokenType::kByte);
    v.types[0] = TokenType::kUnknown;
    v.types[1] = v.types[2] = TokenType::kControl;
    v.types.back() = type;
    v.add_space_prefix = false;
    auto tok = Make(v);
    const TokenId ctl = 259;
    const std::vector<TokenId> spelled = {3 + 'x', 3 + '[', 3 + 'C', 3 + 'T', 3 + 'L', 3 + ']'};
    EXPECT_EQ(tok->Encode("x[CTL]", EncodeOptions{false, true}), (std::vector<TokenId>{3 + 'x', ctl}));
    const std::vector<TokenId> split = {3 + 'x', ctl};
    EXPECT_EQ(tok->Encode("x[CTL]", EncodeOptions{false, false}),
              type == TokenType::kUserDefined ? split : spelled);
    // Decoding: control text only when asked, user-defined text always.
    EXPECT_EQ(tok->Decode({ctl}), type == TokenType::kUserDefined ? "[CTL]" : "");
    EXPECT_EQ(tok->Decode({ctl}, /*special=*/true), "[CTL]");
  }
}

TEST(SpecialTokensTest, EndOfGenerationSetHoldsEosAndEndOfTurnTexts) {
  TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "a", "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>",
              "<|im_start|>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl, TokenType::kNormal,
             TokenType::kNormal,  TokenType::kControl, TokenType::kControl, TokenType::kControl,
             TokenType::kControl};
  auto tok = Make(v);
  EXPECT_EQ(tok->end_of_generation_ids(), (std::vector<TokenId>{2, 4, 5, 6, 7}));
  EXPECT_FALSE(tok->IsEndOfGeneration(8));
  EXPECT_FALSE(tok->IsEndOfGeneration(-1));
  EXPECT_FALSE(tok->IsEndOfGeneration(99));
  // A known end-of-turn text that the file left normal is control (llama.cpp overrides it too).
  EXPECT_EQ(tok->type(4), TokenType::kControl);
  EXPECT_EQ(tok->eot(), 4);
  // gpt-oss: with <|return|> and <|call|>, <|end|> ends a message, not the generation.
  v.tokens.push_back("<|return|>");
  v.tokens.push_back("<|call|>");
  v.types.push_back(TokenType::kControl);
  v.types.push_back(TokenType::kControl);
  tok = Make(v);
  EXPECT_FALSE(tok->IsEndOfGeneration(7));
  EXPECT_TRUE(tok->IsEndOfGeneration(9));
  EXPECT_EQ(tok->type(7), TokenType::kUserDefined);
}

TEST(SpecialTokensTest, FindTokenOfAnyTextIsSafe) {
  auto tok = Build("test", TokenType::kControl);
  EXPECT_EQ(tok->FindToken(""), -1);
  EXPECT_EQ(tok->FindToken(std::string_view()), -1);
  EXPECT_EQ(tok->FindToken("<|a|>"), tok->vocab_size() - 5);
  EXPECT_EQ(tok->FindToken("no such token at all"), -1);
}

TEST(SpecialTokensTest, AddBosAndAddEosFollowTheVocab) {
  TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "a"};
  v.add_space_prefix = false;
  v.add_eos = true;
  auto tok = Make(v);
  EXPECT_EQ(tok->Encode("a", true), (std::vector<TokenId>{1, 3, 2}));
  EXPECT_EQ(tok->Encode("a", false), (std::vector<TokenId>{3}));
  v.add_bos = false;
  tok = Make(v);
  EXPECT_EQ(tok->Encode("a", true), (std::vector<TokenId>{3, 2}));
}

}  // namespace
}  // namespace kvl
