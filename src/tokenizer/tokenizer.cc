// Tokenizer: validation of a vocabulary, Encode's outline (special tokens, BOS / EOS, then the
// model's encoder on each piece of text between special tokens) and decoding. The encoders live
// in spm.cc and bpe.cc, the special tokens in special_tokens.cc.
#include "kvl/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "bpe_model.h"
#include "unicode.h"

namespace kvl {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 ▁

// Parses "<0xNN>" (upper- or lower-case hex); -1 when the text is not a byte piece.
int ParseBytePiece(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

Status IdOutOfRange(std::string_view what, TokenId id, size_t n) {
  return InvalidArgumentError(
      fmt::format("{} token id {} is outside the {}-token vocab", what, id, n));
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return InvalidArgumentError("tokenizer vocab has no tokens");
  if (n > static_cast<size_t>(INT32_MAX)) return InvalidArgumentError("tokenizer vocab too large");
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return InvalidArgumentError(fmt::format("tokenizer scores have {} entries for {} tokens",
                                            vocab.scores.size(), n));
  }
  if (!vocab.types.empty() && vocab.types.size() != n) {
    return InvalidArgumentError(fmt::format("tokenizer token types have {} entries for {} tokens",
                                            vocab.types.size(), n));
  }
  const auto in_range = [n](TokenId id) { return id >= 0 && static_cast<size_t>(id) < n; };
  const auto check_id = [&](std::string_view what, TokenId id) -> Status {
    if (id != -1 && !in_range(id)) return IdOutOfRange(what, id, n);
    return Status::Ok();
  };
  KVL_RETURN_IF_ERROR(check_id("bos", vocab.bos));
  KVL_RETURN_IF_ERROR(check_id("eos", vocab.eos));
  KVL_RETURN_IF_ERROR(check_id("unknown", vocab.unk));
  KVL_RETURN_IF_ERROR(check_id("eot", vocab.eot));
  KVL_RETURN_IF_ERROR(check_id("eom", vocab.eom));
  if (vocab.add_bos && vocab.bos < 0) {
    return InvalidArgumentError("the vocab asks for a BOS token (add_bos) but has none");
  }
  if (vocab.add_eos && vocab.eos < 0) {
    return InvalidArgumentError("the vocab asks for an EOS token (add_eos) but has none");
  }

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->model_ = vocab.model;
  tok->tokens_ = std::move(vocab.tokens);
  tok->scores_ = std::move(vocab.scores);
  if (tok->scores_.empty()) tok->scores_.assign(n, 0.0f);
  tok->types_ = std::move(vocab.types);
  if (tok->types_.empty()) {
    tok->types_.assign(n, TokenType::kNormal);
    for (size_t i = 0; i < n; ++i) {
      if (ParseBytePiece(tok->tokens_[i]) >= 0) tok->types_[i] = TokenType::kByte;
    }
    if (vocab.bos >= 0) tok->types_[static_cast<size_t>(vocab.bos)] = TokenType::kControl;
    if (vocab.eos >= 0) tok->types_[static_cast<size_t>(vocab.eos)] = TokenType::kControl;
    if (vocab.unk >= 0) tok->types_[static_cast<size_t>(vocab.unk)] = TokenType::kUnknown;
  }
  tok->bos_ = vocab.bos;
  tok->eos_ = vocab.eos;
  tok->eot_ = vocab.eot;
  tok->eom_ = vocab.eom;
  tok->unk_ = vocab.unk;
  tok->add_bos_ = vocab.add_bos;
  tok->add_eos_ = vocab.add_eos;
  tok->add_space_prefix_ = vocab.model == TokenizerModel::kSentencePiece && vocab.add_space_prefix;

  for (TokenId& id : tok->byte_tokens_) id = -1;
  for (size_t i = 0; i < n; ++i) {
    std::string& text = tok->tokens_[i];
    // An empty token would match everywhere; llama.cpp renames it so that it matches nowhere.
    if (text.empty()) text = fmt::format("[EMPTY_{}]", i);
    if (tok->types_[i] == TokenType::kByte) {
      const int value = ParseBytePiece(text);
      if (value < 0) {
        return InvalidArgumentError(
            fmt::format("token {} has type BYTE but its text '{}' is not <0xNN>", i, text));
      }
      if (tok->byte_tokens_[value] < 0) tok->byte_tokens_[value] = static_cast<TokenId>(i);
    }
  }
  // Every token's text finds it, of any type, as in llama.cpp (the last of duplicates wins).
  tok->token_index_.Build(&tok->tokens_);

  if (vocab.model == TokenizerModel::kBytePairEncoding) {
    const Tokenizer* raw = tok.get();
    KVL_ASSIGN_OR_RETURN(tok->bpe_,
                         BuildBpeModel(
                             vocab.merges, vocab.pre,
                             [raw](std::string_view s) { return raw->FindToken(s); },
                             [raw](std::string_view s) { raw->token_index_.Prefetch(s); }));
    tok->pre_name_ = tok->bpe_->pre.name;
  }
  KVL_RETURN_IF_ERROR(tok->InitSpecialTokens(vocab.name));
  return tok;
}

TokenId Tokenizer::FindToken(std::string_view text) const { return token_index_.Find(text); }

std::vector<TokenId> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> ids;
  if (options.add_special && add_bos_) ids.push_back(bos_);
  std::vector<Fragment> fragments;
  if (!text.empty()) PartitionSpecial(text, options.parse_special, &fragments);
  // SentencePiece puts its dummy-prefix space before the text at the start and after each
  // special token (llama.cpp's "is_prev_special").
  bool after_special = true;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view piece = text.substr(f.offset, f.length);
    if (model_ == TokenizerModel::kSentencePiece) {
      EncodeSentencePiece(piece, add_space_prefix_ && after_special, &ids);
    } else {
      EncodeBytePairs(piece, &ids);
    }
    after_special = false;
  }
  if (options.add_special && add_eos_) ids.push_back(eos_);
  return ids;
}

