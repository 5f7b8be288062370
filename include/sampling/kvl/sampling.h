// Turns a row of logits into the next token: logit bias, the repetition, frequency and presence
// penalties, then top-k, top-p, min-p, temperature and a draw from a seeded RNG (llama.cpp's
// order). Temperature 0 is greedy (argmax).
//
// Thread-safety: a Sampler belongs to one sequence; it keeps its RNG state and scratch.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kvl/status.h"

namespace kvl {

struct SamplingParams {
  float temperature = 0.8f;   // 0 = greedy
  int32_t top_k = 40;         // 0: off
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;  // 1 = off (llama.cpp's --repeat-penalty)
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at; -1 = all, 0 = off
  // OpenAI's penalties, in [-2, 2] (0 = off): logit -= count * frequency_penalty +
  // (count > 0) * presence_penalty, where count is how often the token occurs among the tokens
  // penalty_scope names. Applied after the repetition penalty, as llama.cpp's penalty sampler.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // Which tokens the frequency and presence penalties count. OpenAI defines them over the tokens
  // sampled so far (the prompt is not counted; vLLM does the same); llama.cpp counts the last
  // repeat_last_n tokens of prompt and output, the repetition penalty's window.
  enum class PenaltyScope : uint8_t { kGenerated, kRepeatWindow };
  PenaltyScope penalty_scope = PenaltyScope::kGenerated;
  uint64_t seed = 0xFFFFFFFF;   // llama.cpp's "random" default; any fixed value reproduces a run
  // Added to a token's logit before any filter (OpenAI's logit_bias: token id -> [-100, 100]).
  // The ids are checked against the vocabulary where it is known (Engine::Submit).
  std::vector<std::pair<int32_t, float>> logit_bias;

  // INVALID_ARGUMENT naming the field for values outside their range (negative temperature,
  // top_p outside (0, 1], ...).
  Status Validate() const;
};

class Sampler {
 public:
  // `params` must pass Validate() (checked). All scratch is allocated here, so Sample never
  // touches the heap. The first `prompt_tokens` entries of every history are the prompt: the
  // frequency and presence penalties of PenaltyScope::kGenerated do not count them.
  Sampler(const SamplingParams& params, int32_t vocab_size, size_t prompt_tokens = 0);

  // Picks the next token. `logits` holds vocab_size values. `history` is the sequence so far
  // (prompt + generated), for the penalty; ids outside the vocab are ignored. logits is not
  // modified.
  //
  // `allowed`, when given, is a bit set over the vocabulary (bit t % 64 of word t / 64; a
  // grammar's mask, kvl/token_mask.h): every other token's logit is -inf before any other step,
  // so greedy takes the best allowed token and no filter or draw can pick a masked one. At
  // least one token must be allowed (checked).
  int32_t Sample(const float* logits, const std::vector<int32_t>& history,
                 const uint64_t* allowed = nullptr);

  // Writes to `out` (vocab_size values) each token's logit after the logit bias and the
  // repetition, frequency and presence penalties for `history`: what the filters and the draw
  // start from. For tests and diagnostics; allocates nothing.
  void PenalizedLogits(const float* logits, const std::vector<int32_t>& history, float* out);

  // Index of the largest logit (lowest index on ties).
  static int32_t Argmax(const float* logits, int32_t n);
  // The same among the tokens `allowed` marks (-1 where none is).
  static int32_t MaskedArgmax(const float* logits, int32_t n, const uint64_t* allowed);

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };

  // Where in a history the two penalties' tokens start (each runs to its end).
  struct PenaltyRanges {
    size_t repeat_begin;  // the repetition penalty's window
    size_t count_begin;   // the tokens the frequency and presence penalties count
  };
  // Flags the distinct tokens of the repetition window in penalized_ and counts the frequency
  // and presence penalties' tokens in counts_; ClearPenalized undoes both in O(history), not
  // O(vocab).
  PenaltyRanges MarkPenalized(const std::vector<int32_t>& history);
  void ClearPenalized(const std::vector<int32_t>& history, PenaltyRanges ranges);
  // logits[id] after the logit bias and the penalties (for the tokens MarkPenalized marked).
  float PenalizedLogit(const float* logits, int32_t id) const;
  bool repeat_penalty_on() const;
  bool count_penalties_on() const;
  // Sample() between marking and clearing the penalty flags.
  int32_t SampleMarked(const float* logits);
  // Fills candidates_ with every token's penalized logit.
  void LoadCandidates(const float* logits);
  // Fills candidates_[0, k) with the k best tokens in descending order, in one pass.
  void SelectTopK(const float* logits, int32_t k);
  // Moves the k best of candidates_[begin, end) to its front in descending logit order (ties:
  // lower id first), leaving the rest after them in unspecified order.
  void SortRange(int32_t begin, int32_t end, int32_t k);
  // Each filter returns the new number of candidates (at least 1); `sorted` says whether
  // candidates_[0, n) is already in descending order.
  int32_t ApplyTopP(int32_t n, bool* sorted);
  int32_t ApplyMinP(int32_t n, bool sorted);
  // Temperature, softmax and a draw among candidates_[0, n).
  int32_t Draw(int32_t n);

  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // preallocated scratch, vocab_size entries
  size_t prompt_tokens_;
  std::vector<uint8_t> penalized_;     // [vocab_size] 1 for tokens in the repetition window
  std::vector<int32_t> counts_;        // [vocab_size] frequency/presence counts, or empty when off
  std::vector<float> bias_;            // [vocab_size] logit_bias, or empty when none is given
  const uint64_t* allowed_ = nullptr;  // the mask of the Sample call in progress, or null
};

}  // namespace kvl
