// Attention over q8_0 / q4_0 rows (the -ctk / -ctv q8_0 | q4_0 cache types): on every ISA,
// DequantizeCols must give the values of quant::DequantizeRow, and DotRowsQuant / AxpyRowsQuant
// exactly what DotRows / AxpyRows give over the dequantized columns; against the scalar path they
// differ by the f32 kernels' rounding only.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"

namespace kvl::ops {
namespace {

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// count rows of kv_dim values quantized as a cache stores them, with an all-zero block now and
// then (scale 0) and a few large values.
struct QuantRows {
  DType type;
  int64_t kv_dim;
  int64_t count;
  int64_t row_bytes;
  std::vector<uint8_t> bytes;   // [count][row_bytes]
  std::vector<float> widened;   // [count][kv_dim], quant::DequantizeRow of each row

  QuantRows(DType t, int64_t dim, int64_t n, uint32_t seed)
      : type(t), kv_dim(dim), count(n), row_bytes(RowBytes(t, dim)) {
    std::vector<float> x = Random(dim * n, seed);
    for (int64_t i = 0; i < dim * n; i += 97) x[static_cast<size_t>(i)] *= 50.0f;
    for (int64_t c = 0; c < 32 && dim * n >= 64; ++c) x[static_cast<size_t>(32 + c)] = 0.0f;
    bytes.resize(static_cast<size_t>(row_bytes * n));
    widened.resize(x.size());
    for (int64_t r = 0; r < n; ++r) {
      quant::QuantizeRow(t, &x[static_cast<size_t>(r * dim)], dim, &bytes[static_cast<size_t>(r * row_bytes)]);
      quant::DequantizeRow(t, &bytes[static_cast<size_t>(r * row_bytes)], dim,
                           &widened[static_cast<size_t>(r * dim)]);
    }
  }
};

// (col, n) pairs: whole blocks, heads inside one block (stories260K's head_dim 8), heads across
// block boundaries.
struct Cols {
  int64_t col, n;
};
constexpr Cols kCols[] = {{0, 32}, {32, 64}, {0, 96}, {8, 8}, {40, 8}, {16, 32}, {24, 48}, {5, 3}};

std::vector<uint32_t> Bits(const float* v, int64_t n) {
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bits[static_cast<size_t>(i)] = std::bit_cast<uint32_t>(v[i]);
  return bits;
}

TEST(QuantRowsTest, DequantizeColsEqualsReferenceOnEveryIsa) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kQuantTypes) {
      const QuantRows rows(type, 96, 3, 7);
      for (const Cols& c : kCols) {
        for (int64_t r = 0; r < rows.count; ++r) {
          std::vector<float> out(static_cast<size_t>(c.n));
          DequantizeCols(ctx, type, &rows.bytes[static_cast<size_t>(r * rows.row_bytes)], c.col, c.n,
                         out.data());
          const float* ref = &rows.widened[static_cast<size_t>(r * rows.kv_dim + c.col)];
          ASSERT_EQ(Bits(out.data(), c.n), Bits(ref, c.n))
              << IsaName(isa) << " " << DTypeName(type) << " col " << c.col << " n " << c.n;
        }
      }
    }
  }
}

TEST(QuantRowsTest, DotAndAxpyEqualF32KernelsOverDequantizedRows) {
  ThreadPool pool(1);
  OpsContext scalar(Isa::kScalar, &pool);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kQuantTypes) {
      // 37 rows: two full chunks of the kernels' stack buffer and a partial one.
      const QuantRows rows(type, 96, 37, 11);
      for (const Cols& c : kCols) {
        const std::vector<float> q = Random(c.n, 3);
        const std::vector<float> w = Random(rows.count, 5);
        std::vector<float> got(static_cast<size_t>(rows.count)), want(got.size()), ref(got.size());
        DotRowsQuant(ctx, type, q.data(), rows.bytes.data(), rows.row_bytes, c.col, rows.count, c.n,
                     0.25f, got.data());
        DotRows(ctx, q.data(), rows.widened.data() + c.col, rows.kv_dim, rows.count, c.n, 0.25f,
                want.data());
        DotRowsQuant(scalar, type, q.data(), rows.bytes.data(), rows.row_bytes, c.col, rows.count,
                     c.n, 0.25f, ref.data());
        ASSERT_EQ(Bits(got.data(), rows.count), Bits(want.data(), rows.count))
            << IsaName(isa) << " " << DTypeName(type) << " col " << c.col << " n " << c.n;
        for (int64_t i = 0; i < rows.count; ++i) {
          ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.0f + std::abs(ref[i]))) << IsaName(isa) << " row " << i;
        }

        std::vector<float> y(static_cast<size_t>(c.n), 0.5f), y_want = y, y_ref = y;
        AxpyRowsQuant(ctx, type, w.data(), rows.bytes.data(), rows.row_bytes, c.col, rows.count, c.n,
                      y.data());
        AxpyRows(ctx, w.data(), rows.widened.data() + c.col, rows.kv_dim, rows.count, c.n,
                 y_want.data());
        AxpyRowsQuant(scalar, type, w.data(), rows.bytes.data(), rows.row_bytes, c.col, rows.count,
                      c.n, y_ref.data());
        ASSERT_EQ(Bits(y.data(), c.n), Bits(y_want.data(), c.n))
            << IsaName(isa) << " " << DTypeName(type) << " col " << c.col << " n " << c.n;
        for (int64_t j = 0; j < c.n; ++j) {
          ASSERT_NEAR(y[j], y_ref[j], 1e-4f * (1.0f + std::abs(y_ref[j]))) << IsaName(isa) << " col " << j;
        }
      }
    }
  }
}

// A run split into pieces gives what the whole run gives (the paged cache splits runs at block
// boundaries; batch invariance needs the split not to matter).
TEST(QuantRowsTest, SplittingARunChangesNothing) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (DType type : kQuantTypes) {
      const QuantRows rows(type, 64, 40, 13);
      const std::vector<float> w = Random(rows.count, 17);
      std::vector<float> whole(32, 0.0f), pieces(32, 0.0f);
      AxpyRowsQuant(ctx, type, w.data(), rows.bytes.data(), rows.row_bytes, 32, rows.count, 32,
                    whole.data());
      for (int64_t i = 0; i < rows.count; i += 7) {
        const int64_t m = std::min<int64_t>(7, rows.count - i);
        AxpyRowsQuant(ctx, type, w.data() + i, rows.bytes.data() + i * rows.row_bytes, rows.row_bytes,
                      32, m, 32, pieces.data());
      }
      ASSERT_EQ(Bits(whole.data(), 32), Bits(pieces.data(), 32)) << IsaName(isa);
    }
  }
}

}  // namespace
}  // namespace kvl::ops