void Tokenizer::AppendTokenText(TokenId prev, TokenId id, std::string* out, bool special) const {
  AppendPiece(id, special, add_space_prefix_ && (prev < 0 || prev == bos_), out);
}

std::string Tokenizer::TokenPiece(TokenId id, bool special) const {
  std::string out;
  AppendPiece(id, special, /*drop_leading_space=*/false, &out);
  return out;
}

void Tokenizer::AppendPiece(TokenId id, bool special, bool drop_leading_space,
                            std::string* out) const {
  if (id < 0 || id >= vocab_size()) return;
  const std::string& text = tokens_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      if (special) out->append(text);
      return;
    case TokenType::kUserDefined:
      out->append(text);
      return;
    case TokenType::kByte:
      out->push_back(static_cast<char>(ParseBytePiece(text)));
      return;
    case TokenType::kUnused:
    case TokenType::kUndefined:
      return;  // llama.cpp prints nothing for them, as for control tokens
    case TokenType::kNormal:
      break;
  }
  if (model_ == TokenizerModel::kBytePairEncoding) {
    // Each character of the piece stands for one byte (GPT-2's alphabet); a character outside
    // it (a hand-made vocab) is copied as it is.
    for (size_t pos = 0; pos < text.size();) {
      const size_t length = std::min(Utf8LengthFromLead(text[pos]), text.size() - pos);
      uint32_t cpt = static_cast<uint8_t>(text[pos]);
      if (length == 2) cpt = (cpt & 0x1F) << 6 | (static_cast<uint8_t>(text[pos + 1]) & 0x3F);
      if ((length == 1 && cpt < 0x80) || length == 2) {
        if (cpt < 0x144 && bpe_->unicode_to_byte[cpt] >= 0) {
          out->push_back(static_cast<char>(bpe_->unicode_to_byte[cpt]));
          pos += length;
          continue;
        }
      }
      out->append(text, pos, length);
      pos += length;
    }
    return;
  }
  size_t pos = 0;
  // Undo the dummy prefix Encode added: the first piece of a text loses its leading space
  // (written as U+2581 or, in some vocabs, as a plain space).
  if (drop_leading_space) {
    if (text.starts_with(kSpaceSymbol)) {
      pos = kSpaceSymbol.size();
    } else if (text.starts_with(' ')) {
      pos = 1;
    }
  }
  while (pos < text.size()) {
    if (text.compare(pos, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
      out->push_back(' ');
      pos += kSpaceSymbol.size();
    } else {
      out->push_back(text[pos++]);
    }
  }
}

std::string Tokenizer::DecodeToken(TokenId prev, TokenId id, bool special) const {
  std::string out;
  AppendTokenText(prev, id, &out, special);
  return out;
}

std::string Tokenizer::Decode(const std::vector<TokenId>& ids, bool special) const {
  std::string out;
  TokenId prev = -1;
  for (TokenId id : ids) {
    AppendTokenText(prev, id, &out, special);
    prev = id;
  }
  return out;
}

}  // namespace kvl
