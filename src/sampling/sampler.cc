// Sampler: llama.cpp's default chain (logit bias, penalties, top-k, top-p, min-p, temperature,
// dist).
//
// The filters work on one preallocated candidate array. Only the filters that need an order pay
// for one: top-k keeps a k-entry heap in one pass over the logits, and top-p sorts a
// growing prefix until it holds enough probability mass, so a 128k vocab is not fully sorted
// per token unless the distribution is nearly flat.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "kvl/sampling.h"

namespace kvl {
namespace {

// Descending logit; the lower id wins ties so results do not depend on the std:: algorithms'
// internal order.
struct ByLogitDesc {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.id < b.id;
  }
};

// A uniform double in [0, 1) from 53 random bits. Written out instead of
// std::uniform_real_distribution so that a seed gives the same tokens with any standard library.
double UniformUnit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

// The first probe size for top-p. Peaked LLM distributions usually reach top_p within a few
// dozen tokens; the probe grows 4x when they do not.
constexpr int32_t kTopPFirstProbe = 64;

bool IsAllowed(const uint64_t* allowed, int32_t id) {
  const auto u = static_cast<uint32_t>(id);
  return (allowed[u >> 6] >> (u & 63)) & 1;
}

}  // namespace

Status SamplingParams::Validate() const {
  // Written as !(x >= lo) so that NaN is rejected too.
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    return InvalidArgumentError("temperature must be a finite value >= 0, got " +
                                std::to_string(temperature));
  }
  if (top_k < 0) {
    return InvalidArgumentError("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgumentError("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgumentError("min_p must be in [0, 1], got " + std::to_string(min_p));
  }
  if (!(repeat_penalty > 0.0f) || std::isinf(repeat_penalty)) {
    return InvalidArgumentError("repeat_penalty must be a finite value > 0, got " +
                                std::to_string(repeat_penalty));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || !(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgumentError(fmt::format(
          "logit_bias: token {} must be a token id >= 0 and its bias in [-100, 100], got {}", id,
          bias));
    }
  }
  // OpenAI's documented range for both.
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return InvalidArgumentError("frequency_penalty must be in [-2, 2], got " +
                                std::to_string(frequency_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return InvalidArgumentError("presence_penalty must be in [-2, 2], got " +
                                std::to_string(presence_penalty));
  }
  if (repeat_last_n < -1) {
    return InvalidArgumentError("repeat_last_n must be >= -1 (-1 = whole history), got " +
                                std::to_string(repeat_last_n));
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size, size_t prompt_tokens)
    : params_(params),
      vocab_size_(vocab_size),
      rng_(params.seed),
      candidates_(static_cast<size_t>(vocab_size)),
      prompt_tokens_(prompt_tokens),
      penalized_(static_cast<size_t>(vocab_size), 0) {
  KVL_CHECK_MSG(vocab_size > 0, "Sampler needs a non-empty vocabulary");
  KVL_CHECK_MSG(params.Validate().ok(), "SamplingParams must be validated before use");
  if (count_penalties_on()) counts_.assign(static_cast<size_t>(vocab_size), 0);
  if (!params.logit_bias.empty()) {
    bias_.assign(static_cast<size_t>(vocab_size), 0.0f);
    for (const auto& [id, bias] : params.logit_bias) {
      KVL_CHECK_MSG(id < vocab_size, "logit_bias names a token outside the vocabulary");
      bias_[static_cast<size_t>(id)] += bias;
    }
  }
}

int32_t Sampler::Argmax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t Sampler::MaskedArgmax(const float* logits, int32_t n, const uint64_t* allowed) {
  int32_t best = -1;
  // Word by word: a mask with few allowed tokens (inside a JSON number, say) skips most of the
  // vocabulary 64 tokens at a time.
  for (int32_t w = 0; w * 64 < n; ++w) {
    for (uint64_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
      const int32_t i = w * 64 + std::countr_zero(bits);
      if (i >= n) break;
      if (best < 0 || logits[i] > logits[best]) best = i;
    }
  }
  return best;
}

bool Sampler::repeat_penalty_on() const {
  return params_.repeat_penalty != 1.0f && params_.repeat_last_n != 0;
}

bool Sampler::count_penalties_on() const {
  return params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f;
}

Sampler::PenaltyRanges Sampler::MarkPenalized(const std::vector<int32_t>& history) {
  const size_t window = params_.repeat_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
  const size_t window_begin = history.size() - window;
  PenaltyRanges ranges{history.size(), history.size()};
  if (repeat_penalty_on()) {
    ranges.repeat_begin = window_begin;
    for (size_t i = window_begin; i < history.size(); ++i) {
      const int32_t id = history[i];
      if (id >= 0 && id < vocab_size_) penalized_[static_cast<size_t>(id)] = 1;
    }
  }
  if (count_penalties_on()) {
    ranges.count_begin = params_.penalty_scope == SamplingParams::PenaltyScope::kGenerated
                             ? std::min(history.size(), prompt_tokens_)
                             : window_begin;
    for (size_t i = ranges.count_begin; i < history.size(); ++i) {
      const int32_t id = history[i];
      if (id >= 0 && id < vocab_size_) ++counts_[static_cast<size_t>(id)];
    }
  }
  return ranges;
}

void Sampler::ClearPenalized(const std::vector<int32_t>& history, PenaltyRanges ranges) {
  // Clearing from the same ranges keeps each call O(history) instead of an O(vocab) fill.
  for (size_t i = ranges.repeat_begin; i < history.size(); ++i) {
    const int32_t id = history[i];
    if (id >= 0 && id < vocab_size_) penalized_[static_cast<size_t>(id)] = 0;
  }
  for (size_t i = ranges.count_begin; i < history.size(); ++i) {
    const int32_t id = history[i];
    if (id >= 0 && id < vocab_size_) counts_[static_cast<size_t>(id)] = 0;
  }
}

float Sampler::PenalizedLogit(const float* logits, int32_t id) const {
  if (allowed_ != nullptr && !IsAllowed(allowed_, id)) {
    return -std::numeric_limits<float>::infinity();
  }
  const auto at = static_cast<size_t>(id);
  float logit = bias_.empty() ? logits[id] : logits[id] + bias_[at];
  if (penalized_[at]) {
    // A flag per token, not a count: each distinct token is penalized once however often it
    // repeats (llama.cpp's rule).
    logit = logit > 0.0f ? logit / params_.repeat_penalty : logit * params_.repeat_penalty;
  }
  if (!counts_.empty() && counts_[at] > 0) {
    logit -= static_cast<float>(counts_[at]) * params_.frequency_penalty +
             params_.presence_penalty;
  }
  return logit;
}

void Sampler::PenalizedLogits(const float* logits, const std::vector<int32_t>& history,
                              float* out) {
  const PenaltyRanges ranges = MarkPenalized(history);
  for (int32_t i = 0; i < vocab_size_; ++i) out[i] = PenalizedLogit(logits, i);
  ClearPenalized(history, ranges);
}

void Sampler::LoadCandidates(const float* logits) {
  for (int32_t i = 0; i < vocab_size_; ++i) {
    candidates_[static_cast<size_t>(i)] = {i, PenalizedLogit(logits, i), 0.0f};
  }
}

void Sampler::SelectTopK(const float* logits, int32_t k) {
  // A heap of the k best so far whose top is the worst of them. Most tokens lose one comparison
  // against the top, so this is one cheap pass over the vocab, with no copy of it.
  auto first = candidates_.begin();
  for (int32_t i = 0; i < k; ++i) {
    candidates_[static_cast<size_t>(i)] = {i, PenalizedLogit(logits, i), 0.0f};
  }
  std::make_heap(first, first + k, ByLogitDesc());
  for (int32_t i = k; i < vocab_size_; ++i) {
    const Candidate c = {i, PenalizedLogit(logits, i), 0.0f};
    if (!ByLogitDesc()(c, candidates_[0])) continue;
    std::pop_heap(first, first + k, ByLogitDesc());
    candidates_[static_cast<size_t>(k - 1)] = c;
    std::push_heap(first, first + k, ByLogitDesc());
  }
  std::sort_heap(first, first + k, ByLogitDesc());
}

void Sampler::SortRange(int32_t begin, int32_t end, int32_t k) {
  auto first = candidates_.begin() + begin;
  auto last = candidates_.begin() + end;
  if (k < end - begin) std::nth_element(first, first + (k - 1), last, ByLogitDesc());
  std::sort(first, first + k, ByLogitDesc());
}

int32_t Sampler::ApplyTopP(int32_t n, bool* sorted) {
  // The normalizer is over all n candidates: top-p keeps the smallest prefix of the sorted
  // candidates whose share of the whole distribution reaches top_p.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
  if (std::isinf(max_logit)) return n;  // Degenerate row; leave it to Draw.
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    const float p = std::exp(candidates_[i].logit - max_logit);
    candidates_[i].p = p;
    sum += p;
  }
  const double target = static_cast<double>(params_.top_p) * sum;

  // Grow a sorted prefix until it holds the mass. Each round sorts only the candidates it adds
  // (the earlier prefix is already the top of the order), so the worst case, a flat
  // distribution, costs one full sort plus a few linear selections.
  int32_t sorted_end = *sorted ? n : 0;
  int32_t probe = *sorted ? n : std::min(n, kTopPFirstProbe);
  double cumulative = 0.0;
  for (int32_t i = 0;; ++i) {
    if (i == sorted_end) {
      if (sorted_end == n) break;
      SortRange(sorted_end, n, probe - sorted_end);
      sorted_end = probe;
      probe = probe > n / 4 ? n : probe * 4;
    }
    cumulative += candidates_[i].p;
    if (cumulative >= target) {
      *sorted = true;  // The kept prefix is the sorted part.
      return i + 1;
    }
  }
  // Rounding kept the sum just short of the target: everything stays.
  *sorted = true;
  return n;
}

int32_t Sampler::ApplyMinP(int32_t n, bool sorted) {
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p): no softmax needed.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
  const float threshold = max_logit + std::log(params_.min_p);
  if (sorted) {
    int32_t keep = 1;
    while (keep < n && candidates_[keep].logit >= threshold) ++keep;
    return keep;
  }
  int32_t keep = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (candidates_[i].logit >= threshold) candidates_[keep++] = candidates_[i];
  }
  return std::max(keep, 1);
}

