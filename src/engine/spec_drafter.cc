#include "spec_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace kvl {

StatusOr<SpecMode> ParseSpecMode(std::string_view text) {
  if (text == "off") return SpecMode::kOff;
  if (text == "ngram") return SpecMode::kNgram;
  if (text == "suffix") return SpecMode::kSuffix;
  if (text == "draft") return SpecMode::kDraftModel;
  if (text == "auto") return SpecMode::kAuto;
  return InvalidArgumentError(
      fmt::format("--spec must be auto, ngram, suffix, draft or off, got '{}'", text));
}

std::string_view SpecModeName(SpecMode mode) {
  switch (mode) {
    case SpecMode::kOff: return "off";
    case SpecMode::kNgram: return "ngram";
    case SpecMode::kSuffix: return "suffix";
    case SpecMode::kDraftModel: return "draft";
    case SpecMode::kAuto: return "auto";
  }
  return "?";
}

namespace {

// How far back prompt lookup scans: a 4k context is a few microseconds, longer ones are capped.
constexpr int64_t kLookupWindow = 8192;
// The n-grams the recent requests' ring is indexed by, the longest looked up first.
constexpr int32_t kRingNgrams[] = {16, 8, 4, 3, 2};

// How many tokens before `after` in `context` equal the context's last ones (up to kLongMatch).
int64_t OwnMatchLength(std::span<const int32_t> context, int64_t after) {
  const auto len = static_cast<int64_t>(context.size());
  int64_t n = 0;
  while (n < kLongMatch && after - 1 - n >= 0 &&
         context[static_cast<size_t>(after - 1 - n)] == context[static_cast<size_t>(len - 1 - n)]) {
    ++n;
  }
  return n;
}

}  // namespace

int32_t DraftKind(bool from_ring, int64_t match_length) {
  const int64_t bucket = match_length < 4    ? match_length
                         : match_length < 8  ? 4
                         : match_length < 16 ? 5
                                             : 6;
  return static_cast<int32_t>(std::clamp<int64_t>(bucket, 1, kLengthKinds)) +
         (from_ring ? kLengthKinds : 0);
}

int64_t FindEarlierNgram(std::span<const int32_t> context, int32_t n, int64_t window) {
  const int64_t len = static_cast<int64_t>(context.size());
  if (len <= n) return -1;
  const int32_t* tail = context.data() + len - n;
  const int64_t stop = std::max<int64_t>(0, len - n - window);
  // Latest first: the nearest repetition is the likeliest to go on the same way.
  for (int64_t start = len - n - 1; start >= stop; --start) {
    if (context[static_cast<size_t>(start)] == tail[0] &&
        std::equal(tail, tail + n, context.data() + start)) {
      return start + n;
    }
  }
  return -1;
}

void NgramDrafter::Draft(std::span<const int32_t> context, int32_t max_tokens,
                         std::vector<int32_t>* draft) {
  draft->clear();
  last_kind_ = 0;
  last_match_ = 0;
  for (int32_t n = kMaxNgram; n >= kMinNgram; --n) {
    const int64_t after = FindEarlierNgram(context, n, kLookupWindow);
    if (after < 0) continue;
    // What followed the match, and past the context's end the draft itself: a match that ends
    // at the context's end is a loop of period len - after (a greedy small model repeats a
    // sentence), whose next turn is the tokens it just drafted.
    const auto len = static_cast<int64_t>(context.size());
    for (int64_t i = 0; i < max_tokens; ++i) {
      const int64_t from = after + i;
      draft->push_back(from < len ? context[static_cast<size_t>(from)]
                                  : (*draft)[static_cast<size_t>(from - len)]);
    }
    last_match_ = OwnMatchLength(context, after);
    last_kind_ = DraftKind(false, last_match_);
    return;
  }
}

SuffixDrafter::SuffixDrafter(int64_t capacity_tokens)
    : capacity_(std::max<int64_t>(capacity_tokens, 64)),
      ring_(static_cast<size_t>(capacity_), -1) {}

uint64_t SuffixDrafter::NgramKey(std::span<const int32_t> ngram) {
  // FNV-1a over the ids and the length: distinct n share no key by accident of their zeros.
  uint64_t h = 1469598103934665603ull ^ ngram.size();
  for (int32_t t : ngram) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}

bool SuffixDrafter::HoldsAt(int64_t end, std::span<const int32_t> ngram) const {
  const int64_t n = static_cast<int64_t>(ngram.size());
  if (end - n < std::max<int64_t>(0, written_ - capacity_) || end > written_) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (RingAt(end - n + i) != ngram[static_cast<size_t>(i)]) return false;
  }
  return true;
}

int64_t SuffixDrafter::RingMatchLength(int64_t end, std::span<const int32_t> context) const {
  const int64_t oldest = std::max<int64_t>(0, written_ - capacity_);
  const auto len = static_cast<int64_t>(context.size());
  int64_t n = 0;
  while (n < kLongMatch && n < len && end - 1 - n >= oldest &&
         RingAt(end - 1 - n) == context[static_cast<size_t>(len - 1 - n)]) {
    ++n;  // (a separator, -1, equals no token)
  }
  return n;
}

void SuffixDrafter::Remember(std::span<const int32_t> tokens) {
  const auto keys_per_token = static_cast<int64_t>(std::size(kRingNgrams));
  if (static_cast<int64_t>(index_.size()) > 2 * capacity_ * keys_per_token) {
    index_.clear();  // mostly stale: the tokens past the ring's reach are forgotten anyway
  }
  const int64_t first = written_;
  for (int32_t t : tokens) ring_[static_cast<size_t>(written_++ % capacity_)] = t;
  ring_[static_cast<size_t>(written_++ % capacity_)] = -1;
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int64_t end = kMinNgram; end < len; ++end) {  // an n-gram with a token after it
    for (int32_t n : kRingNgrams) {
      if (n > end) continue;
      index_[NgramKey(tokens.subspan(static_cast<size_t>(end - n), static_cast<size_t>(n)))] =
          first + end;
    }
  }
}

void SuffixDrafter::Draft(std::span<const int32_t> context, int32_t max_tokens,
                          std::vector<int32_t>* draft) {
  own_.Draft(context, max_tokens, draft);
  last_kind_ = own_.last_kind();
  if (index_.empty()) return;
  // The ring's longest n-gram match: it drafts only where it matched longer than the sequence's
  // own tokens did (an own match of kLongMatch is as good as any). (A shorter key's latest
  // occurrence may still match longer than the own one: each key is tried.)
  const int64_t own_match = own_.last_match();
  if (own_match >= kLongMatch) return;
  for (int32_t n : kRingNgrams) {
    if (static_cast<int64_t>(context.size()) < n) continue;
    const std::span<const int32_t> tail = context.last(static_cast<size_t>(n));
    const auto it = index_.find(NgramKey(tail));
    if (it == index_.end() || !HoldsAt(it->second, tail)) continue;
    const int64_t match = RingMatchLength(it->second, context);
    if (match <= own_match || it->second >= written_ || RingAt(it->second) < 0) continue;
    draft->clear();
    for (int64_t at = it->second; at < written_ && static_cast<int32_t>(draft->size()) < max_tokens;
         ++at) {
      const int32_t t = RingAt(at);
      if (t < 0) break;
      draft->push_back(t);
    }
    last_kind_ = DraftKind(true, match);
    return;
  }
}

}  // namespace kvl
