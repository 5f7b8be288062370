// Writes GGUF files with random weights in the exact shapes of real models, with a working
// SentencePiece-style vocab, so speed can be measured on real shapes without downloading weights.
// The files follow llama.cpp's naming and layout, so llama.cpp loads them too (side-by-side
// benchmarks on the same file).
#pragma once

#include <cstdint>
#include <string>
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
  DType weight_type = DType::kQ8_0;  // f32 | f16 | bf16 | q8_0 | q4_0, for every matrix
  uint64_t seed = 1234;
  std::string output_path;
};

// Number of parameters and bytes the file will hold.
int64_t SyntheticParameterCount(const ModelShape& shape);

Status WriteSyntheticModel(const SynthOptions& options);

}  // namespace kvl
