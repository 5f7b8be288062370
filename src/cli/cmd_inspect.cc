// kvl inspect: what a model is, what it weighs, and what its KV cache and residual checkpoints
// cost per token: the numbers the KV policy's cost model starts from.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "cli.h"
#include "kvl/model.h"

namespace kvl::cli {

namespace {

// What the architecture adds to llama's block, in words (kvl inspect's "features" line).
std::vector<std::string> ArchFeatureNames(const ModelConfig& c) {
  const ArchFeatures& a = c.arch;
  std::vector<std::string> out;
  if (a.qkv_bias) out.push_back("QKV biases");
  if (a.qk_norm) out.push_back("per-head Q/K RMSNorm");
  if (a.post_norms) out.push_back("post-attention/FFN norms");
  if (a.gelu_ffn) out.push_back("GeGLU (tanh GELU)");
  if (a.fused_qkv) out.push_back("fused QKV and gate-up");
  if (a.embed_scale != 1.0f) out.push_back(fmt::format("embeddings x {:.4g}", a.embed_scale));
  if (a.attn_softcap > 0.0f) out.push_back(fmt::format("attention soft-cap {:g}", a.attn_softcap));
  if (a.final_softcap > 0.0f) out.push_back(fmt::format("logit soft-cap {:g}", a.final_softcap));
  if (a.sliding_window > 0) {
    int64_t local = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) local += c.IsLocal(l) ? 1 : 0;
    out.push_back(fmt::format("sliding window {} on {} of {} layers (local RoPE base {:g})",
                              a.sliding_window, local, c.num_layers,
                              a.rope_freq_base_local > 0.0f ? a.rope_freq_base_local : c.rope_freq_base));
  }
  if (a.rope_freq_scale != 1.0f) out.push_back(fmt::format("linear RoPE scaling x{:g}", 1.0f / a.rope_freq_scale));
  if (a.rope_attn_factor != 1.0f) {
    out.push_back(fmt::format("LongRoPE (original context {}, attention factor {:.4g})",
                              a.rope_original_context, a.rope_attn_factor));
  }
  return out;
}

}  // namespace

