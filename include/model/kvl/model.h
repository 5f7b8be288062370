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

// Where an architecture's block departs from llama's. Every field has llama's value by default,
// so a llama file sets none of them; each is read from the GGUF keys llama.cpp reads.
struct ArchFeatures {
  bool qkv_bias = false;         // qwen2: attn_{q,k,v}.bias added after the projections
  bool qk_norm = false;          // qwen3, gemma3: per-head RMSNorm of Q and K before RoPE
  bool post_norms = false;       // gemma2/3: RMSNorm of the attention and FFN outputs
  bool gelu_ffn = false;         // gemma: GeGLU (tanh GELU as ggml's CPU table) instead of SwiGLU
  bool fused_qkv = false;        // phi3: one attn_qkv matrix (split into views at load)
  bool fused_gate_up = false;    // phi3: ffn_up holds gate rows then up rows
  float embed_scale = 1.0f;      // gemma: embeddings times sqrtf(dim)
  // Attention logits: q.k * attn_scale, then cap * tanh(s / cap) where attn_softcap > 0.
  float attn_scale = 0.0f;       // 0: 1/sqrt(head_dim)
  bool attn_scale_on_q = false;  // gemma, phi3: Q is scaled before the dot product (llama.cpp's order)
  float attn_softcap = 0.0f;     // gemma2
  float final_softcap = 0.0f;    // gemma2 (gemma3 where the file says): on the output logits
  // Sliding-window attention: a local layer's token at position p sees positions (p - window, p].
  int64_t sliding_window = 0;    // 0: every layer global
  std::vector<bool> layer_is_local;  // [layer]; empty: none
  // RoPE: angle_i = freq_scale * p * base^(-2i/rope_dim) / factor_i, cos/sin times attn_factor.
  float rope_freq_scale = 1.0f;        // linear scaling (1 / rope.scaling.factor), global layers
  float rope_freq_base_local = 0.0f;   // local layers' base (gemma3); 0: rope_freq_base
  float rope_freq_scale_local = 1.0f;  // local layers are never scaled (gemma2/3)
  float rope_attn_factor = 1.0f;       // phi3 LongRoPE: rope.scaling.attn_factor
  int64_t rope_original_context = 0;   // phi3: long factors when the context exceeds this
};

// A Mixture-of-Experts FFN in place of the dense one (qwen3moe; Mixtral's experts in a llama
// file): num_experts SwiGLU FFNs of ModelConfig::ffn_dim each, and a router (ffn_gate_inp) whose
// softmax picks num_experts_used of them per token, their weights renormalized to sum to 1 (what
// llama.cpp does for both: qwen3moe's norm_topk_prob is always true, Mixtral's top-2 the same).
struct MoeConfig {
  int64_t num_experts = 0;       // expert_count; 0: a dense FFN
  int64_t num_experts_used = 0;  // expert_used_count (top-k)
};

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3"
  std::string name;          // general.name, or the file's stem
  int64_t dim = 0;           // d_model, the residual stream width
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads: MHA; 1: MQA; otherwise GQA
  int64_t head_dim = 0;      // attention.key_length (== value_length), else dim / heads
  int64_t ffn_dim = 0;       // the FFN's hidden width (of each expert, in an MoE model)
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // what the file claims; the engine may use less
  float norm_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  int64_t rope_dim = 0;      // rotated dims per head (== head_dim: partial RoPE is refused)
  bool rope_neox = false;    // false: rotate (x[2i], x[2i+1]); true: (x[i], x[i + d/2])
  bool tied_output = false;  // output projection shares token_embd.weight
  ArchFeatures arch;
  MoeConfig moe;

  bool is_moe() const { return moe.num_experts > 0; }
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  bool IsLocal(int64_t layer) const {
    return arch.sliding_window > 0 && !arch.layer_is_local.empty() &&
           arch.layer_is_local[static_cast<size_t>(layer)];
  }
  // The scale of q.k (whichever side llama.cpp applies it on).
  float AttentionScale() const;
  // K and V of one token in one layer, at `kv_type` (f32/f16/bf16/q8_0/q4_0).
  int64_t KvBytesPerTokenPerLayer(DType kv_type) const;
  // The residual-stream checkpoint of one token in one layer (the layer's input, d_model wide).
  int64_t ResidualBytesPerTokenPerLayer(DType type) const;
};

