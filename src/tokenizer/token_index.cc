#include "kvl/token_index.h"

#include <cstring>

namespace kvl {

uint64_t HashTokenText(std::string_view text) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (text.size() * kMul);
  size_t i = 0;
  for (; i + 8 <= text.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, text.data() + i, 8);
    h = (h ^ word) * kMul;
    h ^= h >> 32;
  }
  if (i < text.size()) {
    uint64_t word = 0;
    std::memcpy(&word, text.data() + i, text.size() - i);
    h = (h ^ word) * kMul;
    h ^= h >> 32;
  }
  h *= kMul;
  return h ^ (h >> 29);
}

uint64_t TokenIndex::Head(std::string_view text) {
  uint64_t head = 0;
  // An empty view may have no data pointer, which memcpy must not be given.
  if (!text.empty()) std::memcpy(&head, text.data(), text.size() < 8 ? text.size() : 8);
  return head;
}

void TokenIndex::Build(const std::vector<std::string>* texts) {
  texts_ = texts;
  size_t capacity = 16;
  while (capacity < texts->size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{0, 0, -1});
  mask_ = capacity - 1;
  // Hashes first (a sequential pass), then the inserts with the slots of those a few ahead
  // prefetched, so that the random writes' cache misses overlap.
  std::vector<uint64_t> hashes(texts->size());
  for (size_t id = 0; id < texts->size(); ++id) hashes[id] = HashTokenText((*texts)[id]);
  constexpr size_t kAhead = 16;
  for (size_t id = 0; id < texts->size(); ++id) {
    if (id + kAhead < hashes.size()) __builtin_prefetch(&slots_[(hashes[id + kAhead] >> 32) & mask_], 1);
    const std::string& text = (*texts)[id];
    const uint64_t h = hashes[id];
    const uint64_t head = Head(text);
    const uint32_t tag = Tag(h, text.size());
    for (uint64_t i = (h >> 32) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{head, tag, static_cast<int32_t>(id)};
        break;
      }
      if (s.tag == tag && s.head == head &&
          (text.size() <= 8 || (*texts)[static_cast<size_t>(s.id)] == text)) {
        s.id = static_cast<int32_t>(id);  // a repeated text: the last id wins
        break;
      }
    }
  }
}

int32_t TokenIndex::Find(std::string_view text) const {
  if (slots_.empty()) return -1;
  const uint64_t h = HashTokenText(text);
  const uint64_t head = Head(text);
  const uint32_t tag = Tag(h, text.size());
  for (uint64_t i = (h >> 32) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.id < 0) return -1;
    if (s.tag == tag && s.head == head &&
        (text.size() <= 8 || (*texts_)[static_cast<size_t>(s.id)] == text)) {
      return s.id;
    }
  }
}

void MergeTable::Reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  if (capacity <= entries_.size()) return;
  std::vector<Entry> old = std::move(entries_);
  entries_.assign(capacity, Entry{kEmpty, {}});
  mask_ = capacity - 1;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.key != kEmpty) {
      Insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFF),
             e.merge);
    }
  }
}

void MergeTable::Grow() { Reserve(entries_.empty() ? 8 : entries_.size()); }

void MergeTable::Insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 2 > entries_.size()) Grow();
  const uint64_t key = Key(left, right);
  for (uint64_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key) return;
    if (e.key == kEmpty) {
      e = Entry{key, merge};
      ++size_;
      return;
    }
  }
}

}  // namespace kvl