int32_t Sampler::Draw(int32_t n) {
  const float inv_temperature = 1.0f / params_.temperature;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
  if (std::isinf(max_logit)) {
    // All candidates are -inf (or one is +inf): no distribution to draw from; take the best.
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
      if (ByLogitDesc()(candidates_[i], candidates_[best])) best = i;
    }
    return candidates_[best].id;
  }
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    const float p = std::exp((candidates_[i].logit - max_logit) * inv_temperature);
    candidates_[i].p = p;
    sum += p;
  }
  const double r = UniformUnit(rng_) * sum;
  double cumulative = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    cumulative += candidates_[i].p;
    if (r < cumulative) return candidates_[i].id;
  }
  // r landed in the rounding gap at the top: the last candidate with mass takes it.
  for (int32_t i = n - 1; i > 0; --i) {
    if (candidates_[i].p > 0.0f) return candidates_[i].id;
  }
  return candidates_[0].id;
}

int32_t Sampler::Sample(const float* logits, const std::vector<int32_t>& history,
                        const uint64_t* allowed) {
  const PenaltyRanges ranges = MarkPenalized(history);
  allowed_ = allowed;
  int32_t id = SampleMarked(logits);
  allowed_ = nullptr;
  ClearPenalized(history, ranges);
  if (allowed != nullptr && !IsAllowed(allowed, id)) {
    // Only a row whose allowed logits are all -inf or NaN gets here: no distribution over the
    // allowed tokens, so the first of them (never a masked token).
    id = MaskedArgmax(logits, vocab_size_, allowed);
    KVL_CHECK_MSG(id >= 0, "Sample was given a mask that allows no token");
  }
  return id;
}

int32_t Sampler::SampleMarked(const float* logits) {
  const bool penalty_on = repeat_penalty_on() || count_penalties_on();
  if (params_.temperature <= 0.0f && !penalty_on && bias_.empty()) {
    return allowed_ != nullptr ? MaskedArgmax(logits, vocab_size_, allowed_)
                               : Argmax(logits, vocab_size_);
  }
  if (params_.temperature <= 0.0f) {
    int32_t best = 0;
    float best_logit = PenalizedLogit(logits, 0);
    for (int32_t i = 1; i < vocab_size_; ++i) {
      const float logit = PenalizedLogit(logits, i);
      if (logit > best_logit) {
        best = i;
        best_logit = logit;
      }
    }
    return best;
  }

  int32_t n = vocab_size_;
  bool sorted = false;
  if (params_.top_k > 0 && params_.top_k < n) {
    SelectTopK(logits, params_.top_k);
    n = params_.top_k;
    sorted = true;
  } else {
    LoadCandidates(logits);
  }
  if (params_.top_p < 1.0f) n = ApplyTopP(n, &sorted);
  if (params_.min_p > 0.0f) n = ApplyMinP(n, sorted);
  return Draw(n);
}

}  // namespace kvl
