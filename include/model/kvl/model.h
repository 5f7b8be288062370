// A model: its configuration read from GGUF metadata and typed views of its weights inside the
// mapped file (nothing is copied or dequantized up front).
//
// Thread-safety: immutable after Load; shared freely between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/gguf.h"
#include "kvl/status.h"

namespace kvl {

struct ModelConfig {
  std::string architecture;  // "llama"
  std::string name;          // general.name, or the file's stem
  int64_t dim = 0;           // d_model, the residual stream width
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads: MHA; 1: MQA; otherwise GQA
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // what the file claims; the engine may use less
  float norm_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  int64_t rope_dim = 0;      // rotated dims per head (== head_dim for llama)
  bool rope_neox = false;    // false: rotate (x[2i], x[2i+1]); true: (x[i], x[i + d/2])
  bool tied_output = false;  // output projection shares token_embd.weight

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // K and V of one token in one layer, at `kv_type` (f32/f16/bf16/q8_0/q4_0).
  int64_t KvBytesPerTokenPerLayer(DType kv_type) const;
  // The residual-stream checkpoint of one token in one layer (the layer's input, d_model wide).
  int64_t ResidualBytesPerTokenPerLayer(DType type) const;
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  MatrixView wq;                     // [q_dim][dim]
  MatrixView wk;                     // [kv_dim][dim]
  MatrixView wv;                     // [kv_dim][dim]
  MatrixView wo;                     // [dim][q_dim]
  const float* ffn_norm = nullptr;   // [dim]
  MatrixView w_gate;                 // [ffn_dim][dim]
  MatrixView w_up;                   // [ffn_dim][dim]
  MatrixView w_down;                 // [dim][ffn_dim]
};

class Model {
 public:
  // Maps the file, reads the config and binds every weight, checking each tensor's presence,
  // type and shape against the config. Errors name the file and the key or tensor at fault.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path);
  // The same from an already opened file (tests).
  static StatusOr<std::unique_ptr<Model>> FromGguf(std::unique_ptr<GgufFile> file);

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }

  const MatrixView& token_embedding() const { return token_embd_; }  // [vocab][dim]
  const float* output_norm() const { return output_norm_; }          // [dim]
  const MatrixView& output() const { return output_; }               // [vocab][dim]
  const LayerWeights& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }

  int64_t num_parameters() const { return num_parameters_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // "q8_0" when all layer matrices share a type, else "mixed (q4_k, q6_k)" (most used first).
  std::string weight_type_name() const;

 private:
  Model() = default;
  Status ReadConfig();
  Status BindWeights();

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  MatrixView token_embd_;
  const float* output_norm_ = nullptr;
  MatrixView output_;
  std::vector<LayerWeights> layers_;
  int64_t num_parameters_ = 0;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvl
