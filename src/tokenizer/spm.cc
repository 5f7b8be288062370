// SentencePiece BPE as llama.cpp's SPM vocab runs it: escape spaces as U+2581, split the text into
// UTF-8 characters, then repeatedly merge the adjacent pair with the best score that is itself a
// token. A priority queue of candidate bigrams makes that O(n log n) in the text length; stale
// queue entries (whose symbols have since changed) are skipped when popped, as SentencePiece does.
#include <algorithm>
#include <queue>
#include <string>

#include "kvl/tokenizer.h"
#include "unicode.h"

namespace kvl {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 ▁

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

void Tokenizer::EncodeSentencePiece(std::string_view text, bool space_prefix,
                                    std::vector<TokenId>* ids) const {
  // SentencePiece's normalization: a dummy-prefix space, then every space as ▁.
  std::string escaped;
  escaped.reserve(text.size() + kSpaceSymbol.size() * 8);
  if (space_prefix) escaped.append(kSpaceSymbol);
  for (char c : text) {
    if (c == ' ') {
      escaped.append(kSpaceSymbol);
    } else {
      escaped.push_back(c);
    }
  }
  if (escaped.empty()) return;
  const std::string_view view(escaped);

  // Characters by their lead byte alone, as llama.cpp splits them: a bad byte sequence becomes
  // symbols that no token matches and that the byte fallback spells.
  std::vector<Symbol> symbols;
  symbols.reserve(escaped.size());
  for (size_t pos = 0; pos < escaped.size();) {
    const size_t length = std::min(Utf8LengthFromLead(escaped[pos]), escaped.size() - pos);
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
    const TokenId id = FindToken(view.substr(l.offset, l.length + r.length));
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
    const TokenId id = FindToken(piece);
    if (id >= 0) {
      ids->push_back(id);
    } else {
      AppendByteFallback(piece, ids);
    }
  }
}

void Tokenizer::AppendByteFallback(std::string_view piece, std::vector<TokenId>* ids) const {
  bool all_bytes = true;
  for (char c : piece) all_bytes = all_bytes && byte_tokens_[static_cast<uint8_t>(c)] >= 0;
  if (all_bytes) {
    for (char c : piece) ids->push_back(byte_tokens_[static_cast<uint8_t>(c)]);
  } else if (unk_ >= 0) {
    ids->push_back(unk_);
  }
  // A vocab with neither byte tokens nor UNK has no way to say this piece; it is dropped.
}

}  // namespace kvl
