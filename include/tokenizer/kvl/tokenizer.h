// The tokenizer of a GGUF vocabulary, as llama.cpp's vocabulary code runs it:
// - `tokenizer.ggml.model = llama`: SentencePiece BPE (scores, byte fallback <0xNN>, the ▁ space
//   and its dummy prefix);
// - `tokenizer.ggml.model = gpt2`: byte-level BPE (merges by rank over the GPT-2 byte-to-unicode
//   alphabet, after the pre-tokenizer `tokenizer.ggml.pre` names has cut the text into words).
// Both split special tokens out of the text first: user-defined tokens always, control and
// unknown tokens when the caller asks (parse_special, as for a rendered chat template), the
// longest text first.
//
// Thread-safety: immutable after construction; Encode/Decode may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/status.h"
#include "kvl/token_index.h"

namespace kvl {

using TokenId = int32_t;

enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class TokenizerModel {
  kSentencePiece,     // "llama"
  kBytePairEncoding,  // "gpt2"
};

// Everything a tokenizer is built from, as FromGguf reads it from the metadata. Tests build small
// vocabularies by hand with it.
struct TokenizerVocab {
  TokenizerModel model = TokenizerModel::kSentencePiece;
  std::vector<std::string> tokens;  // SentencePiece: U+2581 (▁) stands for a space
  std::vector<float> scores;        // SentencePiece merge priority (higher first); empty = all 0
  // Empty = inferred: <0xNN> is kByte, bos/eos are kControl, unk is kUnknown, the rest kNormal.
  std::vector<TokenType> types;
  std::vector<std::string> merges;  // byte-level BPE: "left right", the best rank first
  std::string pre;                  // byte-level BPE: the pre-tokenizer ("" = "default")
  TokenId bos = 1;                  // -1: none
  TokenId eos = 2;                  // -1: none
  TokenId unk = 0;                  // -1: none
  TokenId eot = -1;                 // -1: found by its text (<|eot_id|>, <|im_end|>, ...) or none
  TokenId eom = -1;                 // -1: found by its text (<|eom_id|>) or none
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;  // SentencePiece only
  // general.name: llama.cpp strips the spaces after Phi-3's special tokens by the model's name.
  std::string name;
};

struct EncodeOptions {
  // The BOS / EOS the vocabulary asks for (add_bos_token / add_eos_token).
  bool add_special = true;
  // Control and unknown token texts in the text become those tokens (a rendered chat template);
  // off, they are plain text. User-defined tokens are matched either way.
  bool parse_special = false;
};

// True when the text is well-formed UTF-8 (a piece is shown as text only then, as llama-server
// does, else as its bytes).
bool IsValidUtf8(std::string_view text);

class Tokenizer {
 public:
  // The merges, byte alphabet and pre-tokenizer of a byte-level BPE vocabulary; opaque outside
  // src/tokenizer (bpe_model.h).
  struct BpeModel;

  ~Tokenizer();

  // Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,bos_token_id,eos_token_id,
  // eot_token_id,eom_token_id,unknown_token_id,add_bos_token,add_eos_token,add_space_prefix}.
  // Errors name the missing or malformed key; a model other than "llama" or "gpt2", or a
  // pre-tokenizer not written here, is UNIMPLEMENTED and names it.
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // Validates a vocab (lengths, special ids in range, byte tokens spelled <0xNN>, merges naming
  // tokens).
  static StatusOr<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab);

  // Text to ids. Text that no token covers falls back to byte tokens, or to UNK where the vocab
  // has no byte tokens. Invalid UTF-8 is encoded as llama.cpp does (byte-level BPE: each bad
  // byte as U+FFFD; SentencePiece: as byte tokens).
  std::vector<TokenId> Encode(std::string_view text, const EncodeOptions& options) const;
  // Encode with parse_special off; add_special adds the BOS / EOS the vocabulary asks for.
  std::vector<TokenId> Encode(std::string_view text, bool add_special) const {
    return Encode(text, EncodeOptions{add_special, false});
  }

