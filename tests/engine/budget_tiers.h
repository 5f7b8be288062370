// Tests that size a pool of N pages and put a RAM tier beside it: the one KV budget
// (kvl/kv_budget.h) holds the tier too, so a given budget grows by the tier's size and the pool
// keeps the pages the test counted on.
#pragma once

#include <string>
#include <vector>

#include "kvl/engine.h"
#include "kvl/kv_tier.h"

namespace kvl::testing {

// o->kv_tiers = tiers, and a given o->kv_budget_bytes (not the default) grows by a ram:SIZE's.
inline void SetTiersBesidePool(EngineOptions* o, const std::vector<std::string>& tiers) {
  o->kv_tiers = tiers;
  if (o->kv_budget_bytes <= 0) return;
  for (const std::string& text : tiers) {
    const StatusOr<TierSpec> spec = ParseTierSpec(text);
    if (spec.ok() && spec->kind == TierKind::kRam) o->kv_budget_bytes += spec->capacity_bytes;
  }
}

// The budget's share that the pool, its staging and rings hold: the whole less a RAM tier.
inline int64_t PoolSideBudget(const EngineMetrics& m) {
  return m.kv_budget_bytes - m.kv_budget_split.ram_tier_bytes;
}

}  // namespace kvl::testing
