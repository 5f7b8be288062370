// Loading a model from GGUF: its config from the metadata of the architectures below (llama,
// mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3) and typed views of its weights into the
// mmap. The Mixture-of-Experts FFN's keys and tensors are read in moe.cc.
#include "kvl/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "moe.h"
#include "weight_binder.h"

namespace kvl {
namespace {

constexpr const char* kSupportedArchitectures =
    "llama, mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3";

// The attention kernels' widest head (ops::kMaxAttentionHeadDim; the model layer does not see ops).
constexpr int64_t kMaxHeadDim = 256;

bool IsSupportedArchitecture(const std::string& arch) {
  for (const char* a :
       {"llama", "mistral", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3"}) {
    if (arch == a) return true;
  }
  return false;
}

// Reads a positive integer key, naming the key when it is missing or out of range.
StatusOr<int64_t> RequirePositive(const GgufFile& f, const std::string& key) {
  StatusOr<int64_t> v = f.GetInt(key);
  if (!v.ok()) {
    return Status(v.status().code(),
                  fmt::format("required metadata '{}': {}", key, v.status().message()));
  }
  if (*v <= 0 || *v > (int64_t{1} << 32)) {
    return DataLossError(fmt::format("metadata '{}' = {} is out of range", key, *v));
  }
  return *v;
}

int64_t OptionalInt(const GgufFile& f, const std::string& key, int64_t fallback) {
  StatusOr<int64_t> v = f.GetInt(key);
  return v.ok() ? *v : fallback;
}

float OptionalFloat(const GgufFile& f, const std::string& key, float fallback) {
  StatusOr<float> v = f.GetFloat(key);
  return v.ok() ? *v : fallback;
}

// Which layers are local (sliding-window): `sliding_window_pattern` as a bool array per layer,
// or as n (every n-th layer global: layers with l % n < n - 1 are local), else the architecture's
// own default n, as llama.cpp reads it.
Status ReadLocalLayers(const GgufFile& f, const std::string& key, int64_t default_pattern,
                       ModelConfig& c) {
  std::vector<bool>& local = c.arch.layer_is_local;
  local.assign(static_cast<size_t>(c.num_layers), false);
  if (const GgufValue* v = f.Find(key); v != nullptr && v->type == GgufValueType::kArray) {
    if (v->array_count != static_cast<uint64_t>(c.num_layers)) {
      return DataLossError(fmt::format("metadata '{}' has {} entries for {} layers", key,
                                       v->array_count, c.num_layers));
    }
    for (int64_t l = 0; l < c.num_layers; ++l) local[static_cast<size_t>(l)] = v->ArrayInt(l) != 0;
    return Status::Ok();
  }
  const int64_t n = OptionalInt(f, key, default_pattern);
  if (n < 0) return DataLossError(fmt::format("metadata '{}' = {} is negative", key, n));
  for (int64_t l = 0; l < c.num_layers; ++l) local[static_cast<size_t>(l)] = n == 0 || l % n < n - 1;
  return Status::Ok();
}

}  // namespace

const char* SupportedArchitectures() { return kSupportedArchitectures; }

float ModelConfig::AttentionScale() const {
  return arch.attn_scale > 0.0f ? arch.attn_scale
                                : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

int64_t ModelConfig::KvBytesPerTokenPerLayer(DType kv_type) const {
  return 2 * RowBytes(kv_type, kv_dim());
}

int64_t ModelConfig::ResidualBytesPerTokenPerLayer(DType type) const {
  return RowBytes(type, dim);
}

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  StatusOr<std::unique_ptr<Model>> model = FromGguf(std::move(file));
  if (!model.ok()) {
    return Status(model.status().code(), fmt::format("{}: {}", path, model.status().message()));
  }
  return model;
}

StatusOr<std::unique_ptr<Model>> Model::FromGguf(std::unique_ptr<GgufFile> file) {
  std::unique_ptr<Model> model(new Model());
  model->file_ = std::move(file);
  KVL_RETURN_IF_ERROR(model->ReadConfig());
  KVL_RETURN_IF_ERROR(model->BindWeights());
  return model;
}

Status Model::ReadConfig() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  StatusOr<std::string> arch = f.GetString("general.architecture");
  if (!arch.ok()) {
    return DataLossError("required metadata 'general.architecture': " + arch.status().message());
  }
  c.architecture = *arch;
  if (!IsSupportedArchitecture(c.architecture)) {
    return UnimplementedError(fmt::format("architecture '{}' is not supported (supported: {})",
                                          *arch, kSupportedArchitectures));
  }
  StatusOr<std::string> name = f.GetString("general.name");
  c.name = name.ok() ? *name : std::filesystem::path(f.path()).stem().string();