// The architectures Model::Load accepts, for error messages: "llama, mistral, qwen2, ...".
const char* SupportedArchitectures();

// One layer's experts' matrices of one kind, stacked as llama.cpp stores them (GGUF dims {cols,
// rows, experts}): expert e's [rows][cols] matrix follows expert e - 1's, in the mapped file.
struct ExpertMatrices {
  DType type = DType::kF32;
  const void* data = nullptr;
  int64_t num_experts = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;

  MatrixView Expert(int64_t e) const {
    return MatrixView{type, static_cast<const uint8_t*>(data) + e * rows * row_bytes, rows, cols,
                      row_bytes};
  }
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  MatrixView wq;                     // [q_dim][dim]
  MatrixView wk;                     // [kv_dim][dim]
  MatrixView wv;                     // [kv_dim][dim]
  const float* q_bias = nullptr;     // [q_dim]  (qkv_bias)
  const float* k_bias = nullptr;     // [kv_dim]
  const float* v_bias = nullptr;     // [kv_dim]
  const float* q_norm = nullptr;     // [head_dim] (qk_norm)
  const float* k_norm = nullptr;     // [head_dim]
  MatrixView wo;                     // [dim][q_dim]
  const float* post_attn_norm = nullptr;  // [dim] (post_norms)
  const float* ffn_norm = nullptr;   // [dim]
  MatrixView w_gate;                 // [ffn_dim][dim]  (dense FFN; empty in an MoE model)
  MatrixView w_up;                   // [ffn_dim][dim]
  MatrixView w_down;                 // [dim][ffn_dim]
  MatrixView router;                 // [num_experts][dim] ffn_gate_inp (MoE)
  ExpertMatrices gate_exps;          // [num_experts][ffn_dim][dim]
  ExpertMatrices up_exps;            // [num_experts][ffn_dim][dim]
  ExpertMatrices down_exps;          // [num_experts][dim][ffn_dim]
  const float* post_ffn_norm = nullptr;   // [dim] (post_norms)
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
  // RoPE frequency factors, [rope_dim / 2] dividing each pair's angle, or null: Llama-3's
  // rope_freqs, or Phi-3's LongRoPE short / long sets (the long one for contexts past
  // rope_original_context).
  const float* rope_factors(int64_t context) const;

  int64_t num_parameters() const { return num_parameters_; }
  // The parameters one token runs through: all but the experts it does not pick (==
  // num_parameters() in a dense model). What a decode step reads, but for the embedding's row.
  int64_t num_active_parameters() const;
  int64_t weight_bytes() const { return weight_bytes_; }
  // "q8_0" when all layer matrices share a type, else "mixed (q4_k, q6_k)" (most used first).
  std::string weight_type_name() const;

 private:
  Model() = default;
  Status ReadConfig();
  Status ReadRopeScaling();
  Status ReadArchFeatures();
  Status ReadFfnConfig();
  Status BindWeights();

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  MatrixView token_embd_;
  const float* output_norm_ = nullptr;
  const float* rope_freqs_ = nullptr;
  const float* rope_short_ = nullptr;
  const float* rope_long_ = nullptr;
  MatrixView output_;
  std::vector<LayerWeights> layers_;
  int64_t num_parameters_ = 0;
  int64_t weight_bytes_ = 0;
  // Weights that cannot be read in place from the file: Q5_0 matrices rewritten as Q8_0
  // (quant::Q5_0ToQ8_0). The views above point into these buffers.
  std::vector<std::vector<uint8_t>> converted_weights_;
};

}  // namespace kvl
