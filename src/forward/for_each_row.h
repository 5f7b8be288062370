// Row-parallel helper of the forward pass's per-token work (norms, RoPE, residuals, routing).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvl/thread_pool.h"

namespace kvl {

// Runs row(t) for t in [0, n) over the pool, 16 rows a task, when a prefill has enough rows: the
// per-token norms, RoPE and residual work between the matmuls would otherwise run on one thread
// while the others wait. Each row's operations are its own, so the split changes no result;
// decode's few rows run on the caller, where waking the workers would cost more than the rows.
template <typename RowFn>
void ForEachRow(ThreadPool& pool, int64_t n, RowFn&& row) {
  constexpr int64_t kRowsPerTask = 16;
  if (n < 2 * kRowsPerTask) {
    for (int64_t t = 0; t < n; ++t) row(t);
    return;
  }
  pool.ParallelFor((n + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task, int) {
    const int64_t end = std::min(n, (task + 1) * kRowsPerTask);
    for (int64_t t = task * kRowsPerTask; t < end; ++t) row(t);
  });
}

}  // namespace kvl