  // The text of one token as it should be printed after `prev` (-1: at the start of the text).
  // SentencePiece drops the leading space of the first piece (after BOS or at the start); byte
  // tokens become raw bytes, so a multi-byte character may arrive split over several calls;
  // control and unknown tokens print nothing unless `special` (then their text), user-defined
  // tokens print their text; out-of-range ids print nothing.
  std::string DecodeToken(TokenId prev, TokenId id, bool special = false) const;
  // DecodeToken's text appended to *out, for the per-token path: it allocates nothing once *out
  // has the capacity (reserve it, and clear rather than replace it between tokens).
  void AppendTokenText(TokenId prev, TokenId id, std::string* out, bool special = false) const;
  // The text of a whole sequence.
  std::string Decode(const std::vector<TokenId>& ids, bool special = false) const;
  // One token's text as llama.cpp's token_to_piece gives it: no space dropped at the start,
  // control and unknown tokens as their text when `special` (llama-tokenize, /tokenize).
  std::string TokenPiece(TokenId id, bool special = true) const;

  // True for the tokens that end a generation: EOS, EOT, EOM and the known end-of-turn texts
  // (<|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>, <|endoftext|>, ...).
  bool IsEndOfGeneration(TokenId id) const {
    return id >= 0 && id < vocab_size() && is_eog_[static_cast<size_t>(id)];
  }
  const std::vector<TokenId>& end_of_generation_ids() const { return eog_ids_; }

  TokenizerModel model() const { return model_; }
  const std::string& pre_tokenizer() const { return pre_name_; }
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }
  TokenId unk() const { return unk_; }
  bool add_bos_default() const { return add_bos_; }
  bool add_eos_default() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  const std::string& token_text(TokenId id) const { return tokens_[static_cast<size_t>(id)]; }
  float score(TokenId id) const { return scores_[static_cast<size_t>(id)]; }
  TokenType type(TokenId id) const { return types_[static_cast<size_t>(id)]; }
  // The id of a token's exact text, or -1.
  TokenId FindToken(std::string_view text) const;

 private:
  // A piece of the text between special tokens, or a special token (token >= 0).
  struct Fragment {
    size_t offset;
    size_t length;
    TokenId token;
  };
  Tokenizer();

  Status InitSpecialTokens(const std::string& model_name);
  // Splits text at special tokens as llama.cpp's tokenizer_st_partition does.
  void PartitionSpecial(std::string_view text, bool parse_special,
                        std::vector<Fragment>* fragments) const;
  void EncodeSentencePiece(std::string_view text, bool space_prefix,
                           std::vector<TokenId>* ids) const;
  void EncodeBytePairs(std::string_view text, std::vector<TokenId>* ids) const;
  void AppendByteFallback(std::string_view piece, std::vector<TokenId>* ids) const;
  // AppendTokenText without the context: `drop_leading_space` undoes SentencePiece's prefix.
  void AppendPiece(TokenId id, bool special, bool drop_leading_space, std::string* out) const;

  TokenizerModel model_ = TokenizerModel::kSentencePiece;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  TokenIndex token_index_;  // text -> id over tokens_, every type
  TokenId byte_tokens_[256] = {};  // SentencePiece: id of <0xNN>, or -1
  // Special tokens (control, user-defined, unknown), the longest text first.
  std::vector<TokenId> special_tokens_;
  // special_tokens_' positions ("orders") by their texts' first two bytes, sorted; one-byte
  // texts by their byte; and which bytes start any special token.
  std::vector<std::pair<uint16_t, uint32_t>> special_prefixes_;
  std::vector<uint32_t> special_one_byte_[256];
  bool special_first_byte_[256] = {};
  std::vector<uint8_t> strip_;  // per token: kStripLeft / kStripRight (spaces beside it)
  std::vector<bool> is_eog_;
  std::vector<TokenId> eog_ids_;
  std::unique_ptr<const BpeModel> bpe_;
  std::string pre_name_;
  TokenId bos_ = 1;
  TokenId eos_ = 2;
  TokenId eot_ = -1;
  TokenId eom_ = -1;
  TokenId unk_ = 0;
  bool add_bos_ = true;
  bool add_eos_ = false;
  bool add_space_prefix_ = true;
};

}  // namespace kvl
