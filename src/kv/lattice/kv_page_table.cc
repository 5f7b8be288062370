#include "kvl/kv_page_table.h"

namespace kvl {

KvPageTable::KvPageTable(const KvManager& manager, int32_t max_seqs)
    : manager_(manager), bound_(static_cast<size_t>(max_seqs), nullptr) {}

void KvPageTable::Bind(SeqId seq, KvSequencePages* pages) {
  KVL_CHECK(bound_[static_cast<size_t>(seq)] == nullptr && pages != nullptr);
  bound_[static_cast<size_t>(seq)] = pages;
}

void KvPageTable::Rebind(SeqId seq, KvSequencePages* pages) {
  KVL_CHECK(bound_[static_cast<size_t>(seq)] != nullptr && pages != nullptr);
  bound_[static_cast<size_t>(seq)] = pages;
}

void KvPageTable::Unbind(SeqId seq) { bound_[static_cast<size_t>(seq)] = nullptr; }

KvSequencePages& KvPageTable::Bound(SeqId seq) {
  KvSequencePages* s = bound_[static_cast<size_t>(seq)];
  KVL_CHECK_MSG(s != nullptr, "a slot with no sequence bound");
  return *s;
}

const KvSequencePages& KvPageTable::Bound(SeqId seq) const {
  const KvSequencePages* s = bound_[static_cast<size_t>(seq)];
  KVL_CHECK_MSG(s != nullptr, "a slot with no sequence bound");
  return *s;
}

KvPage& KvPageTable::At(SeqId seq, int64_t block_index) {
  KvSequencePages& s = Bound(seq);
  if (s.pages.size() <= static_cast<size_t>(block_index)) {
    s.pages.resize(static_cast<size_t>(block_index) + 1);
  }
  return s.pages[static_cast<size_t>(block_index)];
}

KvPageFate KvPageTable::FateOf(SeqId seq, int64_t block_index) const {
  const KvSequencePages& s = Bound(seq);
  return static_cast<size_t>(block_index) < s.pages.size()
             ? s.pages[static_cast<size_t>(block_index)].fate
             : KvPageFate::kResident;
}

bool KvPageTable::CheckpointMissing(SeqId seq, int64_t block_index) const {
  const KvSequencePages& s = Bound(seq);
  if (static_cast<size_t>(block_index) < s.pages.size() &&
      s.pages[static_cast<size_t>(block_index)].checkpoint_missing) {
    return true;
  }
  // A block shared through the prefix cache carries what its first owner knew of it.
  const std::vector<BlockId>& table = manager_.block_table(seq);
  const BlockId block = static_cast<size_t>(block_index) < table.size()
                            ? table[static_cast<size_t>(block_index)]
                            : kNoBlock;
  return block != kNoBlock && manager_.CheckpointsMissing(block);
}

void KvPageTable::Count(const KvPage& page, int64_t delta) {
  if (page.awaiting_restore) return;  // not part of its sequence's KV yet
  switch (page.fate) {
    case KvPageFate::kCompressed:
      held_.compressed += delta;
      break;
    case KvPageFate::kInTier:
      held_.streamed += delta;
      if (page.in_place) held_.in_place += delta;
      break;
    case KvPageFate::kCheckpointed:
      held_.rebuilt += delta;
      break;
    case KvPageFate::kEvicted:
      held_.evicted += delta;
      break;
    case KvPageFate::kDropped:
    case KvPageFate::kResident:
      break;
  }
}

void KvPageTable::MakeResident(KvPage& page) {
  page.fate = KvPageFate::kResident;
  page.action = KvAction::kKeep;
  page.predicted_ms = 0;
  page.model_ms = 0;
  page.slots.clear();
  page.tier = nullptr;
  page.page_id = 0;
  page.content = {};
  page.store_pin = false;
  page.in_place = false;
  page.awaiting_restore = false;
}

}  // namespace kvl
