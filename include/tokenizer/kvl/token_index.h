// Flat open-addressing hash tables for the tokenizer's two hot lookups: a token's id by its text
// (every merged BPE symbol, every SentencePiece bigram) and a merge's rank by its pair of token ids.
// std::unordered_map's node per entry made loading a 150k-token vocabulary cost 150+ ms in cache
// misses and allocations; these hold one flat array each, built once, read-only afterwards.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvl {

// A 64-bit hash of short strings (token texts): 8 bytes at a time, multiply-mix.
uint64_t HashTokenText(std::string_view text);

// Text -> token id over a vector of token texts that outlives it (ids index that vector).
class TokenIndex {
 public:
  // Indexes every text; where texts repeat, the last id wins (as llama.cpp's map does).
  void Build(const std::vector<std::string>* texts);
  int32_t Find(std::string_view text) const;
  // Starts loading the slot `text` would be found in (to look many texts up back to back).
  void Prefetch(std::string_view text) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[(HashTokenText(text) >> 32) & mask_]);
  }

 private:
  // A text of at most 8 bytes is compared inside its slot (head and length), so most lookups
  // touch one cache line; a longer one compares its head, then the text itself.
  struct Slot {
    uint64_t head;  // the first 8 bytes of the text, zero-padded
    uint32_t tag;   // the hash's low 24 bits above the text's length (255 for 255 or more)
    int32_t id;     // -1: empty
  };
  static uint64_t Head(std::string_view text);
  static uint32_t Tag(uint64_t hash, size_t length) {
    return (static_cast<uint32_t>(hash) & 0xFFFFFF00u) | static_cast<uint32_t>(length < 255 ? length : 255);
  }
  const std::vector<std::string>* texts_ = nullptr;
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
};

// (left id, right id) -> rank for byte-level BPE merges.
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
  };
  void Reserve(size_t count);
  // Adds a merge unless the pair is there already (the first rank stays, as in llama.cpp).
  void Insert(int32_t left, int32_t right, Merge merge);
  // Starts loading the entry of a pair about to be inserted or found.
  void Prefetch(int32_t left, int32_t right) const {
    if (!entries_.empty()) __builtin_prefetch(&entries_[Mix(Key(left, right)) & mask_]);
  }
  // nullptr when the pair has no merge.
  const Merge* Find(int32_t left, int32_t right) const {
    const uint64_t key = Key(left, right);
    for (uint64_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e.merge;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Entry {
    uint64_t key;
    Merge merge;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  static uint64_t Mix(uint64_t key) {  // MurmurHash3's finalizer: every bit reaches the low ones
    key ^= key >> 33;
    key *= 0xFF51AFD7ED558CCDull;
    key ^= key >> 33;
    key *= 0xC4CEB9FE1A85EC53ull;
    return key ^ (key >> 33);
  }
  void Grow();

  std::vector<Entry> entries_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace kvl
