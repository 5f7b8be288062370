// Byte-level BPE as llama.cpp's BPE vocab runs it (GPT-2, Llama-3, Qwen2, ...): the pre-tokenizer
// cuts the text into words; each word's UTF-8 bytes are spelled in GPT-2's byte-to-unicode
// alphabet; then, inside each word, the adjacent pair of symbols with the best (lowest) merge
// rank is merged until no pair has a rank, the leftmost pair first on equal ranks.
#include <fmt/format.h>

#include <queue>
#include <unordered_map>

#include "bpe_model.h"
#include "unicode.h"

namespace kvl {
namespace {

// One symbol of the word being merged: a span of the spelled word and its token.
struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t offset;
  uint32_t length;  // 0: merged into the symbol before it
  TokenId token;
};

struct Bigram {
  int32_t left;
  int32_t right;
  int32_t rank;
  uint32_t length;  // left.length + right.length when queued; a mismatch later means stale
};

// Lowest rank first; on equal ranks the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100.. in byte order, so every byte is a visible character.
void FillByteAlphabet(Tokenizer::BpeModel* bpe) {
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cpt = printable ? static_cast<uint32_t>(b) : 256 + next_extra++;
    bpe->byte_to_unicode[b].clear();
    AppendUtf8(cpt, &bpe->byte_to_unicode[b]);
    bpe->unicode_to_byte[cpt] = static_cast<int16_t>(b);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer::BpeModel>> BuildBpeModel(
    const std::vector<std::string>& merges, const std::string& pre,
    const std::function<TokenId(std::string_view)>& find_token,
    const std::function<void(std::string_view)>& prefetch_token) {
  auto bpe = std::make_unique<Tokenizer::BpeModel>();
  KVL_ASSIGN_OR_RETURN(bpe->pre, PreTokenizerFromName(pre));
  for (int16_t& b : bpe->unicode_to_byte) b = -1;
  FillByteAlphabet(bpe.get());
  for (int b = 0; b < 256; ++b) {
    bpe->byte_char_token[b] = find_token(bpe->byte_to_unicode[b]);
    const char raw = static_cast<char>(b);
    bpe->raw_byte_token[b] = find_token(std::string_view(&raw, 1));
  }

  // Loading is two random lookups per merge and one random insert: the slots of merges a few
  // ranks ahead are prefetched so that their cache misses overlap (a 150k vocab has as many
  // merges).
  constexpr size_t kAhead = 8;
  const auto split = [&](size_t rank, std::string_view* left, std::string_view* right) {
    const std::string& merge = merges[rank];
    // The separator is the first space after the first character (the left part may start with
    // a space in hand-made vocabs).
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) return false;
    *left = std::string_view(merge.data(), space);
    *right = std::string_view(merge.data() + space + 1, merge.size() - space - 1);
    return true;
  };
  const auto prefetch = [&](size_t rank) {
    std::string_view left, right;
    if (rank >= merges.size() || prefetch_token == nullptr || !split(rank, &left, &right)) return;
    prefetch_token(left);
    prefetch_token(right);
  };
  std::vector<std::pair<TokenId, TokenId>> pairs(merges.size());
  for (size_t rank = 0; rank < kAhead; ++rank) prefetch(rank);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    prefetch(rank + kAhead);
    std::string_view left, right;
    if (!split(rank, &left, &right)) {
      return InvalidArgumentError(
          fmt::format("tokenizer.ggml.merges[{}] = '{}' is not two tokens separated by a space",
                      rank, merges[rank]));
    }
    pairs[rank] = {find_token(left), find_token(right)};
    if (pairs[rank].first < 0 || pairs[rank].second < 0) {
      return InvalidArgumentError(fmt::format(
          "tokenizer.ggml.merges[{}] = '{}' names '{}', which is not a token of the vocab", rank,
          merges[rank], pairs[rank].first < 0 ? left : right));
    }
  }
  bpe->merges.Reserve(pairs.size());
  for (size_t rank = 0; rank < pairs.size(); ++rank) {
    if (rank + kAhead < pairs.size()) {
      bpe->merges.Prefetch(pairs[rank + kAhead].first, pairs[rank + kAhead].second);
    }
    // The first of duplicate merges keeps its rank, as in llama.cpp. The merged text's token is
    // looked up when a merge happens, not here: most merges are never used by a given text.
    bpe->merges.Insert(pairs[rank].first, pairs[rank].second,
                       MergeTable::Merge{static_cast<int32_t>(rank)});
  }
  return bpe;
}

