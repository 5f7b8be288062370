#include "kvl/kv_access_tracker.h"

#include <algorithm>

#include "kvl/kv_page_table.h"

namespace kvl {

void KvAccessTracker::Start(KvSequencePages& s, int64_t positions) const {
  const auto blocks = static_cast<size_t>((positions + block_tokens_ - 1) / block_tokens_);
  s.mass.assign(static_cast<size_t>(positions), 0.0f);
  s.steps = 0;
  s.filled_at_step.clear();
  s.filled_at_step.reserve(blocks);
  s.access.clear();
  s.access.reserve(blocks);
}

void KvAccessTracker::Forget(KvSequencePages& s) {
  s.mass.clear();
  s.filled_at_step.clear();
  s.access.clear();
  s.steps = 0;
}

void KvAccessTracker::Truncate(KvSequencePages& s, int64_t num_blocks) const {
  const auto keep = static_cast<size_t>(num_blocks);
  if (s.filled_at_step.size() > keep) s.filled_at_step.resize(keep);
  const auto positions =
      std::min(s.mass.size(), static_cast<size_t>(num_blocks * block_tokens_));
  std::fill(s.mass.begin() + static_cast<ptrdiff_t>(positions), s.mass.end(), 0.0f);
}

void KvAccessTracker::BeginStep(KvSequencePages& s, int64_t tokens) const {
  ++s.steps;
  // Attention mass is written per position by this step's forward pass.
  const int64_t positions = std::min(max_context_, tokens);
  if (static_cast<int64_t>(s.mass.size()) < positions) {
    s.mass.resize(static_cast<size_t>(std::min(
                      max_context_, std::max(positions, 2 * static_cast<int64_t>(s.mass.size())))),
                  0.0f);
  }
  const int64_t full_blocks = tokens / block_tokens_;
  if (static_cast<int64_t>(s.filled_at_step.size()) < full_blocks) {
    s.filled_at_step.resize(static_cast<size_t>(full_blocks), s.steps);
  }
  if (enabled_) NoteReads(s, full_blocks, positions);
}

float* KvAccessTracker::AttentionMass(KvSequencePages& s) const {
  return enabled_ && !s.mass.empty() ? s.mass.data() : nullptr;
}

double KvAccessTracker::PageMass(const KvSequencePages& s, int64_t block_index) const {
  if (s.mass.empty()) return 0;
  const int64_t first = block_index * block_tokens_;
  double sum = 0;
  const int64_t end =
      std::min<int64_t>(first + block_tokens_, static_cast<int64_t>(s.mass.size()));
  for (int64_t p = first; p < end; ++p) sum += s.mass[static_cast<size_t>(p)];
  const int64_t since = static_cast<size_t>(block_index) < s.filled_at_step.size()
                            ? s.steps - s.filled_at_step[static_cast<size_t>(block_index)] + 1
                            : 1;
  return sum / static_cast<double>(std::max<int64_t>(1, since));
}

void KvAccessTracker::NoteReads(KvSequencePages& s, int64_t full_blocks, int64_t tokens) const {
  if (static_cast<int64_t>(s.access.size()) < full_blocks) {
    s.access.resize(static_cast<size_t>(full_blocks), KvPageAccess{s.steps, 0, 0});
  }
  if (tokens <= 0 || s.mass.empty()) return;
  // Half of what a uniform spread of one step's mass (1 per step) would give a page.
  const double threshold = 0.5 * static_cast<double>(block_tokens_) / static_cast<double>(tokens);
  const int64_t bt = block_tokens_;
  for (int64_t b = 0; b < full_blocks; ++b) {
    const int64_t end = std::min<int64_t>((b + 1) * bt, static_cast<int64_t>(s.mass.size()));
    double sum = 0;
    for (int64_t p = b * bt; p < end; ++p) sum += s.mass[static_cast<size_t>(p)];
    KvPageAccess& a = s.access[static_cast<size_t>(b)];
    if (sum - a.mass_seen >= threshold) {
      a.last_read_step = s.steps;
      ++a.reads;
    }
    a.mass_seen = sum;
  }
}

int64_t KvAccessTracker::StepsSinceRead(const KvSequencePages& s, int64_t block_index) {
  if (static_cast<size_t>(block_index) >= s.access.size()) return 0;
  return s.steps - s.access[static_cast<size_t>(block_index)].last_read_step;
}

int64_t KvAccessTracker::PageReads(const KvSequencePages& s, int64_t block_index) {
  if (static_cast<size_t>(block_index) >= s.access.size()) return 0;
  return s.access[static_cast<size_t>(block_index)].reads;
}

}  // namespace kvl