  const std::string p = c.architecture + ".";
  KVL_ASSIGN_OR_RETURN(c.dim, RequirePositive(f, p + "embedding_length"));
  KVL_ASSIGN_OR_RETURN(c.num_layers, RequirePositive(f, p + "block_count"));
  KVL_ASSIGN_OR_RETURN(c.num_heads, RequirePositive(f, p + "attention.head_count"));
  c.num_kv_heads = OptionalInt(f, p + "attention.head_count_kv", c.num_heads);
  c.context_length = OptionalInt(f, p + "context_length", 2048);
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return DataLossError(fmt::format(
        "metadata '{}attention.head_count_kv' = {} does not divide head_count = {}", p,
        c.num_kv_heads, c.num_heads));
  }
  // head_dim is dim / heads unless the file says otherwise (Mistral-Nemo: 128, not 5120 / 32).
  const bool has_key_length = f.GetInt(p + "attention.key_length").ok();
  if (!has_key_length && c.dim % c.num_heads != 0) {
    return DataLossError(fmt::format("embedding_length {} is not a multiple of head_count {}",
                                     c.dim, c.num_heads));
  }
  c.head_dim = has_key_length ? *f.GetInt(p + "attention.key_length") : c.dim / c.num_heads;
  const int64_t value_dim = OptionalInt(f, p + "attention.value_length", c.head_dim);
  if (c.head_dim <= 0 || c.head_dim > kMaxHeadDim) {
    return DataLossError(fmt::format("head_dim {} ({}attention.key_length) is out of range 1..{}",
                                     c.head_dim, p, kMaxHeadDim));
  }
  if (value_dim != c.head_dim) {
    return UnimplementedError(fmt::format(
        "{}attention.value_length = {} differs from key_length = {} (supported: equal)", p,
        value_dim, c.head_dim));
  }
  c.rope_dim = OptionalInt(f, p + "rope.dimension_count", c.head_dim);
  if (c.rope_dim != c.head_dim) {
    return UnimplementedError(fmt::format("partial RoPE ({}rope.dimension_count = {} of head_dim {})",
                                          p, c.rope_dim, c.head_dim));
  }
  if (c.head_dim % 2 != 0) {
    return DataLossError(fmt::format("head_dim {} is odd; RoPE needs pairs", c.head_dim));
  }
  StatusOr<float> eps = f.GetFloat(p + "attention.layer_norm_rms_epsilon");
  if (eps.ok()) c.norm_eps = *eps;
  StatusOr<float> base = f.GetFloat(p + "rope.freq_base");
  if (base.ok()) c.rope_freq_base = *base;
  if (!(c.norm_eps > 0.0f) || !(c.rope_freq_base > 0.0f)) {
    return DataLossError("metadata rms epsilon and rope.freq_base must be positive");
  }
  KVL_RETURN_IF_ERROR(ReadRopeScaling());
  KVL_RETURN_IF_ERROR(ReadFfnConfig());
  return ReadArchFeatures();
}

// The dense FFN's width, or the experts' (moe.cc).
Status Model::ReadFfnConfig() {
  if (ArchitectureHasExperts(*file_, config_.architecture)) return ReadMoeConfig(*file_, config_);
  KVL_ASSIGN_OR_RETURN(config_.ffn_dim,
                       RequirePositive(*file_, config_.architecture + ".feed_forward_length"));
  return Status::Ok();
}

