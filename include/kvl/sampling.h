// Turns a row of logits into the next token: repetition penalty, then temperature, top-k, top-p,
// min-p and a draw from a seeded RNG (llama.cpp's order). Temperature 0 is greedy (argmax).
//
// Thread-safety: a Sampler belongs to one sequence; it keeps its RNG state and scratch.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kvl/status.h"

namespace kvl {

struct SamplingParams {
  float temperature = 0.8f;   // 0 = greedy
  int32_t top_k = 40;         // <= 0: off
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;  // 1 = off (llama.cpp's --repeat-penalty)
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at
  uint64_t seed = 0xFFFFFFFF;   // llama.cpp's "random" default; any fixed value reproduces a run

  // INVALID_ARGUMENT naming the field for values outside their range (negative temperature,
  // top_p outside (0, 1], ...).
  Status Validate() const;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Picks the next token. `history` is the sequence so far (prompt + generated), for the penalty.
  // logits is not modified.
  int32_t Sample(const float* logits, const std::vector<int32_t>& history);

  // Index of the largest logit (lowest index on ties).
  static int32_t Argmax(const float* logits, int32_t n);

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };

  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // preallocated scratch, vocab_size entries
};

}  // namespace kvl
