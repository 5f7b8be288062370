// The Mixture-of-Experts FFN of the architectures that have one (qwen3moe; Mixtral's experts in a
// llama file): its metadata and its tensors, with llama.cpp's keys and names.
#pragma once

#include <cstdint>

#include "kvl/gguf.h"
#include "kvl/model.h"
#include "kvl/status.h"
#include "weight_binder.h"

namespace kvl {

// Whether `architecture` runs experts (qwen3moe always; llama and mistral where expert_count > 0).
bool ArchitectureHasExperts(const GgufFile& f, const std::string& architecture);

// c.moe and c.ffn_dim (each expert's width) from {arch}.expert_count, expert_used_count and
// qwen3moe's expert_feed_forward_length (else feed_forward_length / expert_used_count, as
// llama.cpp falls back; Mixtral's experts are feed_forward_length wide). Refuses what llama.cpp
// would run differently and kvlattice does not: grouped routing, shared experts, a per-layer
// top-k that varies.
Status ReadMoeConfig(const GgufFile& f, ModelConfig& c);

// Layer `layer`'s router (ffn_gate_inp) and stacked experts (ffn_{gate,up,down}_exps).
Status BindMoeFfn(WeightBinder& binder, const ModelConfig& c, int64_t layer, LayerWeights& w);

}  // namespace kvl
