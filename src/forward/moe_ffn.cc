#include "moe_ffn.h"

#include <algorithm>
#include <cstring>

#include "for_each_row.h"

namespace kvl {
namespace {

size_t Elems(int64_t a, int64_t b) { return static_cast<size_t>(a * b); }

// llama.cpp clamps the sum of the chosen weights to the smallest normal f16 before dividing.
constexpr float kMinWeightSum = 6.103515625e-5f;

}  // namespace

MoeFeedForward::MoeFeedForward(const ModelConfig& config, ops::OpsContext& ops)
    : config_(config), ops_(ops) {
  KVL_CHECK(config.is_moe() && config.moe.num_experts_used <= config.moe.num_experts);
  expert_begin_.resize(static_cast<size_t>(config.moe.num_experts + 1));
}

void MoeFeedForward::Reserve(int64_t rows) {
  if (rows <= rows_) return;
  const ModelConfig& c = config_;
  const int64_t k = c.moe.num_experts_used;
  rows_ = rows;
  probs_.resize(Elems(rows, c.moe.num_experts));
  choice_.resize(Elems(rows, k));
  weight_.resize(Elems(rows, k));
  sorted_token_.resize(Elems(rows, k));
  row_of_choice_.resize(Elems(rows, k));
  x_sorted_.resize(Elems(rows, c.dim));
  y_sorted_.resize(Elems(rows * k, c.dim));
}

int64_t MoeFeedForward::ScratchBytesPerRow(const ModelConfig& c) {
  if (!c.is_moe()) return 0;
  const int64_t k = c.moe.num_experts_used;
  const int64_t floats = c.moe.num_experts + k + c.dim + k * c.dim;
  const int64_t ints = 3 * k;
  return (floats + ints) * 4;
}

int64_t MoeFeedForward::scratch_bytes() const {
  size_t bytes = (probs_.capacity() + weight_.capacity() + x_sorted_.capacity() +
                  y_sorted_.capacity()) * sizeof(float);
  bytes += (choice_.capacity() + sorted_token_.capacity() + row_of_choice_.capacity() +
            expert_begin_.capacity()) * sizeof(int32_t);
  return static_cast<int64_t>(bytes);
}

void MoeFeedForward::Run(const LayerWeights& w, const float* xn, int64_t n, float* gate,
                         float* up, float* out) {
  const ModelConfig& c = config_;
  const int64_t k = c.moe.num_experts_used;
  KVL_CHECK(n > 0 && n <= rows_);
  // Router: logits[t][e] = ffn_gate_inp[e] . xn[t].
  ops::MatMul(ops_, w.router, xn, n, probs_.data());
  Route(n);
  Group(n);
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    if (expert_begin_[static_cast<size_t>(e) + 1] > expert_begin_[static_cast<size_t>(e)]) {
      RunExpert(w, e, xn, gate, up);
    }
  }
  // out[t] = w0 * y0 + w1 * y1 + ...: each product rounded, then summed in rank order (llama.cpp
  // multiplies the experts' outputs by their weights, then adds them up one after another).
  const int64_t dim = c.dim;
  ForEachRow(*ops_.pool(), n, [&](int64_t t) {
    float* o = out + t * dim;
    for (int64_t i = 0; i < k; ++i) {
      const size_t choice = Elems(t, k) + static_cast<size_t>(i);
      const float weight = weight_[choice];
      const float* y = &y_sorted_[Elems(row_of_choice_[choice], dim)];
      if (i == 0) {
        for (int64_t j = 0; j < dim; ++j) o[j] = weight * y[j];
      } else {
        for (int64_t j = 0; j < dim; ++j) {
          const float term = weight * y[j];
          o[j] += term;
        }
      }
    }
  });
}

