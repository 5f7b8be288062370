// SentencePiece-style BPE tokenizer (GGUF `tokenizer.ggml.model = llama`) built from the vocab in
// the GGUF metadata: tokens, scores, token types, byte fallback (<0xNN>), BOS/EOS/UNK, and the
// leading space SentencePiece adds to the text.
//
// Thread-safety: immutable after construction; Encode/Decode may run concurrently.
#pragma once

#include <cstdint>
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

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,eos_token_id,
  // unknown_token_id,add_bos_token,add_space_prefix}. Errors name the missing or malformed key.
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Text to ids. add_bos prepends BOS. Text that no token covers falls back to byte tokens.
  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const;

  // The text of one token as it should be printed after `prev` (a leading space is dropped after
  // BOS; byte tokens become raw bytes; control tokens print nothing).
  std::string DecodeToken(TokenId prev, TokenId id) const;
  // The text of a whole sequence.
  std::string Decode(const std::vector<TokenId>& ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId unk() const { return unk_; }
  bool add_bos_default() const { return add_bos_; }
  const std::string& token_text(TokenId id) const { return tokens_[static_cast<size_t>(id)]; }
  float score(TokenId id) const { return scores_[static_cast<size_t>(id)]; }
  TokenType type(TokenId id) const { return types_[static_cast<size_t>(id)]; }

 private:
  Tokenizer() = default;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, TokenId> token_to_id_;
  TokenId byte_tokens_[256] = {};  // id of <0xNN>, or -1
  TokenId bos_ = 1;
  TokenId eos_ = 2;
  TokenId unk_ = 0;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
};

}  // namespace kvl
