// ValidateEngineOptions: ranges and contradictions of EngineOptions, checked before anything is
// loaded or allocated, so a user's number never reaches arithmetic that it could overflow.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvl/engine.h"
#include "spec_drafter.h"

namespace kvl {

Status ValidateEngineOptions(const EngineOptions& o) {
  if (o.batch_size < 1 || o.batch_size > kMaxContextTokens) {
    return InvalidArgumentError(fmt::format("batch size (-b) must be in [1, {}], got {}",
                                            kMaxContextTokens, o.batch_size));
  }
  if (o.num_threads < 0 || o.num_threads > kMaxThreads) {
    return InvalidArgumentError(fmt::format("threads (-t) must be in [0, {}] (0 = every core), got {}",
                                            kMaxThreads, o.num_threads));
  }
  if (o.context_length < 0 || o.context_length > kMaxContextTokens) {
    return InvalidArgumentError(
        fmt::format("context (-c) must be in [0, {}] tokens (0 = the model's), got {}",
                    kMaxContextTokens, o.context_length));
  }
  if (o.max_seqs < 1 || o.max_seqs > kMaxSeqs) {
    return InvalidArgumentError(fmt::format("parallel sequences (-np) must be in [1, {}], got {}",
                                            kMaxSeqs, o.max_seqs));
  }
  if (o.block_tokens < 1 || o.block_tokens > kMaxBlockTokens) {
    return InvalidArgumentError(fmt::format("block size must be in [1, {}] tokens, got {}",
                                            kMaxBlockTokens, o.block_tokens));
  }
  if (o.kv_budget_bytes < 0) {
    return InvalidArgumentError(
        fmt::format("--kv-budget must be positive (0 = the default), got {}", o.kv_budget_bytes));
  }
  if (o.kv_sink_tokens < 0 || o.kv_sink_tokens > kMaxContextTokens) {
    return InvalidArgumentError(fmt::format("--kv-sink must be in [0, {}] tokens, got {}",
                                            kMaxContextTokens, o.kv_sink_tokens));
  }
  if (o.kv_recent_tokens < 0 || o.kv_recent_tokens > kMaxContextTokens) {
    return InvalidArgumentError(fmt::format("--kv-recent must be in [0, {}] tokens, got {}",
                                            kMaxContextTokens, o.kv_recent_tokens));
  }
  if (!(o.kv_stream_reserve >= 0 && o.kv_stream_reserve < 1)) {
    return InvalidArgumentError(fmt::format(
        "--kv-stream-reserve must be a fraction of the KV budget in (0, 1), or 0 for auto, got {}",
        o.kv_stream_reserve));
  }
  if (!(o.kv_profile_drift == 0 || (o.kv_profile_drift > 1 && std::isfinite(o.kv_profile_drift)))) {
    return InvalidArgumentError(fmt::format(
        "--kv-profile-drift must be a factor above 1 (a correction past it either way has the "
        "profile measured again), or 0 for never, got {}",
        o.kv_profile_drift));
  }
  if (o.kv_checkpoint_every < 0 || o.kv_checkpoint_every > kMaxCheckpointEvery) {
    return InvalidArgumentError(fmt::format(
        "--kv-checkpoint-every must be auto or a layer stride in [1, {}], got {}",
        kMaxCheckpointEvery, o.kv_checkpoint_every));
  }
  if (!(o.watchdog_seconds >= 0 && o.watchdog_seconds <= 86400)) {
    return InvalidArgumentError(fmt::format(
        "--watchdog-seconds must be in [0, 86400] (0: no watchdog), got {}", o.watchdog_seconds));
  }
  KVL_RETURN_IF_ERROR(ParseSpecMode(o.spec).status());
  if (o.draft_max < 1 || o.draft_max > kMaxDraftTokens) {
    return InvalidArgumentError(fmt::format("--draft-max must be in [1, {}] tokens, got {}",
                                            kMaxDraftTokens, o.draft_max));
  }
  if (o.spec == "draft" && o.draft_model_path.empty()) {
    return InvalidArgumentError("--spec draft needs a draft model: -md DRAFT.gguf");
  }
  if (o.spec != "draft" && !o.draft_model_path.empty()) {
    return InvalidArgumentError(fmt::format(
        "-md {} drafts only with --spec draft (got --spec {})", o.draft_model_path, o.spec));
  }
  KVL_RETURN_IF_ERROR(ParseKvCacheType(o.cache_type_k).status());
  KVL_RETURN_IF_ERROR(ParseKvCacheType(o.cache_type_v).status());
  KVL_ASSIGN_OR_RETURN(const KvPolicyChoice policy, ParseKvPolicy(o.kv_policy));
  KVL_ASSIGN_OR_RETURN(const KvQuality quality, ParseKvQuality(o.kv_quality));
  if (!policy.automatic && !IsLossless(policy.fixed) && !o.kv_quality.empty() &&
      quality == KvQuality::kLossless) {
    return InvalidArgumentError(fmt::format(
        "--kv-policy {} is lossy but --kv-quality lossless asks for no loss: drop one of them",
        o.kv_policy));
  }
  KVL_RETURN_IF_ERROR(o.kv_quality_prices.Validate());
  std::vector<TierKind> kinds;
  for (const std::string& text : o.kv_tiers) {
    KVL_ASSIGN_OR_RETURN(const TierSpec spec, ParseTierSpec(text));
    if (std::find(kinds.begin(), kinds.end(), spec.kind) != kinds.end()) {
      return InvalidArgumentError(fmt::format(
          "--kv-tier {}: a {} tier is already given; there is at most one tier of each kind",
          text, TierKindName(spec.kind)));
    }
    kinds.push_back(spec.kind);
    // The one KV budget holds a RAM tier and the pool beside it (kvl/kv_budget.h); where the
    // tier alone takes all of it, say so before anything loads (KvMemory checks the pool's
    // least room once the model's shape is known).
    if (spec.kind == TierKind::kRam && o.kv_budget_bytes > 0 &&
        spec.capacity_bytes >= o.kv_budget_bytes) {
      return InvalidArgumentError(fmt::format(
          "--kv-tier {}: the RAM tier's {} bytes do not fit in --kv-budget {} bytes, which holds "
          "the tier and the pool beside it; give a larger --kv-budget, a smaller tier, or "
          "ram:auto to split the budget",
          text, spec.capacity_bytes, o.kv_budget_bytes));
    }
  }
  return Status::Ok();
}

}  // namespace kvl
