// SentencePiece BPE as llama.cpp's SPM vocab runs it: escape spaces as U+2581, split the text into
// UTF-8 characters, then repeatedly merge the adjacent pair with the best score that is itself a
// token. A priority queue of candidate bigrams makes that O(n log n) in the text length; stale
// queue entries (whose symbols have since changed) are skipped when popped, as SentencePiece does.
#include <cstdio>
#include <queue>
#include <string>
#include <utility>

#include "kvl/tokenizer.h"

namespace kvl {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 ▁
// What llama.cpp prints for an UNK token (U+2585 ▅), so unknown text stays visible.
constexpr std::string_view kUnknownText = "\xE2\x96\x85";

// Length of the UTF-8 character starting at text[pos], or 1 for a byte that does not start a
// valid, complete character (a stray continuation byte, a truncated or overlong sequence). Those
// bytes become symbols of their own that the byte fallback encodes exactly.
size_t Utf8CharLength(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  size_t length;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
  } else {
    return 1;
  }
  if (pos + length > text.size()) return 1;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 1;
  }
  return length;
}

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

bool IsPieceType(TokenType type) {
  return type == TokenType::kNormal || type == TokenType::kUserDefined ||
         type == TokenType::kUnused || type == TokenType::kUndefined;
}

// One symbol of the text being encoded: a span of the escaped text, linked to its neighbours.
// A merged-away symbol has length 0.
struct Symbol {
  int32_t prev;
  int32_t next;
  size_t offset;
  size_t length;
};

// A candidate merge of symbols left and right (adjacent when queued).
struct Bigram {
  int32_t left;
  int32_t right;
  float score;
  size_t length;  // left.length + right.length when queued; a mismatch later means stale
};

// Highest score first; on equal scores the leftmost pair, as SentencePiece and llama.cpp do.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return InvalidArgumentError("tokenizer vocab has no tokens");
  if (n > static_cast<size_t>(INT32_MAX)) return InvalidArgumentError("tokenizer vocab too large");
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return InvalidArgumentError("tokenizer scores have " + std::to_string(vocab.scores.size()) +
                                " entries for " + std::to_string(n) + " tokens");
  }
  if (!vocab.types.empty() && vocab.types.size() != n) {
    return InvalidArgumentError("tokenizer token types have " + std::to_string(vocab.types.size()) +
                                " entries for " + std::to_string(n) + " tokens");
  }
  const auto in_range = [n](TokenId id) { return id >= 0 && static_cast<size_t>(id) < n; };
  if (!in_range(vocab.bos)) {
    return InvalidArgumentError("bos token id " + std::to_string(vocab.bos) + " is outside the " +
                                std::to_string(n) + "-token vocab");
  }
  if (!in_range(vocab.eos)) {
    return InvalidArgumentError("eos token id " + std::to_string(vocab.eos) + " is outside the " +
                                std::to_string(n) + "-token vocab");
  }
  if (vocab.unk != -1 && !in_range(vocab.unk)) {
    return InvalidArgumentError("unknown token id " + std::to_string(vocab.unk) +
                                " is outside the " + std::to_string(n) + "-token vocab");
  }

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->tokens_ = std::move(vocab.tokens);
  tok->scores_ = std::move(vocab.scores);
  if (tok->scores_.empty()) tok->scores_.assign(n, 0.0f);
  tok->types_ = std::move(vocab.types);
  if (tok->types_.empty()) {
    tok->types_.assign(n, TokenType::kNormal);
    for (size_t i = 0; i < n; ++i) {
      if (ParseBytePiece(tok->tokens_[i]) >= 0) tok->types_[i] = TokenType::kByte;
    }
    tok->types_[static_cast<size_t>(vocab.bos)] = TokenType::kControl;
    tok->types_[static_cast<size_t>(vocab.eos)] = TokenType::kControl;
    if (vocab.unk >= 0) tok->types_[static_cast<size_t>(vocab.unk)] = TokenType::kUnknown;
  }
  tok->bos_ = vocab.bos;
  tok->eos_ = vocab.eos;
  tok->unk_ = vocab.unk;
  tok->add_bos_ = vocab.add_bos;
  tok->add_space_prefix_ = vocab.add_space_prefix;

  for (TokenId& id : tok->byte_tokens_) id = -1;
  tok->token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const TokenId id = static_cast<TokenId>(i);
    const std::string& text = tok->tokens_[i];
    const TokenType type = tok->types_[i];
    if (type == TokenType::kByte) {
      const int value = ParseBytePiece(text);
      if (value < 0) {
        return InvalidArgumentError("token " + std::to_string(i) + " has type BYTE but its text '" +
                                    text + "' is not <0xNN>");
      }
      if (tok->byte_tokens_[value] < 0) tok->byte_tokens_[value] = id;
    } else if (IsPieceType(type) && !text.empty()) {
      tok->token_to_id_.emplace(text, id);  // the first of duplicate pieces wins
    }
  }
  return tok;
}

