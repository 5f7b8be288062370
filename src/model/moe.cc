#include "moe.h"

#include <fmt/format.h>

namespace kvl {
namespace {

// The most experts llama.cpp takes (LLAMA_MAX_EXPERTS); a count past it is a damaged file.
constexpr int64_t kMaxExperts = 1024;

// {arch}.expert_used_count: one number, or one per layer (llama.cpp's get_key_or_arr), which
// must then be the same for every layer.
StatusOr<int64_t> ReadExpertsUsed(const GgufFile& f, const std::string& key, int64_t num_layers) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return DataLossError(fmt::format("required metadata '{}' is missing", key));
  if (v->type != GgufValueType::kArray) return f.GetInt(key);
  if (v->array_count != static_cast<uint64_t>(num_layers) || num_layers == 0) {
    return DataLossError(fmt::format("metadata '{}' has {} entries for {} layers", key,
                                     v->array_count, num_layers));
  }
  const int64_t first = v->ArrayInt(0);
  for (int64_t l = 1; l < num_layers; ++l) {
    if (v->ArrayInt(static_cast<uint64_t>(l)) != first) {
      return UnimplementedError(fmt::format(
          "metadata '{}' routes a different number of experts per layer (layer 0: {}, layer {}: "
          "{}); kvlattice runs the same top-k on every layer",
          key, first, l, v->ArrayInt(static_cast<uint64_t>(l))));
    }
  }
  return first;
}

}  // namespace

bool ArchitectureHasExperts(const GgufFile& f, const std::string& architecture) {
  if (architecture == "qwen3moe") return true;
  StatusOr<int64_t> count = f.GetInt(architecture + ".expert_count");
  return count.ok() && *count > 0;
}

Status ReadMoeConfig(const GgufFile& f, ModelConfig& c) {
  const std::string p = c.architecture + ".";
  const bool qwen3moe = c.architecture == "qwen3moe";
  if (!qwen3moe && c.architecture != "llama" && c.architecture != "mistral") {
    return UnimplementedError(fmt::format(
        "architecture '{}' with experts ({}expert_count = {}) is not supported: kvlattice runs "
        "Mixture-of-Experts for qwen3moe and for llama files with experts (Mixtral)",
        c.architecture, p, *f.GetInt(p + "expert_count")));
  }
  StatusOr<int64_t> count = f.GetInt(p + "expert_count");
  if (!count.ok()) {
    return DataLossError(fmt::format("required metadata '{}expert_count': {}", p,
                                     count.status().message()));
  }
  KVL_ASSIGN_OR_RETURN(const int64_t used, ReadExpertsUsed(f, p + "expert_used_count", c.num_layers));
  if (*count <= 0 || *count > kMaxExperts) {
    return DataLossError(fmt::format("metadata '{}expert_count' = {} is out of range 1..{}", p,
                                     *count, kMaxExperts));
  }
  if (used <= 0 || used > *count) {
    return DataLossError(fmt::format("metadata '{}expert_used_count' = {} is out of range 1..{} "
                                     "(expert_count)", p, used, *count));
  }
  // Grouped routing (DeepSeek-V3) and shared experts (Qwen2-MoE) change the FFN; llama.cpp reads
  // neither for these architectures, so a file that sets them was not made for them.
  for (const char* key : {"expert_group_count", "expert_shared_count"}) {
    StatusOr<int64_t> v = f.GetInt(p + key);
    if (v.ok() && *v > 0) {
      return UnimplementedError(fmt::format("metadata '{}{}' = {}: grouped routing and shared "
                                            "experts are not supported", p, key, *v));
    }
  }
  c.moe.num_experts = *count;
  c.moe.num_experts_used = used;
  StatusOr<int64_t> ffn = f.GetInt(p + "feed_forward_length");
  if (qwen3moe) {
    StatusOr<int64_t> expert_ffn = f.GetInt(p + "expert_feed_forward_length");
    if (expert_ffn.ok()) {
      c.ffn_dim = *expert_ffn;
    } else if (ffn.ok()) {
      c.ffn_dim = *ffn / used;
    } else {
      return DataLossError(fmt::format("required metadata '{}expert_feed_forward_length' (or "
                                       "feed_forward_length) is missing", p));
    }
  } else {
    if (!ffn.ok()) {
      return DataLossError(fmt::format("required metadata '{}feed_forward_length': {}", p,
                                       ffn.status().message()));
    }
    c.ffn_dim = *ffn;
  }
  if (c.ffn_dim <= 0 || c.ffn_dim > (int64_t{1} << 32)) {
    return DataLossError(fmt::format("the experts' feed-forward length {} is out of range", c.ffn_dim));
  }
  return Status::Ok();
}

Status BindMoeFfn(WeightBinder& binder, const ModelConfig& c, int64_t layer, LayerWeights& w) {
  const std::string b = fmt::format("blk.{}.", layer);
  const int64_t e = c.moe.num_experts;
  KVL_RETURN_IF_ERROR(binder.Matrix(b + "ffn_gate_inp.weight", e, c.dim, &w.router));
  KVL_RETURN_IF_ERROR(binder.Experts(b + "ffn_gate_exps.weight", e, c.ffn_dim, c.dim, &w.gate_exps));
  KVL_RETURN_IF_ERROR(binder.Experts(b + "ffn_up_exps.weight", e, c.ffn_dim, c.dim, &w.up_exps));
  return binder.Experts(b + "ffn_down_exps.weight", e, c.dim, c.ffn_dim, &w.down_exps);
}

}  // namespace kvl
