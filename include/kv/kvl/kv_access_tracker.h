// What attention read of each page, the planner's measure of a page's heat: the attention mass
// each position of a sequence received (the forward pass adds it through AttentionMass), and per
// full page when a step last read it and how many steps did (KvPageAccess). One of the pager's
// parts (KvPager owns it): it never moves a page, it only remembers what was read.
//
// Thread-safety: owned by the step loop; AttentionMass's buffer is written by the forward pass
// between BeginStep calls.
#pragma once

#include <cstdint>

namespace kvl {

struct KvSequencePages;

class KvAccessTracker {
 public:
  KvAccessTracker(int32_t block_tokens, int64_t max_context)
      : block_tokens_(block_tokens), max_context_(max_context) {}

  // Attention mass is only gathered when some policy reads it (it costs a pass over the
  // attention weights of each sequence's newest token per layer).
  void set_enabled(bool on) { enabled_ = on; }

  // Admission: the sequence's history starts empty, sized for its first `positions` positions
  // (steps within them never grow it).
  void Start(KvSequencePages& s, int64_t positions) const;
  // The sequence leaves (finished, preempted): its history is forgotten.
  static void Forget(KvSequencePages& s);
  // Cut back to its first `num_blocks` pages: what attention gave the later positions goes.
  void Truncate(KvSequencePages& s, int64_t num_blocks) const;
  // A step of a sequence holding `tokens` tokens begins: its mass grows to cover them (by
  // doubling), pages filled since the last step are noted, and the reads the last step made
  // are counted.
  void BeginStep(KvSequencePages& s, int64_t tokens) const;

  // The per-position accumulators the forward pass adds to; null when not gathered.
  float* AttentionMass(KvSequencePages& s) const;
  // Mass the page's tokens received per step since it was filled (mean over steps), in [0, 1].
  double PageMass(const KvSequencePages& s, int64_t block_index) const;
  // Steps since attention last read the page with weight, and how many steps did.
  static int64_t StepsSinceRead(const KvSequencePages& s, int64_t block_index);
  static int64_t PageReads(const KvSequencePages& s, int64_t block_index);

 private:
  // Updates each full page's KvPageAccess from the mass the last step added.
  void NoteReads(KvSequencePages& s, int64_t full_blocks, int64_t tokens) const;

  int32_t block_tokens_;
  int64_t max_context_;
  bool enabled_ = false;
};

}  // namespace kvl