void Tokenizer::EncodeBytePairs(std::string_view text, std::vector<TokenId>* ids) const {
  const BpeModel& bpe = *bpe_;
  CodepointText t;
  DecodeUtf8(text, &t.cpts);
  t.flags.resize(t.cpts.size());
  for (size_t i = 0; i < t.cpts.size(); ++i) t.flags[i] = UnicodeFlags(t.cpts[i]);
  std::vector<uint32_t> words;
  std::vector<uint32_t> scratch;
  SplitWords(bpe.pre, t, &words, &scratch);

  std::string word;
  std::string utf8;
  std::vector<Symbol> symbols;
  std::vector<Bigram> queue_storage;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue(BigramOrder(),
                                                                      std::move(queue_storage));
  const auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    if (l.token < 0 || r.token < 0) return;
    const MergeTable::Merge* merge = bpe.merges.Find(l.token, r.token);
    if (merge == nullptr) return;
    queue.push({left, right, merge->rank, l.length + r.length});
  };

  // Word cache, for texts long enough to repeat words (a short prompt would only pay for it).
  constexpr size_t kCacheFromBytes = 4096;
  constexpr size_t kMaxCachedWords = 1 << 16;
  const bool use_cache = text.size() >= kCacheFromBytes;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache;  // word -> ids span
  std::vector<TokenId> cache_ids;

  size_t begin = 0;
  for (const uint32_t length : words) {
    // Spell the word: its code points back to UTF-8 (a bad byte is now U+FFFD), each byte as
    // its stand-in character, one symbol per byte.
    word.clear();
    symbols.clear();
    for (size_t i = begin; i < begin + length; ++i) {
      utf8.clear();
      AppendUtf8(t.cpts[i], &utf8);
      for (const char c : utf8) {
        const auto b = static_cast<uint8_t>(c);
        const auto index = static_cast<int32_t>(symbols.size());
        symbols.push_back({index - 1, index + 1, static_cast<uint32_t>(word.size()),
                           static_cast<uint32_t>(bpe.byte_to_unicode[b].size()),
                           bpe.byte_char_token[b]});
        word.append(bpe.byte_to_unicode[b]);
      }
    }
    begin += length;
    if (symbols.empty()) continue;
    symbols.back().next = -1;
    // A long text repeats its words: each distinct word is merged once (the merges of a word
    // depend on the word alone).
    const size_t ids_before = ids->size();
    if (use_cache) {
      if (const auto it = cache.find(word); it != cache.end()) {
        ids->insert(ids->end(), cache_ids.begin() + it->second.first,
                    cache_ids.begin() + it->second.first + it->second.second);
        continue;
      }
    }
    const auto remember = [&] {
      if (!use_cache || cache.size() >= kMaxCachedWords) return;
      cache.emplace(word, std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(cache_ids.size()),
                                                        static_cast<uint32_t>(ids->size() - ids_before)));
      cache_ids.insert(cache_ids.end(), ids->begin() + static_cast<ptrdiff_t>(ids_before), ids->end());
    };

    if (bpe.pre.ignore_merges) {
      if (const TokenId whole = FindToken(word); whole >= 0) {
        ids->push_back(whole);
        remember();
        continue;
      }
    }

    for (size_t i = 1; i < symbols.size(); ++i) {
      try_add_bigram(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
    }
    while (!queue.empty()) {
      const Bigram bigram = queue.top();
      queue.pop();
      Symbol& left = symbols[static_cast<size_t>(bigram.left)];
      Symbol& right = symbols[static_cast<size_t>(bigram.right)];
      if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
        continue;  // stale: one side has merged since
      }
      left.length += right.length;
      left.token = FindToken(std::string_view(word).substr(left.offset, left.length));
      right.length = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
      try_add_bigram(left.prev, bigram.left);
      try_add_bigram(bigram.left, left.next);
    }

    for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
      const Symbol& s = symbols[static_cast<size_t>(i)];
      if (s.token >= 0) {
        ids->push_back(s.token);
        continue;
      }
      // A symbol that is no token: each of its bytes as a token of that one raw byte, where the
      // vocab has one (llama.cpp's fallback); otherwise nothing.
      for (size_t k = s.offset; k < s.offset + s.length; ++k) {
        const TokenId id = bpe.raw_byte_token[static_cast<uint8_t>(word[k])];
        if (id >= 0) ids->push_back(id);
      }
    }
    remember();
  }
}

}  // namespace kvl
