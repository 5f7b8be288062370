#include "speculator.h"

#include <algorithm>

namespace kvl {
namespace {

// Per-sequence and engine-wide counts decay by this per compared token: the rate follows the
// text (a quoted passage ends, prose begins) within a few dozen tokens.
constexpr double kAcceptDecay = 0.97;
// The engine-wide rate weighs as this many compared tokens of a sequence's own.
constexpr double kPriorTokens = 4;
// Before anything was compared at all: optimistic, so that drafts are tried and measured.
constexpr double kFirstPrior = 0.6;

}  // namespace

Speculator::Speculator(const SpecOptions& options)
    : options_(options),
      drafter_(options.mode == SpecMode::kSuffix ? std::unique_ptr<Drafter>(new SuffixDrafter())
                                                 : std::unique_ptr<Drafter>(new NgramDrafter())),
      curve_(options.max_batch_tokens) {
  candidates_.reserve(static_cast<size_t>(options.max_seqs));
  order_.reserve(static_cast<size_t>(options.max_seqs));
  drafting_.reserve(static_cast<size_t>(options.max_seqs));
}

int64_t Speculator::max_draft_rows() const {
  return options_.mode == SpecMode::kOff ? 0 : int64_t{options_.max_seqs} * options_.draft_max;
}

void Speculator::Prepare(Sequence& seq) const {
  if (options_.mode == SpecMode::kOff) return;
  const size_t n = static_cast<size_t>(options_.draft_max) + 1;
  seq.spec.draft.reserve(n);
  seq.spec.step_tokens.reserve(n);
  seq.spec.shadow.reserve(n);
}

void Speculator::ScoreShadow(Sequence& seq) {
  SpecSequenceState& s = seq.spec;
  if (s.shadow_at < 0 || s.shadow.empty()) return;
  const int64_t known = static_cast<int64_t>(seq.tokens.size()) - s.shadow_at;
  int64_t matched = 0;
  bool missed = false;
  for (int64_t i = 0; i < known && i < static_cast<int64_t>(s.shadow.size()); ++i) {
    if (seq.tokens[static_cast<size_t>(s.shadow_at + i)] != s.shadow[static_cast<size_t>(i)]) {
      missed = true;
      break;
    }
    ++matched;
  }
  const int64_t compared = matched + (missed ? 1 : 0);
  for (int64_t i = 0; i < compared; ++i) {
    const double hit = i < matched ? 1.0 : 0.0;
    s.matched = s.matched * kAcceptDecay + hit;
    s.compared = s.compared * kAcceptDecay + 1;
    matched_ = matched_ * kAcceptDecay + hit;
    compared_ = compared_ * kAcceptDecay + 1;
  }
  s.shadow.clear();
  s.shadow_at = -1;
}

double Speculator::AcceptanceOf(const Sequence& seq) const {
  const double prior = compared_ > 0 ? matched_ / compared_ : kFirstPrior;
  return (seq.spec.matched + kPriorTokens * prior) / (seq.spec.compared + kPriorTokens);
}

void Speculator::Propose(std::span<const std::unique_ptr<Sequence>> running) {
  if (options_.mode == SpecMode::kOff) return;
  candidates_.clear();
  drafting_.clear();
  int64_t base_rows = 0, base_tokens = 0;
  for (const std::unique_ptr<Sequence>& ptr : running) {
    Sequence& seq = *ptr;
    seq.spec.draft.clear();
    const int64_t len = static_cast<int64_t>(seq.tokens.size());
    const int64_t remaining = len - seq.num_computed;
    if (remaining > 1) {
      base_rows += remaining;  // a prefill chunk shares the step (at most the budget)
      continue;
    }
    if (remaining != 1 || seq.finished) continue;
    ++base_rows;
    ++base_tokens;
    ScoreShadow(seq);
    // No draft past the context or the tokens the request may still generate.
    int64_t limit = std::min<int64_t>(options_.draft_max, options_.context_length - len - 1);
    if (seq.request.max_new_tokens >= 0) {
      limit = std::min<int64_t>(limit, seq.request.max_new_tokens - seq.num_generated - 1);
    }
    if (limit <= 0) continue;
    drafter_->Draft(seq.tokens, static_cast<int32_t>(limit), &seq.spec.shadow);
    if (seq.spec.shadow.empty()) continue;
    seq.spec.shadow_at = len;
    candidates_.push_back({static_cast<int64_t>(seq.spec.shadow.size()), AcceptanceOf(seq), 0});
    drafting_.push_back(&seq);
  }
  if (candidates_.empty()) return;
  base_rows = std::min(base_rows, options_.max_batch_tokens);
  const int64_t room = std::min(max_draft_rows(), options_.max_batch_tokens - base_rows);
  if (options_.force) {
    int64_t left = room;
    for (SpecCandidate& c : candidates_) {
      c.chosen = std::min(c.offered, left);
      left -= c.chosen;
    }
  } else {
    ChooseDraftLengths(curve_, base_rows, base_tokens, room, candidates_, &order_);
  }
  for (size_t i = 0; i < drafting_.size(); ++i) {
    SpecSequenceState& s = drafting_[i]->spec;
    const auto k = static_cast<ptrdiff_t>(candidates_[i].chosen);
    if (k == 0) continue;
    s.draft.assign(s.shadow.begin(), s.shadow.begin() + k);
    s.step_tokens.clear();
    s.step_tokens.push_back(drafting_[i]->tokens.back());
    s.step_tokens.insert(s.step_tokens.end(), s.draft.begin(), s.draft.end());
  }
}

}  // namespace kvl
