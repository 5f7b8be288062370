// The byte-level BPE half of a Tokenizer (private to src/tokenizer).
#pragma once

#include <cstdint>
#include <string>

#include "kvl/tokenizer.h"
#include "pretokenizer.h"

namespace kvl {

struct Tokenizer::BpeModel {
  PreTokenizer pre;
  // (left token, right token) -> rank. Every merge names two tokens (checked at load), so the
  // symbols BPE compares are always tokens, and pairs are found by id, not by text.
  MergeTable merges;
  // GPT-2's byte-to-unicode alphabet: the UTF-8 of each byte's stand-in character, and back
  // (every stand-in is below U+0144).
  std::string byte_to_unicode[256];
  int16_t unicode_to_byte[0x144] = {};
  TokenId byte_char_token[256] = {};  // the token of each byte's stand-in, or -1
  TokenId raw_byte_token[256] = {};   // the token whose text is that single raw byte, or -1
};

// Builds the merges, alphabet and pre-tokenizer of a byte-level BPE vocabulary. find_token gives
// a text's id (-1: none); prefetch_token, optional, starts loading what find_token will read.
StatusOr<std::unique_ptr<Tokenizer::BpeModel>> BuildBpeModel(
    const std::vector<std::string>& merges, const std::string& pre,
    const std::function<TokenId(std::string_view)>& find_token,
    const std::function<void(std::string_view)>& prefetch_token = nullptr);

}  // namespace kvl