// rope.scaling.*: none or linear (a factor dividing every angle); LongRoPE's attention factor.
Status Model::ReadRopeScaling() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  const std::string p = c.architecture + ".";
  StatusOr<std::string> scaling = f.GetString(p + "rope.scaling.type");
  const std::string type = scaling.ok() ? *scaling : "linear";
  if (type != "linear" && type != "none") {
    return UnimplementedError(fmt::format("{}rope.scaling.type '{}' is not supported (supported: "
                                          "none, linear; Llama-3 and LongRoPE factors as tensors)",
                                          p, type));
  }
  float factor = OptionalFloat(f, p + "rope.scaling.factor", 0.0f);
  if (factor == 0.0f) factor = OptionalFloat(f, p + "rope.scale_linear", 0.0f);
  if (factor < 0.0f || !std::isfinite(factor)) {
    return DataLossError(fmt::format("metadata '{}rope.scaling.factor' = {} is invalid", p, factor));
  }
  c.arch.rope_freq_scale = (type == "none" || factor == 0.0f) ? 1.0f : 1.0f / factor;
  c.arch.rope_attn_factor = OptionalFloat(f, p + "rope.scaling.attn_factor", 1.0f);
  c.arch.rope_original_context =
      OptionalInt(f, p + "rope.scaling.original_context_length", c.context_length);
  if (!(c.arch.rope_attn_factor > 0.0f)) {
    return DataLossError(fmt::format("metadata '{}rope.scaling.attn_factor' must be positive", p));
  }
  return Status::Ok();
}

// What each architecture changes in llama's block, from the keys llama.cpp reads for it.
Status Model::ReadArchFeatures() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  ArchFeatures& a = c.arch;
  const std::string p = c.architecture + ".";
  const std::string& arch = c.architecture;
  // llama.cpp's converter permutes llama's Q/K so that it uses normal RoPE; the others are NEOX.
  c.rope_neox = arch != "llama" && arch != "mistral";
  a.qkv_bias = arch == "qwen2";
  a.qk_norm = arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3";
  a.fused_qkv = a.fused_gate_up = arch == "phi3";
  if (arch == "phi3") a.attn_scale_on_q = true;
  if (arch == "gemma2" || arch == "gemma3") {
    a.post_norms = true;
    a.gelu_ffn = true;
    a.attn_scale_on_q = true;
    a.embed_scale = std::sqrt(static_cast<float>(c.dim));
    // Gemma's 27B models scale by 1/sqrt(dim / heads), the others by 1/sqrt(head_dim); llama.cpp
    // tells them apart by their layer count.
    const bool is_27b = (arch == "gemma2" && c.num_layers == 46) ||
                        (arch == "gemma3" && c.num_layers == 62);
    a.attn_scale = 1.0f / std::sqrt(static_cast<float>(is_27b ? c.dim / c.num_heads : c.head_dim));
    a.final_softcap = OptionalFloat(f, p + "final_logit_softcapping", arch == "gemma2" ? 30.0f : 0.0f);
    if (arch == "gemma2") {
      a.attn_softcap = OptionalFloat(f, p + "attn_logit_softcapping", 50.0f);
      a.sliding_window = OptionalInt(f, p + "attention.sliding_window", 4096);
      a.rope_freq_base_local = OptionalFloat(f, p + "rope.freq_base_swa", c.rope_freq_base);
      a.rope_freq_scale_local = a.rope_freq_scale;
      KVL_RETURN_IF_ERROR(ReadLocalLayers(f, p + "attention.sliding_window_pattern", 2, c));
    } else {
      a.sliding_window = OptionalInt(f, p + "attention.sliding_window", 0);
      a.rope_freq_base_local = OptionalFloat(f, p + "rope.freq_base_swa", 10000.0f);
      a.rope_freq_scale_local = 1.0f;
      if (a.sliding_window > 0) {
        KVL_RETURN_IF_ERROR(ReadLocalLayers(f, p + "attention.sliding_window_pattern", 6, c));
      }
    }
    if (a.sliding_window < 0 || a.attn_softcap < 0.0f || a.final_softcap < 0.0f ||
        !(a.rope_freq_base_local > 0.0f)) {
      return DataLossError(fmt::format("metadata of {}'s sliding window, soft-caps or local RoPE "
                                       "base is out of range", arch));
    }
  }
  // phi3's sliding_window key is ignored, as llama.cpp ignores it (every layer is global).
  return Status::Ok();
}

