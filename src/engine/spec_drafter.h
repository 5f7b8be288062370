// Speculative decoding (issue 26): drafters propose the tokens likely to follow a sequence, for
// the target model to verify in one step. Two drafters need no second model:
//  - NgramDrafter (prompt lookup): the sequence's last n tokens (n from kMaxNgram down to
//    kMinNgram) are looked up earlier in its own prompt and output; what followed the latest
//    match is the draft. Summaries, edits and answers that quote their document repeat it. A
//    match whose continuation reaches the context's end is a loop (a small model repeating a
//    sentence): the draft goes on around it, as long as asked.
//  - SuffixDrafter: the same lookup and an engine-wide index over the tokens of recent
//    requests (a bounded ring), the longer match winning, so a chat's next turn, an agent loop
//    or a second question on the same document drafts from what was said before.
// Drafters only propose; the speculator decides how many tokens a step carries and the step
// runner verifies them, so a wrong draft costs time, never a different output.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvl/status.h"

namespace kvl {

// kAuto: the engine's own choice, the mode a default would be: today the lookups of kSuffix
// (free to draft, so the cost model's gate alone decides whether a step carries a draft).
enum class SpecMode { kOff, kNgram, kSuffix, kDraftModel, kAuto };
// "off" | "ngram" | "suffix" | "draft" | "auto"; INVALID_ARGUMENT naming --spec otherwise.
StatusOr<SpecMode> ParseSpecMode(std::string_view text);
std::string_view SpecModeName(SpecMode mode);

inline constexpr int32_t kMaxNgram = 4;
inline constexpr int32_t kMinNgram = 2;
// A match is measured backwards from its n-gram up to this many tokens: a match of 16+ tokens
// (an agent's task re-issued, a quoted passage) is followed far more often than one of 2.
inline constexpr int32_t kLongMatch = 32;
// What a draft came from, so that the acceptance is kept per kind: 0 a model or unknown; else
// the match's length in buckets (2, 3, 4-7, 8-15, 16+: kinds 2..6) in the sequence's own tokens,
// and the same plus kLengthKinds for a match in the recent requests' ring.
inline constexpr int32_t kLengthKinds = 6;
inline constexpr int32_t kDraftKinds = 2 * kLengthKinds + 1;
int32_t DraftKind(bool from_ring, int64_t match_length);

// One sequence's part of a DraftAll.
struct DraftRequest {
  int32_t key = 0;  // the sequence's slot: where a drafter with state per sequence keeps it
  std::span<const int32_t> context;
  int32_t max_tokens = 0;
  std::vector<int32_t>* draft = nullptr;  // out
  int32_t* kind = nullptr;                // out, where given: the draft's kind
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max_tokens` tokens that may follow `context`, into *draft (cleared first; empty when
  // the drafter has nothing to offer). Allocates nothing once *draft holds max_tokens.
  virtual void Draft(std::span<const int32_t> context, int32_t max_tokens,
                     std::vector<int32_t>* draft) = 0;
  // Every decoding sequence's draft at once (a draft model runs them in one batched pass per
  // token); by default one Draft each.
  virtual void DraftAll(std::span<const DraftRequest> requests) {
    for (const DraftRequest& r : requests) {
      Draft(r.context, r.max_tokens, r.draft);
      if (r.kind != nullptr) *r.kind = last_kind();
    }
  }
  // The kind of the last Draft's draft (kDraftKinds).
  virtual int32_t last_kind() const { return 0; }
  // A request's tokens (prompt and output) as it ends: what later requests may draft from.
  virtual void Remember(std::span<const int32_t> tokens) { (void)tokens; }
  // The sequence under `key` ended: whatever the drafter keeps for it may go.
  virtual void Forget(int32_t key) { (void)key; }
  // Whether a draft costs compute worth weighing (a draft model's passes) rather than a lookup:
  // the speculator then asks for only as many tokens as the cost model would send.
  virtual bool costly() const { return false; }
  // A costly drafter's time per draft token in ms, its catch-up aside (0 until measured).
  virtual double pass_ms() const { return 0; }
};

class NgramDrafter : public Drafter {
 public:
  void Draft(std::span<const int32_t> context, int32_t max_tokens,
             std::vector<int32_t>* draft) override;
  int32_t last_kind() const override { return last_kind_; }
  // The last draft's match length, counted backwards up to kLongMatch (0: no draft).
  int64_t last_match() const { return last_match_; }

 private:
  int32_t last_kind_ = 0;
  int64_t last_match_ = 0;
};

// Where the last n tokens of `context` occurred before (the latest match, longest n first):
// the index after the match, or -1. Scans back at most `window` tokens.
int64_t FindEarlierNgram(std::span<const int32_t> context, int32_t n, int64_t window);

// The lookup of the sequence's own tokens, and an index over the recent requests' tokens (their
// prompts and outputs, Remember'd as each ends): the draft follows whichever match is longer,
// counted backwards from the context's end (the sequence's own on a tie). An agent that re-issues
// a task finds its earlier run's answer behind a match as long as the prompt; a quote within the
// sequence is found by its own lookup.
class SuffixDrafter : public Drafter {
 public:
  // `capacity_tokens`: the ring of recent requests' tokens. Its index holds up to 2 x 5 entries a
  // token before it is cleared, some 50 bytes each: 64 Ki tokens (tens of requests) bound it near
  // 32 MiB for a long-running server, where 1 Mi tokens let it reach half a GiB.
  explicit SuffixDrafter(int64_t capacity_tokens = int64_t{1} << 16);
  void Draft(std::span<const int32_t> context, int32_t max_tokens,
             std::vector<int32_t>* draft) override;
  void Remember(std::span<const int32_t> tokens) override;
  int32_t last_kind() const override { return last_kind_; }
  int64_t tokens_held() const { return std::min<int64_t>(written_, capacity_); }

 private:
  static uint64_t NgramKey(std::span<const int32_t> ngram);
  int32_t RingAt(int64_t absolute) const { return ring_[static_cast<size_t>(absolute % capacity_)]; }
  // Whether the ring still holds `n` tokens ending before `end` that equal `ngram`.
  bool HoldsAt(int64_t end, std::span<const int32_t> ngram) const;
  // How many tokens before the ring's `end` equal the context's last ones (up to kLongMatch;
  // never across a request's end or into what the ring overwrote).
  int64_t RingMatchLength(int64_t end, std::span<const int32_t> context) const;

  NgramDrafter own_;  // the sequence's own tokens
  int32_t last_kind_ = 0;
  int64_t capacity_;
  std::vector<int32_t> ring_;  // -1 separates requests: a draft never runs into the next one
  int64_t written_ = 0;        // tokens ever written (absolute position of the next)
  // n-gram key -> the absolute position after its latest occurrence, for the n of kRingNgrams
  // (the long ones find a re-issued prompt's own earlier run, not the latest request that shares
  // its last few words). Bounded: entries that the ring overwrote are found stale by HoldsAt and
  // the map is rebuilt when it outgrows the ring.
  std::unordered_map<uint64_t, int64_t> index_;
};

}  // namespace kvl