TokenId Tokenizer::LookupPiece(std::string_view piece) const {
  auto it = token_to_id_.find(piece);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<TokenId> ids;
  if (add_bos) ids.push_back(bos_);
  if (text.empty()) return ids;

  // SentencePiece's normalization: a dummy-prefix space, then every space as ▁.
  std::string escaped;
  escaped.reserve(text.size() + kSpaceSymbol.size() * 8);
  if (add_space_prefix_) escaped.append(kSpaceSymbol);
  for (char c : text) {
    if (c == ' ') {
      escaped.append(kSpaceSymbol);
    } else {
      escaped.push_back(c);
    }
  }
  const std::string_view view(escaped);

  std::vector<Symbol> symbols;
  symbols.reserve(escaped.size());
  for (size_t pos = 0; pos < escaped.size();) {
    const size_t length = Utf8CharLength(view, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, index + 1, pos, length});
    pos += length;
  }
  symbols.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  const auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const TokenId id = LookupPiece(view.substr(l.offset, l.length + r.length));
    if (id < 0) return;
    queue.push({left, right, scores_[static_cast<size_t>(id)], l.length + r.length});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_add_bigram(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(bigram.left)];
    Symbol& right = symbols[static_cast<size_t>(bigram.right)];
    // Skip entries made stale by an earlier merge of either side.
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& symbol = symbols[static_cast<size_t>(i)];
    const std::string_view piece = view.substr(symbol.offset, symbol.length);
    const TokenId id = LookupPiece(piece);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    bool all_bytes = true;
    for (char c : piece) all_bytes = all_bytes && byte_tokens_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) ids.push_back(byte_tokens_[static_cast<uint8_t>(c)]);
    } else if (unk_ >= 0) {
      ids.push_back(unk_);
    }
    // A vocab with neither byte tokens nor UNK has no way to say this piece; it is dropped.
  }
  return ids;
}

void Tokenizer::AppendTokenText(TokenId prev, TokenId id, std::string* out) const {
  if (id < 0 || id >= vocab_size()) return;
  const std::string& text = tokens_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::kControl:
      return;
    case TokenType::kByte:
      out->push_back(static_cast<char>(ParseBytePiece(text)));
      return;
    case TokenType::kUnknown:
      out->append(kUnknownText);
      return;
    case TokenType::kUserDefined:
      out->append(text);
      return;
    case TokenType::kNormal:
    case TokenType::kUnused:
    case TokenType::kUndefined:
      break;
  }
  size_t pos = 0;
  // Undo the dummy prefix Encode added: the first piece of a text loses its leading space
  // (written as U+2581 or, in some vocabs, as a plain space).
  if (add_space_prefix_ && (prev < 0 || prev == bos_)) {
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

std::string Tokenizer::DecodeToken(TokenId prev, TokenId id) const {
  std::string out;
  AppendTokenText(prev, id, &out);
  return out;
}

std::string Tokenizer::Decode(const std::vector<TokenId>& ids) const {
  std::string out;
  TokenId prev = -1;
  for (TokenId id : ids) {
    AppendTokenText(prev, id, &out);
    prev = id;
  }
  return out;
}

}  // namespace kvl