Status Model::BindWeights() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  // Every tensor the forward pass reads is bound; any other is refused below.
  WeightBinder binder(f, &converted_weights_);
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, MatrixView* out) {
    return binder.Matrix(name, rows, cols, out);
  };
  auto vector = [&](const std::string& name, int64_t n, const float** out) {
    return binder.Vector(name, n, out);
  };
  // The rows [first, first + n) of a fused matrix, as a matrix of their own.
  auto rows_of = [](const MatrixView& m, int64_t first, int64_t n) {
    return MatrixView{m.type, static_cast<const uint8_t*>(m.data) + first * m.row_bytes, n, m.cols,
                      m.row_bytes};
  };

  // The vocabulary size comes from the embedding; the tokenizer must agree (checked there).
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return DataLossError("missing tensor 'token_embd.weight'");
  if (embd->dims.size() != 2) {
    return DataLossError(fmt::format("tensor 'token_embd.weight' has {} dims, expected 2",
                                     embd->dims.size()));
  }
  c.vocab_size = embd->dims[1];
  KVL_RETURN_IF_ERROR(matrix("token_embd.weight", c.vocab_size, c.dim, &token_embd_));
  KVL_RETURN_IF_ERROR(vector("output_norm.weight", c.dim, &output_norm_));
  // Gemma-2 always ties its output (llama.cpp reads no output.weight for it and refuses a file
  // that has one); any other architecture may carry its own.
  if (c.architecture != "gemma2" && f.FindTensor("output.weight") != nullptr) {
    KVL_RETURN_IF_ERROR(matrix("output.weight", c.vocab_size, c.dim, &output_));
  } else {
    c.tied_output = true;
    output_ = token_embd_;
  }
  // RoPE frequency factors: Llama-3's one set, or Phi-3's short and long sets (both or neither).
  const int64_t half = c.rope_dim / 2;
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    KVL_RETURN_IF_ERROR(vector("rope_freqs.weight", half, &rope_freqs_));
  }
  if (f.FindTensor("rope_factors_long.weight") != nullptr ||
      f.FindTensor("rope_factors_short.weight") != nullptr) {
    KVL_RETURN_IF_ERROR(vector("rope_factors_long.weight", half, &rope_long_));
    KVL_RETURN_IF_ERROR(vector("rope_factors_short.weight", half, &rope_short_));
  }

  const ArchFeatures& a = c.arch;
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[static_cast<size_t>(l)];
    const std::string b = fmt::format("blk.{}.", l);
    KVL_RETURN_IF_ERROR(vector(b + "attn_norm.weight", c.dim, &w.attn_norm));
    if (a.fused_qkv) {
      MatrixView qkv;
      KVL_RETURN_IF_ERROR(matrix(b + "attn_qkv.weight", c.q_dim() + 2 * c.kv_dim(), c.dim, &qkv));
      w.wq = rows_of(qkv, 0, c.q_dim());
      w.wk = rows_of(qkv, c.q_dim(), c.kv_dim());
      w.wv = rows_of(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
    } else {
      KVL_RETURN_IF_ERROR(matrix(b + "attn_q.weight", c.q_dim(), c.dim, &w.wq));
      KVL_RETURN_IF_ERROR(matrix(b + "attn_k.weight", c.kv_dim(), c.dim, &w.wk));
      KVL_RETURN_IF_ERROR(matrix(b + "attn_v.weight", c.kv_dim(), c.dim, &w.wv));
    }
    if (a.qkv_bias) {
      KVL_RETURN_IF_ERROR(vector(b + "attn_q.bias", c.q_dim(), &w.q_bias));
      KVL_RETURN_IF_ERROR(vector(b + "attn_k.bias", c.kv_dim(), &w.k_bias));
      KVL_RETURN_IF_ERROR(vector(b + "attn_v.bias", c.kv_dim(), &w.v_bias));
    }
    if (a.qk_norm) {
      KVL_RETURN_IF_ERROR(vector(b + "attn_q_norm.weight", c.head_dim, &w.q_norm));
      KVL_RETURN_IF_ERROR(vector(b + "attn_k_norm.weight", c.head_dim, &w.k_norm));
    }
    KVL_RETURN_IF_ERROR(matrix(b + "attn_output.weight", c.dim, c.q_dim(), &w.wo));
    KVL_RETURN_IF_ERROR(vector(b + "ffn_norm.weight", c.dim, &w.ffn_norm));
    if (a.post_norms) {
      KVL_RETURN_IF_ERROR(vector(b + "post_attention_norm.weight", c.dim, &w.post_attn_norm));
      KVL_RETURN_IF_ERROR(vector(b + "post_ffw_norm.weight", c.dim, &w.post_ffn_norm));
    }
    if (c.is_moe()) {
      KVL_RETURN_IF_ERROR(BindMoeFfn(binder, c, l, w));
    } else if (a.fused_gate_up) {
      MatrixView gate_up;
      KVL_RETURN_IF_ERROR(matrix(b + "ffn_up.weight", 2 * c.ffn_dim, c.dim, &gate_up));
      w.w_gate = rows_of(gate_up, 0, c.ffn_dim);  // ggml's swiglu: silu(first half) * second
      w.w_up = rows_of(gate_up, c.ffn_dim, c.ffn_dim);
    } else {
      KVL_RETURN_IF_ERROR(matrix(b + "ffn_gate.weight", c.ffn_dim, c.dim, &w.w_gate));
      KVL_RETURN_IF_ERROR(matrix(b + "ffn_up.weight", c.ffn_dim, c.dim, &w.w_up));
    }
    if (!c.is_moe()) {
      KVL_RETURN_IF_ERROR(matrix(b + "ffn_down.weight", c.dim, c.ffn_dim, &w.w_down));
    }
  }
  num_parameters_ = binder.num_parameters();
  weight_bytes_ = binder.weight_bytes();
  // A tensor this forward pass would not read (a bias, a norm of another architecture) would make
  // its output silently wrong: refuse the file instead, naming it.
  for (const GgufTensorInfo& t : f.tensors()) {
    if (!binder.IsBound(std::string(t.name))) {
      return UnimplementedError(fmt::format(
          "tensor '{}' is not supported in a '{}' model (supported architectures: {})", t.name,
          c.architecture, kSupportedArchitectures));
    }
  }
  return Status::Ok();
}

