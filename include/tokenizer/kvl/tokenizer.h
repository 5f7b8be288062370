// SentencePiece-style BPE tokenizer (GGUF `tokenizer.ggml.model = llama`) built from the vocab in
// the GGUF metadata: tokens, scores, token types, byte fallback (<0xNN>), BOS/EOS/UNK, and the
// leading space SentencePiece adds to the text.
//
// Thread-safety: immutable after construction; Encode/Decode may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/status.h"

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

// Everything a tokenizer is built from, as FromGguf reads it from the metadata. Tests build small
// vocabularies by hand with it.
struct TokenizerVocab {
  std::vector<std::string> tokens;  // piece text, with U+2581 (▁) standing for a space
  std::vector<float> scores;        // merge priority (higher merges first); empty = all 0
  // Empty = inferred: <0xNN> is kByte, bos/eos are kControl, unk is kUnknown, the rest kNormal.
  std::vector<TokenType> types;
  TokenId bos = 1;
  TokenId eos = 2;
  TokenId unk = 0;  // -1: the vocab has no UNK token
  bool add_bos = true;
  bool add_space_prefix = true;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,eos_token_id,
  // unknown_token_id,add_bos_token,add_space_prefix}. Errors name the missing or malformed key;
  // a model other than "llama" is UNIMPLEMENTED.
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // Validates a vocab (lengths, special ids in range, byte tokens spelled <0xNN>).
  static StatusOr<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab);

  // Text to ids. add_bos prepends BOS. Text that no token covers falls back to byte tokens, or to
  // one UNK per uncovered character when the vocab has no byte tokens. Control-token text in
  // `text` (for example "<s>") is plain text, never the control token.
  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const;

  // The text of one token as it should be printed after `prev` (-1: at the start of the text).
  // The leading space of the first piece (after BOS or at the start) is dropped; byte tokens
  // become raw bytes, so a multi-byte character may arrive split over several calls; control
  // tokens print nothing; out-of-range ids print nothing.
  std::string DecodeToken(TokenId prev, TokenId id) const;
  // DecodeToken's text appended to *out, for the per-token path: it allocates nothing once *out
  // has the capacity (reserve it, and clear rather than replace it between tokens).
  void AppendTokenText(TokenId prev, TokenId id, std::string* out) const;
  // The text of a whole sequence.
  std::string Decode(const std::vector<TokenId>& ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId unk() const { return unk_; }
  bool add_bos_default() const { return add_bos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  const std::string& token_text(TokenId id) const { return tokens_[static_cast<size_t>(id)]; }
  float score(TokenId id) const { return scores_[static_cast<size_t>(id)]; }
  TokenType type(TokenId id) const { return types_[static_cast<size_t>(id)]; }

 private:
  // Lets token_to_id_ be searched with a string_view into the text being encoded, without
  // building a std::string per lookup.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };

  Tokenizer() = default;

  // The id of a piece the BPE may produce (normal, user-defined, unused or undefined tokens), or
  // -1. Control, unknown and byte tokens are never produced from text.
  TokenId LookupPiece(std::string_view piece) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id_;
  TokenId byte_tokens_[256] = {};  // id of <0xNN>, or -1
  TokenId bos_ = 1;
  TokenId eos_ = 2;
  TokenId unk_ = 0;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
};

}  // namespace kvl