void MoeFeedForward::Route(int64_t n) {
  const int64_t num_experts = config_.moe.num_experts;
  const int64_t k = config_.moe.num_experts_used;
  ForEachRow(*ops_.pool(), n, [&](int64_t t) {
    float* p = &probs_[Elems(t, num_experts)];
    ops::Softmax(ops_, p, num_experts);
    int32_t* chosen = &choice_[Elems(t, k)];
    float* weights = &weight_[Elems(t, k)];
    // Top-k by repeated selection: k passes over a few hundred experts at most. A chosen expert's
    // probability is marked kTaken once its weight is read, and skipped after: k distinct experts
    // even where the logits are NaN (so no expert gets more rows than the batch has tokens).
    constexpr float kTaken = -2.0f;  // below any probability
    double sum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      int64_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        if (p[e] == kTaken) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      chosen[i] = static_cast<int32_t>(best);
      weights[i] = p[best];
      sum += static_cast<double>(p[best]);
      p[best] = kTaken;
    }
    const float total = std::max(static_cast<float>(sum), kMinWeightSum);
    for (int64_t i = 0; i < k; ++i) weights[i] /= total;
  });
}

void MoeFeedForward::Group(int64_t n) {
  const int64_t num_experts = config_.moe.num_experts;
  const int64_t k = config_.moe.num_experts_used;
  std::fill(expert_begin_.begin(), expert_begin_.end(), 0);
  for (int64_t c = 0; c < n * k; ++c) ++expert_begin_[static_cast<size_t>(choice_[static_cast<size_t>(c)]) + 1];
  for (int64_t e = 0; e < num_experts; ++e) {
    expert_begin_[static_cast<size_t>(e) + 1] += expert_begin_[static_cast<size_t>(e)];
  }
  // Tokens in batch order within each expert; the cursor of each expert is its begin, moved on.
  // A token chooses an expert at most once, so an expert has at most n rows.
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      const size_t choice = Elems(t, k) + static_cast<size_t>(i);
      int32_t& cursor = expert_begin_[static_cast<size_t>(choice_[choice])];
      sorted_token_[static_cast<size_t>(cursor)] = static_cast<int32_t>(t);
      row_of_choice_[choice] = cursor++;
    }
  }
  // The cursors now sit at each expert's end, which is the next expert's begin: shift back.
  for (int64_t e = num_experts; e > 0; --e) {
    expert_begin_[static_cast<size_t>(e)] = expert_begin_[static_cast<size_t>(e) - 1];
  }
  expert_begin_[0] = 0;
}

void MoeFeedForward::RunExpert(const LayerWeights& w, int64_t expert, const float* xn,
                               float* gate, float* up) {
  const ModelConfig& c = config_;
  const int64_t begin = expert_begin_[static_cast<size_t>(expert)];
  const int64_t rows = expert_begin_[static_cast<size_t>(expert) + 1] - begin;
  const int64_t dim = c.dim;
  const int64_t ffn = c.ffn_dim;
  // Gather the expert's input rows (decode: one).
  ForEachRow(*ops_.pool(), rows, [&](int64_t r) {
    const int32_t t = sorted_token_[static_cast<size_t>(begin + r)];
    std::memcpy(&x_sorted_[Elems(r, dim)], xn + Elems(t, dim), sizeof(float) * static_cast<size_t>(dim));
  });
  const MatrixView gate_up[] = {w.gate_exps.Expert(expert), w.up_exps.Expert(expert)};
  float* const outs[] = {gate, up};
  ops::MatMulGroup(ops_, gate_up, x_sorted_.data(), rows, outs);
  // SwiGLU a row at a time, so that a row's elements see the same vector lanes whatever the
  // expert's row count (a kernel's tail is the last n % width values of a call).
  for (int64_t r = 0; r < rows; ++r) ops::SwiGlu(ops_, gate + r * ffn, up + r * ffn, ffn);
  // Down straight into the expert's sorted output rows.
  ops::MatMul(ops_, w.down_exps.Expert(expert), gate, rows, &y_sorted_[Elems(begin, dim)]);
  ++counts_.runs;
  counts_.rows += rows;
}

}  // namespace kvl
