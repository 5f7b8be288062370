// Writes GGUF files with random weights in the exact shapes of real models, with a working
// SentencePiece-style vocab, so speed can be measured on real shapes without downloading weights.
// The files follow llama.cpp's naming and layout, so llama.cpp loads them too (side-by-side
// benchmarks on the same file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/status.h"

namespace kvl {

struct ModelShape {
  std::string name;  // "tinyllama-1.1b"
  int64_t dim;
  int64_t num_layers;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t ffn_dim;
  int64_t vocab_size;
  int64_t context_length;
  float rope_freq_base;
  float norm_eps;
  bool tied_output;
  // The architecture and what it adds to llama's block (ModelConfig's ArchFeatures), written
  // with the keys and tensor names llama.cpp reads. Defaults: a llama file as before.
  std::string architecture = "llama";  // llama | qwen2 | qwen3 | qwen3moe | gemma2 | gemma3 | phi3
  int64_t head_dim = 0;                // 0: dim / heads; else written as key_length
  int64_t sliding_window = 0;          // gemma2/3: attention.sliding_window
  int64_t sliding_window_pattern = 0;  // 0: the architecture's default (gemma2 2, gemma3 6)
  float attn_softcap = 0.0f;           // gemma2: attn_logit_softcapping
  float final_softcap = 0.0f;          // gemma2 (gemma3 optional): final_logit_softcapping
  float rope_freq_base_local = 0.0f;   // gemma3: rope.freq_base_swa (0: not written)
  float rope_scale_linear = 0.0f;      // rope.scaling.type linear with this factor (0: none)
  float llama3_rope_factor = 0.0f;     // Llama-3.1 rope_freqs for this factor (0: none)
  float random_rope_factors = 0.0f;    // test shapes: rope_freqs uniform in [1, this] (0: none)
  int64_t rope_original_context = 0;   // phi3: LongRoPE long/short factors past this context
  // Norm weights (and biases) random rather than ones (and zeros), so that a forward pass that
  // skipped one would differ: the small test shapes set it.
  bool random_norms = false;
  // Mixture of experts (qwen3moe; a llama file with experts is Mixtral's layout): expert_count
  // SwiGLU experts, expert_used_count of them per token, each expert_ffn_dim wide (qwen3moe's
  // expert_feed_forward_length; 0: ffn_dim, as Mixtral's experts are feed_forward_length wide).
  int64_t num_experts = 0;
  int64_t num_experts_used = 0;
  int64_t expert_ffn_dim = 0;

  int64_t HeadDim() const { return head_dim > 0 ? head_dim : dim / num_heads; }
  // The width of the FFN a token runs (each expert's in an MoE shape).
  int64_t FfnDim() const { return num_experts > 0 && expert_ffn_dim > 0 ? expert_ffn_dim : ffn_dim; }
};

// stories15M, smollm-135m, tinyllama-1.1b, llama-2-7b, the Llama-3 / Qwen2.5 / Qwen3 /
// Qwen3-30B-A3B / Gemma-2 / Gemma-3 / Phi-3 / SmolLM2 / Mistral-Nemo shapes, and small test shapes
// of each architecture ("test-qwen2", "test-qwen3moe", "test-mixtral", ...) that exercise every
// feature in a few MiB.
const std::vector<ModelShape>& KnownModelShapes();
StatusOr<ModelShape> FindModelShape(const std::string& name);

struct SynthOptions {
  ModelShape shape;
  // f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k, for every matrix but those below.
  DType weight_type = DType::kQ8_0;
  uint64_t seed = 1234;
  std::string output_path;
  // The "_M" K-quant mixes (llama.cpp's Q4_K_M, Q5_K_M): when set, output.weight and the attn_v /
  // ffn_down of the layers UsesMoreBits picks are written in this type (Q6_K) instead.
  std::optional<DType> more_bits_type = std::nullopt;
  // A vocab-only GGUF (llama.cpp's models/ggml-vocab-*.gguf) whose tokenizer.* keys are copied,
  // and whose token count becomes the vocab size; empty: a synthetic SentencePiece-style vocab.
  std::string vocab_path = {};
};

// Parses a --type of kvl synth: any supported type name, or "q4_k_m" / "q5_k_m" (Q4_K / Q5_K
// with Q6_K where llama.cpp's mix puts it). False for anything else.
bool ParseSynthType(std::string_view name, SynthOptions* options);
// The name ParseSynthType reads back ("q4_k_m" for a mix).
std::string SynthTypeName(const SynthOptions& options);

// llama.cpp's rule for which layers of an "_M" mix get more bits in attn_v and ffn_down: the
// first and last eighth of the layers and every third one between (about half in all).
bool UsesMoreBits(int64_t layer, int64_t num_layers);

// Number of parameters and bytes the file will hold.
int64_t SyntheticParameterCount(const ModelShape& shape);

Status WriteSyntheticModel(const SynthOptions& options);

}  // namespace kvl
