// Loading a llama-family model (llama, TinyLlama, SmolLM, Mistral-shaped files) from GGUF.
#include "kvl/model.h"

#include <fmt/format.h>

#include <filesystem>
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace kvl {
namespace {

// Architectures that share llama's tensor layout and forward pass.
bool IsLlamaFamily(const std::string& arch) { return arch == "llama" || arch == "mistral"; }

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

}  // namespace

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
  if (!IsLlamaFamily(c.architecture)) {
    return UnimplementedError(
        fmt::format("architecture '{}' is not supported (supported: llama, mistral)", *arch));
  }
  StatusOr<std::string> name = f.GetString("general.name");
  c.name = name.ok() ? *name : std::filesystem::path(f.path()).stem().string();

  const std::string p = c.architecture + ".";
  KVL_ASSIGN_OR_RETURN(c.dim, RequirePositive(f, p + "embedding_length"));
  KVL_ASSIGN_OR_RETURN(c.num_layers, RequirePositive(f, p + "block_count"));
  KVL_ASSIGN_OR_RETURN(c.num_heads, RequirePositive(f, p + "attention.head_count"));
  KVL_ASSIGN_OR_RETURN(c.ffn_dim, RequirePositive(f, p + "feed_forward_length"));
  c.num_kv_heads = OptionalInt(f, p + "attention.head_count_kv", c.num_heads);
  c.context_length = OptionalInt(f, p + "context_length", 2048);
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return DataLossError(fmt::format(
        "metadata '{}attention.head_count_kv' = {} does not divide head_count = {}", p,
        c.num_kv_heads, c.num_heads));
  }
  if (c.dim % c.num_heads != 0) {
    return DataLossError(fmt::format("embedding_length {} is not a multiple of head_count {}",
                                     c.dim, c.num_heads));
  }
  c.head_dim = c.dim / c.num_heads;
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
  c.rope_neox = false;  // llama.cpp's converter permutes Q/K so that llama uses normal RoPE.
  return Status::Ok();
}

Status Model::BindWeights() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;

  // A matrix of `rows` outputs by `cols` inputs: GGUF dims {cols, rows}.
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols,
                    MatrixView* out) -> Status {
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr) return DataLossError(fmt::format("missing tensor '{}'", name));
    if (t->dims.size() != 2 || t->dims[0] != cols || t->dims[1] != rows) {
      return DataLossError(fmt::format("tensor '{}' has shape [{}], expected [{}, {}] from metadata",
                                       name, fmt::join(t->dims, ", "), cols, rows));
    }
    if (!Traits(t->type).supported) {
      return UnimplementedError(fmt::format("tensor '{}' has type {}, which kvlattice cannot run yet "
                                            "(supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k)",
                                            name, DTypeName(t->type)));
    }
    *out = MatrixView{t->type, t->data, rows, cols, RowBytes(t->type, cols)};
    num_parameters_ += t->num_elements;
    weight_bytes_ += t->num_bytes;
    return Status::Ok();
  };
  auto vector = [&](const std::string& name, int64_t n, const float** out) -> Status {
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr) return DataLossError(fmt::format("missing tensor '{}'", name));
    if (t->dims.size() != 1 || t->dims[0] != n) {
      return DataLossError(fmt::format("tensor '{}' has shape [{}], expected [{}] from metadata",
                                       name, fmt::join(t->dims, ", "), n));
    }
    if (t->type != DType::kF32) {
      return UnimplementedError(
          fmt::format("norm tensor '{}' has type {}; only f32 norms are supported", name,
                      DTypeName(t->type)));
    }
    if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
      return DataLossError(fmt::format("tensor '{}' data is not 4-byte aligned", name));
    }
    *out = reinterpret_cast<const float*>(t->data);
    num_parameters_ += t->num_elements;
    weight_bytes_ += t->num_bytes;
    return Status::Ok();
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
  if (f.FindTensor("output.weight") != nullptr) {
    KVL_RETURN_IF_ERROR(matrix("output.weight", c.vocab_size, c.dim, &output_));
  } else {
    c.tied_output = true;
    output_ = token_embd_;
  }

  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[static_cast<size_t>(l)];
    const std::string b = fmt::format("blk.{}.", l);
    KVL_RETURN_IF_ERROR(vector(b + "attn_norm.weight", c.dim, &w.attn_norm));
    KVL_RETURN_IF_ERROR(matrix(b + "attn_q.weight", c.q_dim(), c.dim, &w.wq));
    KVL_RETURN_IF_ERROR(matrix(b + "attn_k.weight", c.kv_dim(), c.dim, &w.wk));
    KVL_RETURN_IF_ERROR(matrix(b + "attn_v.weight", c.kv_dim(), c.dim, &w.wv));
    KVL_RETURN_IF_ERROR(matrix(b + "attn_output.weight", c.dim, c.q_dim(), &w.wo));
    KVL_RETURN_IF_ERROR(vector(b + "ffn_norm.weight", c.dim, &w.ffn_norm));
    KVL_RETURN_IF_ERROR(matrix(b + "ffn_gate.weight", c.ffn_dim, c.dim, &w.w_gate));
    KVL_RETURN_IF_ERROR(matrix(b + "ffn_up.weight", c.ffn_dim, c.dim, &w.w_up));
    KVL_RETURN_IF_ERROR(matrix(b + "ffn_down.weight", c.dim, c.ffn_dim, &w.w_down));
  }
  return Status::Ok();
}

std::string Model::weight_type_name() const {
  std::map<DType, int> counts;
  for (const LayerWeights& w : layers_) {
    for (const MatrixView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      ++counts[m->type];
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
