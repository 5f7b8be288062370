// The sampler against a plain sort-based sampler written from the definitions: the same chain
// (top-k, top-p, min-p, temperature, draw) where every filter that needs an order sorts the whole
// candidate list. The sampler avoids that sort (a k-entry heap for top-k, a growing sorted prefix
// for top-p), so for 128k-262k vocabularies a step does not pay for one; this test holds it to
// the same tokens, seed for seed, over many vocab sizes, filter settings and seeds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kvl/sampling.h"

namespace kvl {
namespace {

struct Candidate {
  int32_t id;
  float logit;
  float p;
};

// Descending logit, lower id first on ties: a total order, so a full sort has one answer.
bool Before(const Candidate& a, const Candidate& b) {
  if (a.logit != b.logit) return a.logit > b.logit;
  return a.id < b.id;
}

float MaxLogit(const std::vector<Candidate>& c) {
  float m = -std::numeric_limits<float>::infinity();
  for (const Candidate& x : c) m = std::max(m, x.logit);
  return m;
}

// The sort-based chain, drawing from its own generator seeded as the sampler's is. The one
// freedom the definitions leave, the order in which probabilities are summed, follows the
// candidate list as it stands (vocabulary order until a filter sorts it), which is the sampler's.
class SortingSampler {
 public:
  explicit SortingSampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  int32_t Sample(const std::vector<float>& logits) {
    if (params_.temperature <= 0.0f) {
      std::vector<Candidate> all = Load(logits);
      return std::min_element(all.begin(), all.end(), Before)->id;
    }
    std::vector<Candidate> c = Load(logits);
    bool sorted = false;
    if (params_.top_k > 0 && params_.top_k < static_cast<int32_t>(c.size())) {
      std::sort(c.begin(), c.end(), Before);
      c.resize(static_cast<size_t>(params_.top_k));
      sorted = true;
    }
    if (params_.top_p < 1.0f) TopP(&c, &sorted);
    if (params_.min_p > 0.0f) MinP(&c, sorted);
    return Draw(&c);
  }

 private:
  static std::vector<Candidate> Load(const std::vector<float>& logits) {
    std::vector<Candidate> c(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) c[i] = {static_cast<int32_t>(i), logits[i], 0.0f};
    return c;
  }

  void TopP(std::vector<Candidate>* c, bool* sorted) const {
    const float max_logit = MaxLogit(*c);
    if (std::isinf(max_logit)) return;
    double sum = 0.0;
    for (Candidate& x : *c) {
      x.p = std::exp(x.logit - max_logit);
      sum += x.p;
    }
    const double target = static_cast<double>(params_.top_p) * sum;
    std::sort(c->begin(), c->end(), Before);
    *sorted = true;
    double cumulative = 0.0;
    for (size_t i = 0; i < c->size(); ++i) {
      cumulative += (*c)[i].p;
      if (cumulative >= target) {
        c->resize(i + 1);
        return;
      }
    }
  }

  void MinP(std::vector<Candidate>* c, bool sorted) const {
    const float threshold = MaxLogit(*c) + std::log(params_.min_p);
    std::vector<Candidate> kept;
    for (const Candidate& x : *c) {
      if (x.logit >= threshold) kept.push_back(x);
      else if (sorted) break;  // the rest of a sorted list is below too
    }
    if (kept.empty()) kept.push_back(c->front());
    *c = kept;
  }

  int32_t Draw(std::vector<Candidate>* c) {
    const float inv_temperature = 1.0f / params_.temperature;
    const float max_logit = MaxLogit(*c);
    if (std::isinf(max_logit)) return std::min_element(c->begin(), c->end(), Before)->id;
    double sum = 0.0;
    for (Candidate& x : *c) {
      x.p = std::exp((x.logit - max_logit) * inv_temperature);
      sum += x.p;
    }
    const double r = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * sum;
    double cumulative = 0.0;
    for (const Candidate& x : *c) {
      cumulative += x.p;
      if (r < cumulative) return x.id;
    }
    for (size_t i = c->size(); i-- > 1;) {
      if ((*c)[i].p > 0.0f) return (*c)[i].id;
    }
    return c->front().id;
  }

  SamplingParams params_;
  std::mt19937_64 rng_;
};

// Logits shaped like a language model's: a few strong tokens over a long Gaussian tail, rounded
// to 1/64 so that ties (which the order must break by id) are common.
std::vector<float> ModelLikeLogits(int32_t n, std::mt19937& rng, float spread) {
  std::normal_distribution<float> tail(0.0f, spread);
  std::vector<float> logits(static_cast<size_t>(n));
  for (float& l : logits) l = std::round(tail(rng) * 64.0f) / 64.0f;
  std::uniform_int_distribution<int32_t> pick(0, n - 1);
  for (int i = 0; i < 5; ++i) logits[static_cast<size_t>(pick(rng))] += 4.0f * spread;
  return logits;
}

struct Settings {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};

// Every setting the chain distinguishes: greedy, each filter alone, all together (llama.cpp's
// defaults among them), and flat distributions that make top-p's prefix grow to the whole list.
const Settings kSettings[] = {
    {0.0f, 40, 0.95f, 0.05f}, {0.8f, 40, 0.95f, 0.05f}, {1.0f, 0, 1.0f, 0.0f},
    {0.7f, 0, 0.9f, 0.0f},    {1.3f, 0, 1.0f, 0.1f},    {0.6f, 1000, 1.0f, 0.0f},
    {1.0f, 0, 0.5f, 0.02f},   {2.0f, 100, 0.99f, 0.0f}, {0.9f, 1, 0.95f, 0.05f},
};

TEST(SamplerReferenceTest, SameTokensAsAFullSortForEverySeedVocabAndFilter) {
  const int32_t kVocabs[] = {2, 7, 100, 1000, 32000, 151936};
  int compared = 0;
  for (const int32_t vocab : kVocabs) {
    // Fewer steps on the large vocabularies, where the reference's full sorts are slow.
    const int steps = vocab > 10000 ? 3 : 12;
    for (const Settings& s : kSettings) {
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        SamplingParams p;
        p.temperature = s.temperature;
        p.top_k = s.top_k;
        p.top_p = s.top_p;
        p.min_p = s.min_p;
        p.seed = seed * 7919;
        Sampler sampler(p, vocab);
        SortingSampler reference(p);
        std::mt19937 logit_rng(static_cast<uint32_t>(seed * 31 + static_cast<uint64_t>(vocab)));
        for (int step = 0; step < steps; ++step) {
          // Alternate peaked and nearly flat rows: the flat ones push top-p past its probes.
          const float spread = step % 2 == 0 ? 2.0f : 0.01f;
          const std::vector<float> logits = ModelLikeLogits(vocab, logit_rng, spread);
          ASSERT_EQ(sampler.Sample(logits.data(), {}), reference.Sample(logits))
              << "vocab " << vocab << " seed " << p.seed << " step " << step << " temperature "
              << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p << " min_p "
              << s.min_p;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 9 * 4 * (4 * 12 + 2 * 3));
}

}  // namespace
}  // namespace kvl
