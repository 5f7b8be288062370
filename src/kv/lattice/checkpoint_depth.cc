#include "kvl/checkpoint_depth.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvl {

int64_t CheckpointLayersKept(int64_t num_layers, int64_t every) {
  KVL_CHECK(num_layers > 0 && every >= 1 && every <= num_layers);
  return (num_layers + every - 1) / every;
}

CheckpointDepthCost PriceCheckpointDepth(const CheckpointDepthPrices& prices, int64_t every) {
  const int64_t layers = prices.num_layers;
  CheckpointDepthCost c;
  c.every = every;
  c.layers_kept = CheckpointLayersKept(layers, every);
  c.bytes = prices.page_residual_bytes / layers * c.layers_kept;
  // A layer run whole costs what recomputing from tokens costs per layer; its K/V part is already
  // in rebuild_kv_ms (every layer's K/V is projected whatever s is).
  const double run_extra_ms =
      std::max(0.0, prices.recompute_tokens_ms - prices.rebuild_kv_ms) / static_cast<double>(layers);
  c.rebuild_ms = prices.rebuild_kv_ms + static_cast<double>(layers - c.layers_kept) * run_extra_ms;
  c.memory_cost_ms =
      prices.memory_price_ms_per_mib * static_cast<double>(c.bytes) / static_cast<double>(1 << 20);
  c.total_ms = prices.rebuilds * c.rebuild_ms + c.memory_cost_ms;
  return c;
}

StatusOr<CheckpointDepthChoice> ChooseCheckpointDepth(const CheckpointDepthPrices& prices) {
  if (prices.num_layers <= 0 || prices.page_residual_bytes < 0 || prices.rebuild_kv_ms < 0 ||
      prices.recompute_tokens_ms < 0 || prices.memory_price_ms_per_mib < 0 || prices.rebuilds < 0 ||
      prices.max_rebuild_ms < 0) {
    return InvalidArgumentError(fmt::format(
        "checkpoint depth prices must be non-negative with layers > 0: layers {}, bytes {}, "
        "rebuild {} ms, recompute {} ms, memory {} ms/MiB, rebuilds {}",
        prices.num_layers, prices.page_residual_bytes, prices.rebuild_kv_ms,
        prices.recompute_tokens_ms, prices.memory_price_ms_per_mib, prices.rebuilds));
  }
  CheckpointDepthChoice choice;
  for (int64_t s = 1; s < prices.num_layers; s *= 2) {
    choice.costs.push_back(PriceCheckpointDepth(prices, s));
  }
  choice.costs.push_back(PriceCheckpointDepth(prices, prices.num_layers));
  const CheckpointDepthCost* best = &choice.costs.front();
  for (const CheckpointDepthCost& c : choice.costs) {
    const bool in_time = prices.max_rebuild_ms <= 0 || c.rebuild_ms <= prices.max_rebuild_ms;
    if (in_time && c.total_ms < best->total_ms) best = &c;
  }
  choice.every = best->every;
  return choice;
}

std::string CheckpointDepthChoice::Explain() const {
  std::string out;
  for (const CheckpointDepthCost& c : costs) {
    out += fmt::format("checkpoints every {:>2} layers: {:>3} kept, {:>10} B, rebuild {:9.3f} ms, "
                       "memory {:9.3f} ms, total {:9.3f} ms{}\n",
                       c.every, c.layers_kept, c.bytes, c.rebuild_ms, c.memory_cost_ms, c.total_ms,
                       c.every == every ? "  <- chosen" : "");
  }
  return out;
}

}  // namespace kvl
