// A cost profile for stories260K fixed in the test rather than measured: the busy test machine
// would make the policy's choices (and so what a test exercises) change from run to run.
#pragma once

#include "kvl/engine.h"

namespace kvl::testing {

// Rebuilding a page from its checkpoints costs `residual_ms`, recomputing it from its tokens
// `tokens_ms`; RAM moves 10 GB/s, a disk 1 GB/s.
inline MachineProfile FixedStoriesPrices(double residual_ms = 1, double tokens_ms = 10) {
  constexpr int64_t kLayers = 5;  // stories260K: the curves are evaluated at its depth
  MachineProfile prices;
  prices.model.layers = kLayers;
  prices.recompute_from_residual.call_ms = residual_ms;  // per page
  prices.recompute_from_tokens.token_layer_ms = tokens_ms / (16 * kLayers);
  prices.memory_copy_gbps = 10;
  prices.ram.read.gbps = prices.ram.write.gbps = 10;
  prices.disk_buffered.read.gbps = prices.disk_buffered.write.gbps = 1;
  return prices;
}

}  // namespace kvl::testing
