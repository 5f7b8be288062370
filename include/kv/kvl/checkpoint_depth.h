// Partial-depth residual checkpoints: how often a page keeps its residual stream.
//
// A page kept as checkpoints every s-th layer (layers 0, s, 2s, ...) stores ceil(L / s) layers of
// [block_tokens][dim] floats instead of L, and pays for it at every rebuild: each layer's K and V
// are projected from its input as before, and each layer without a checkpoint first gets that
// input by running the layer before it whole (Q, attention over the context, Wo, FFN) for the
// page's tokens. The choice of s weighs those two against each other:
//
//   cost(s) = rebuilds x rebuild_ms(s) + memory price x MiB of checkpoints(s)
//   rebuild_ms(s) = rebuild_kv_ms + (L - ceil(L / s)) x (recompute_tokens_ms - rebuild_kv_ms) / L
//
// where rebuild_kv_ms (K/V of every layer from checkpoints) and recompute_tokens_ms (the page's
// tokens through every layer) are the measured prices of one page (kvl calibrate). Both terms are
// linear in the layers kept, so on price alone the choice is every layer or one (the break-even
// memory price is a layer run's ms per MiB of a checkpoint layer); a limit on the rebuild time
// (max_rebuild_ms) picks the sparsest stride that still rebuilds in time. Nothing here knows the
// model beyond those numbers. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvl/status.h"

namespace kvl {

struct CheckpointDepthPrices {
  int64_t num_layers = 0;
  int64_t page_residual_bytes = 0;  // one page's checkpoints at every layer (s = 1)
  double rebuild_kv_ms = 0;         // measured: the page's K/V of every layer from checkpoints
  double recompute_tokens_ms = 0;   // measured: the page's tokens run through every layer
  // What holding one MiB of checkpoints costs against one rebuild (ms per MiB), and how many
  // times the page is expected to be rebuilt while it is held (a running page: once per step).
  double memory_price_ms_per_mib = 0;
  double rebuilds = 1;
  // The longest a rebuild of the page may take (e.g. the compute a decode step leaves idle);
  // 0: no limit. s = 1 is always allowed.
  double max_rebuild_ms = 0;
};

struct CheckpointDepthCost {
  int64_t every = 1;        // s
  int64_t layers_kept = 0;  // ceil(L / s)
  int64_t bytes = 0;        // the page's checkpoints
  double rebuild_ms = 0;
  double memory_cost_ms = 0;
  double total_ms = 0;
};

struct CheckpointDepthChoice {
  int64_t every = 1;
  std::vector<CheckpointDepthCost> costs;  // every candidate s, smallest first
  std::string Explain() const;             // one line per candidate (--explain)
};

// Layers a page keeps checkpoints of at stride `every` (1 <= every <= num_layers).
int64_t CheckpointLayersKept(int64_t num_layers, int64_t every);
// The price of stride `every` for one page.
CheckpointDepthCost PriceCheckpointDepth(const CheckpointDepthPrices& prices, int64_t every);
// The cheapest of s = 1, 2, 4, ... (powers of two below L) and s = L whose rebuild fits
// max_rebuild_ms (s = 1 always does); the smallest s on a tie.
// INVALID_ARGUMENT for prices that cannot be compared (no layers, negative times or bytes).
StatusOr<CheckpointDepthChoice> ChooseCheckpointDepth(const CheckpointDepthPrices& prices);

}  // namespace kvl
