// Tests that size a pool of N pages and put a RAM tier beside it: the one KV budget
// (kvl/kv_budget.h) holds the tier too (its pages and its map of them), so a given budget grows by
// what the tier takes and the pool keeps the pages the test counted on.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kv/kv_budget_split.h"
#include "kvl/dtype.h"
#include "kvl/engine.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_tier.h"
#include "kvl/model.h"

namespace kvl::testing {

// o->kv_tiers = tiers, and a given o->kv_budget_bytes (not the default) grows by the DRAM a
// ram:SIZE takes with o's model and cache types.
inline void SetTiersBesidePool(EngineOptions* o, const std::vector<std::string>& tiers) {
  o->kv_tiers = tiers;
  if (o->kv_budget_bytes <= 0) return;
  for (const std::string& text : tiers) {
    const StatusOr<TierSpec> spec = ParseTierSpec(text);
    if (!spec.ok() || spec->kind != TierKind::kRam) continue;
    StatusOr<std::unique_ptr<Model>> model = Model::Load(o->model_path);
    const StatusOr<DType> k = ParseKvCacheType(o->cache_type_k);
    const StatusOr<DType> v = ParseKvCacheType(o->cache_type_v);
    ASSERT_TRUE(model.ok() && k.ok() && v.ok()) << model.status().ToString();
    const int64_t kv_dim = (*model)->config().kv_dim();
    const int64_t layer_page = o->block_tokens * (RowBytes(*k, kv_dim) + RowBytes(*v, kv_dim));
    o->kv_budget_bytes += kv_internal::RamTierDramBytes(spec->capacity_bytes, layer_page);
  }
}

}  // namespace kvl::testing