int InspectCommand(const InspectArgs& args) {
  StatusOr<std::unique_ptr<Model>> loaded = Model::Load(args.model_path);
  if (!loaded.ok()) {
    fmt::print(stderr, "kvl: {}\n", loaded.status().ToString());
    return 1;
  }
  const Model& model = **loaded;
  const ModelConfig& c = model.config();
  const GgufFile& f = model.file();

  struct TypeTotal {
    int64_t tensors = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, TypeTotal> by_type;
  for (const GgufTensorInfo& t : f.tensors()) {
    TypeTotal& total = by_type[std::string(DTypeName(t.type))];
    ++total.tensors;
    total.bytes += t.num_bytes;
  }
  const DType kv_types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};
  const DType residual_types[] = {DType::kF32, DType::kF16, DType::kBF16};

  nlohmann::json j;
  j["file"] = args.model_path;
  j["gguf_version"] = f.version();
  j["architecture"] = c.architecture;
  j["name"] = c.name;
  j["parameters"] = model.num_parameters();
  j["weight_bytes"] = model.weight_bytes();
  j["weight_type"] = model.weight_type_name();
  j["dim"] = c.dim;
  j["layers"] = c.num_layers;
  j["heads"] = c.num_heads;
  j["kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["ffn_dim"] = c.ffn_dim;
  if (c.is_moe()) {
    j["experts"] = c.moe.num_experts;
    j["experts_used"] = c.moe.num_experts_used;
    j["active_parameters"] = model.num_active_parameters();
  }
  j["vocab"] = c.vocab_size;
  j["context_length"] = c.context_length;
  j["rope_freq_base"] = c.rope_freq_base;
  j["rms_eps"] = c.norm_eps;
  j["tied_output"] = c.tied_output;
  j["architecture"] = c.architecture;
  j["features"] = ArchFeatureNames(c);
  int64_t local_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) local_layers += c.IsLocal(l) ? 1 : 0;
  j["sliding_window"] = c.arch.sliding_window;
  j["local_layers"] = local_layers;
  for (const auto& [type, total] : by_type) {
    j["tensor_types"][type] = {{"tensors", total.tensors}, {"bytes", total.bytes}};
  }
  for (DType t : kv_types) {
    const int64_t per_layer = c.KvBytesPerTokenPerLayer(t);
    j["kv_bytes_per_token"][std::string(DTypeName(t))] = {
        {"per_layer", per_layer}, {"total", per_layer * c.num_layers}};
    if (local_layers > 0) {
      // Sliding-window release (kvl/kv_window_release.h): the pool keeps the global layers per
      // token, each sequence its local layers' last window.
      j["kv_bytes_per_token"][std::string(DTypeName(t))]["pooled"] =
          per_layer * (c.num_layers - local_layers);
      j["kv_bytes_per_token"][std::string(DTypeName(t))]["window_per_sequence"] =
          per_layer * local_layers * (c.arch.sliding_window - 1);
    }
  }
  for (DType t : residual_types) {
    const int64_t per_layer = c.ResidualBytesPerTokenPerLayer(t);
    j["residual_bytes_per_token"][std::string(DTypeName(t))] = {
        {"per_layer", per_layer}, {"total", per_layer * c.num_layers}};
  }
  if (args.json) {
    fmt::print("{}\n", j.dump(2));
    return 0;
  }

  const char* attention = c.num_kv_heads == c.num_heads ? "MHA"
                          : c.num_kv_heads == 1         ? "MQA"
                                                        : "GQA";
  fmt::print("file          {} (GGUF v{}, {})\n", args.model_path, f.version(),
             FormatBytes(static_cast<int64_t>(f.file_size())));
  fmt::print("model         {} ({})\n", c.name, c.architecture);
  fmt::print("parameters    {} ({} in weights, {})\n", FormatParams(model.num_parameters()),
             FormatBytes(model.weight_bytes()), model.weight_type_name());
  fmt::print("shape         dim {}, {} layers, {} heads, {} kv heads ({}, group {}), head_dim {}, "
             "ffn {}, vocab {}\n",
             c.dim, c.num_layers, c.num_heads, c.num_kv_heads, attention,
             c.num_heads / c.num_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size);
  fmt::print("context       {} tokens; RoPE {} base {}; RMSNorm eps {}; output {}\n",
             c.context_length, c.rope_neox ? "neox" : "normal", c.rope_freq_base, c.norm_eps,
             c.tied_output ? "tied to token_embd" : "separate");
  if (c.is_moe()) {
    fmt::print("experts       {} of {} per token, each ffn {}; {} parameters active\n",
               c.moe.num_experts_used, c.moe.num_experts, c.ffn_dim,
               FormatParams(model.num_active_parameters()));
  }
  const std::vector<std::string> features = ArchFeatureNames(c);
  if (!features.empty()) fmt::print("features      {}\n", fmt::join(features, ", "));
  fmt::print("\ntensor types\n");
  for (const auto& [type, total] : by_type) {
    fmt::print("  {:<6} {:5} tensors {:>12}\n", type, total.tensors, FormatBytes(total.bytes));
  }
  fmt::print("\nKV cache per token (K+V)     per layer        all layers\n");
  for (DType t : kv_types) {
    const int64_t per_layer = c.KvBytesPerTokenPerLayer(t);
    fmt::print("  {:<6}               {:>10} B  {:>14} B\n", DTypeName(t), per_layer,
               per_layer * c.num_layers);
  }
  if (local_layers > 0) {
    fmt::print("\nsliding-window release: the pool keeps the {} global of {} layers per token; each "
               "sequence keeps its {} local layers' last window ({} rows) plus one forward run's "
               "rows (-b)\n",
               c.num_layers - local_layers, c.num_layers, local_layers, c.arch.sliding_window - 1);
    fmt::print("  type    pooled per token   window per sequence\n");
    for (DType t : kv_types) {
      const int64_t per_layer = c.KvBytesPerTokenPerLayer(t);
      fmt::print("  {:<6} {:>15} B {:>19} B\n", DTypeName(t),
                 per_layer * (c.num_layers - local_layers),
                 per_layer * local_layers * (c.arch.sliding_window - 1));
    }
  }
  fmt::print("\nresidual checkpoint per token per layer        all layers\n");
  for (DType t : residual_types) {
    const int64_t per_layer = c.ResidualBytesPerTokenPerLayer(t);
    fmt::print("  {:<6}               {:>10} B  {:>14} B\n", DTypeName(t), per_layer,
               per_layer * c.num_layers);
  }
  const double ratio = static_cast<double>(c.dim) / static_cast<double>(2 * c.kv_dim());
  fmt::print("\nresidual / KV bytes at the same dtype: {:.2f} ({})\n", ratio,
             ratio > 1.0 ? "residual checkpoints are larger than K+V: recompute from them costs "
                           "more memory than keeping KV"
                         : "residual checkpoints are no larger than K+V");
  if (args.show_tensors) {
    fmt::print("\n{:<32} {:<6} {:<24} {:>12}\n", "tensor", "type", "dims", "bytes");
    for (const GgufTensorInfo& t : f.tensors()) {
      fmt::print("{:<32} {:<6} {:<24} {:>12}\n", t.name, DTypeName(t.type),
                 fmt::format("[{}]", fmt::join(t.dims, ", ")), t.num_bytes);
    }
  }
  return 0;
}

}  // namespace kvl::cli