const float* Model::rope_factors(int64_t context) const {
  if (rope_freqs_ != nullptr) return rope_freqs_;
  return context > config_.arch.rope_original_context ? rope_long_ : rope_short_;
}

int64_t Model::num_active_parameters() const {
  const ModelConfig& c = config_;
  if (!c.is_moe()) return num_parameters_;
  // Per layer, the experts a token does not pick: 3 matrices of ffn_dim x dim each.
  const int64_t idle = c.moe.num_experts - c.moe.num_experts_used;
  return num_parameters_ - c.num_layers * idle * 3 * c.ffn_dim * c.dim;
}

std::string Model::weight_type_name() const {
  std::map<DType, int> counts;
  for (const LayerWeights& w : layers_) {
    for (const MatrixView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      if (m->data != nullptr) ++counts[m->type];
    }
    for (const ExpertMatrices* e : {&w.gate_exps, &w.up_exps, &w.down_exps}) {
      if (e->data != nullptr) ++counts[e->type];
    }
  }
  if (counts.size() == 1) return std::string(DTypeName(counts.begin()->first));
  // A mix (Q4_K_M holds Q4_K and Q6_K matrices): its types, the most used first.
  std::vector<std::pair<int, DType>> by_count;
  for (const auto& [type, n] : counts) by_count.emplace_back(-n, type);
  std::sort(by_count.begin(), by_count.end());
  std::string names;
  for (const auto& [n, type] : by_count) names += (names.empty() ? "" : ", ") + std::string(DTypeName(type));
  return "mixed (" + names + ")";
}

}  // namespace kvl
