// DotRows / AxpyRows must give exactly what loops of Dot / Axpy give, however the rows are split
// into runs: the KV cache may hand attention its rows in runs of any length.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvl/ops.h"

namespace kvl::ops {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(AttentionRowsTest, RowKernelsEqualPerRowLoopsBitForBit) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int64_t n : {1, 8, 37, 64, 100, 128, 200}) {
      const int64_t stride = n + 5, count = 23;
      const std::vector<float> rows = Random(stride * count, static_cast<uint32_t>(n));
      const std::vector<float> q = Random(n, 7), weights = Random(count, 9);

      std::vector<float> dot_loop(count), dot_rows(count, -1.0f);
      for (int64_t i = 0; i < count; ++i) dot_loop[i] = Dot(ctx, q.data(), &rows[i * stride], n) * 0.125f;
      std::vector<float> y_loop = Random(n, 11);
      std::vector<float> y_rows = y_loop;
      for (int64_t i = 0; i < count; ++i) Axpy(ctx, weights[i], &rows[i * stride], y_loop.data(), n);

      // Split the rows into runs of 1, 2, 3, ... rows.
      for (int64_t begin = 0, run = 1; begin < count; begin += run, ++run) {
        const int64_t len = std::min(run, count - begin);
        DotRows(ctx, q.data(), &rows[begin * stride], stride, len, n, 0.125f, &dot_rows[begin]);
        AxpyRows(ctx, &weights[begin], &rows[begin * stride], stride, len, n, y_rows.data());
      }
      EXPECT_EQ(dot_rows, dot_loop) << IsaName(isa) << " n " << n;
      EXPECT_EQ(y_rows, y_loop) << IsaName(isa) << " n " << n;
    }
  }
}

}  // namespace
}  // namespace kvl::ops
