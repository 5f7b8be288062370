// The Mixture-of-Experts FFN (ModelConfig::moe) of one layer over a run's rows, as a CPU engine
// should run it:
//  - routing: the router's logits (one MatMul), per token a softmax, its top-k experts and their
//    weights renormalized to sum to 1 (llama.cpp's build_moe_ffn with norm_w, for qwen3moe and
//    Mixtral);
//  - grouping: the rows are sorted by expert (a counting sort, tokens in batch order within an
//    expert), so each chosen expert runs once, as one GEMM over its rows (gate and up sharing
//    their quantized input, SwiGLU, down), through the same MatMul kernels as the dense FFN; an
//    expert no row chose is never read, so a decode step reads k experts' weights per layer;
//  - combining: each token's output is the sum of its experts' outputs times their weights, in
//    the token's rank order.
// Every step is the token's own (MatMul is batch-invariant, the rest is per row), so a token's
// output is bit-identical whichever tokens share its run: prefill == decode.
//
// Thread-safety: one per Forward; Run uses ops' pool. All scratch is reserved by Reserve; Run
// allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "kvl/forward.h"
#include "kvl/model.h"
#include "kvl/ops.h"

namespace kvl {

class MoeFeedForward {
 public:
  MoeFeedForward(const ModelConfig& config, ops::OpsContext& ops);

  // Room for runs of up to `rows` rows (grown, never shrunk).
  void Reserve(int64_t rows);

  // out[t] = sum_i weight[t][i] * W_down,e (silu(W_gate,e xn[t]) * W_up,e xn[t]) for the experts e
  // token t chose (i its rank), for t < n. xn: [n][dim]; out: [n][dim]. gate and up are scratch of
  // [n][ffn_dim] each (the dense FFN's, which an MoE layer does not use).
  void Run(const LayerWeights& w, const float* xn, int64_t n, float* gate, float* up, float* out);

  // What the experts ran since construction (kvl/forward.h).
  const ExpertRunTotals& counts() const { return counts_; }
  int64_t scratch_bytes() const;
  // What Reserve holds per row: what Forward::ScratchBytesPerRow adds for an MoE model.
  static int64_t ScratchBytesPerRow(const ModelConfig& c);

 private:
  // Per token: softmax of its router logits, its top-k experts (ties to the lower index) and their
  // renormalized weights.
  void Route(int64_t n);
  // Sorts the rows (token, rank) by expert: expert_begin_, sorted_token_, row_of_choice_.
  void Group(int64_t n);
  void RunExpert(const LayerWeights& w, int64_t expert, const float* xn, float* gate, float* up);

  const ModelConfig& config_;
  ops::OpsContext& ops_;
  int64_t rows_ = 0;
  std::vector<float> probs_;            // [rows][num_experts] router logits, then softmax
  std::vector<int32_t> choice_;         // [rows][k] chosen experts, by rank
  std::vector<float> weight_;           // [rows][k] their weights
  std::vector<int32_t> expert_begin_;   // [num_experts + 1] first sorted row of each expert
  std::vector<int32_t> sorted_token_;   // [rows * k] the token of each sorted row
  std::vector<int32_t> row_of_choice_;  // [rows][k] the sorted row of each (token, rank)
  std::vector<float> x_sorted_;         // [rows][dim] one expert's input rows, gathered
  std::vector<float> y_sorted_;         // [rows * k][dim] every expert's output rows, sorted
  ExpertRunTotals counts_;
};

}  // namespace kvl
