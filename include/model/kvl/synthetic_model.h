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
};

// stories15M, smollm-135m, tinyllama-1.1b, llama-2-7b (and a few more).
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
