// Attention kernels over compressed KV pages (DotRowsK* / AxpyRowsV*): every ISA path against the
// scalar one, and every path against DotRows / AxpyRows on the dequantized f32 rows, within float
// rounding. Pages are built here from random codes and parameters straight in the view's layout
// (ops does not link the codec in kv/; tests/kv checks that the codec's views match DecodeLayer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kvl/ops.h"

namespace kvl::ops {
namespace {

// A compressed layer owned by the test, and its f32 dequantization ([rows][kv_dim] each).
struct TestPage {
  int bits = 8;
  std::vector<uint8_t> k_q, v_q;
  std::vector<float> k_scale, k_min, v_scale, v_min;
  std::vector<float> k, v;  // dequantized
  QuantKvLayerView view;
};

TestPage MakePage(int bits, int64_t rows, int64_t kv_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(bits == 8 ? -127 : 0, bits == 8 ? 127 : 15);
  std::uniform_real_distribution<float> pos(0.001f, 0.05f), sym(-1.0f, 1.0f);
  const int64_t row_bytes = bits == 8 ? kv_dim : kv_dim / 2;
  const int64_t group = kv_dim % 32 == 0 ? 32 : kv_dim, groups = kv_dim / group;
  TestPage p;
  p.bits = bits;
  p.k_q.assign(static_cast<size_t>(rows * row_bytes), 0);
  p.v_q = p.k_q;
  p.k_scale.resize(kv_dim);
  p.k_min.resize(kv_dim);
  p.v_scale.resize(rows * groups);
  p.v_min.resize(rows * groups);
  for (int64_t c = 0; c < kv_dim; ++c) {
    p.k_scale[c] = c % 11 == 3 ? 0.0f : pos(rng) * (c % 7 == 0 ? 30.0f : 1.0f);  // zeros, outliers
    p.k_min[c] = sym(rng) * 2.0f;
  }
  for (int64_t i = 0; i < rows * groups; ++i) {
    p.v_scale[i] = i % 5 == 2 ? 0.0f : pos(rng);
    p.v_min[i] = sym(rng);
  }
  auto put = [&](std::vector<uint8_t>& q, int64_t t, int64_t c, int value) {
    if (bits == 8) {
      q[t * row_bytes + c] = static_cast<uint8_t>(static_cast<int8_t>(value));
    } else {
      q[t * row_bytes + c / 2] |= static_cast<uint8_t>(value << ((c & 1) * 4));
    }
  };
  p.k.resize(rows * kv_dim);
  p.v.resize(rows * kv_dim);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < kv_dim; ++c) {
      const int kc = code(rng), vc = code(rng);
      put(p.k_q, t, c, kc);
      put(p.v_q, t, c, vc);
      const int64_t g = t * groups + c / group;
      p.k[t * kv_dim + c] = bits == 8 ? p.k_scale[c] * static_cast<float>(kc)
                                      : p.k_scale[c] * static_cast<float>(kc) + p.k_min[c];
      p.v[t * kv_dim + c] = bits == 8 ? p.v_scale[g] * static_cast<float>(vc)
                                      : p.v_scale[g] * static_cast<float>(vc) + p.v_min[g];
    }
  }
  QuantKvLayerView& view = p.view;
  view.bits = bits;
  view.rows = rows;
  view.kv_dim = kv_dim;
  view.row_bytes = row_bytes;
  view.k_q = p.k_q.data();
  view.k_scale = p.k_scale.data();
  view.k_min = bits == 4 ? p.k_min.data() : nullptr;
  view.v_q = p.v_q.data();
  view.v_group = group;
  view.v_groups = groups;
  view.v_scale = p.v_scale.data();
  view.v_min = bits == 4 ? p.v_min.data() : nullptr;
  return p;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A head's channels [offset, offset + dim) of a compressed page.
struct Slice {
  int64_t offset, dim;
};

// Head-aligned slices for the usual head sizes, plus unaligned ones that straddle value groups.
std::vector<Slice> Slices(int64_t kv_dim) {
  std::vector<Slice> out;
  for (int64_t head_dim : {8, 64, 128}) {
    if (kv_dim % head_dim != 0) continue;
    for (int64_t h = 0; h < kv_dim / head_dim; ++h) out.push_back({h * head_dim, head_dim});
  }
  out.push_back({0, kv_dim <= 256 ? kv_dim : 256});
  for (Slice s : {Slice{24, 16}, Slice{2, 30}, Slice{8, 56}, Slice{30, 66}}) {
    if (s.offset + s.dim <= kv_dim) out.push_back(s);
  }
  return out;
}

void CheckPage(const OpsContext& ctx, const OpsContext& scalar, const TestPage& p,
               const std::string& what) {
  const QuantKvLayerView& page = p.view;
  const int64_t rows = page.rows, kv_dim = page.kv_dim;
  for (Slice s : Slices(kv_dim)) {
    // Runs of rows: the whole page, and a run that starts inside it.
    for (int64_t first : {int64_t{0}, rows / 3}) {
      const int64_t count = rows - first;
      const std::string where = what + " slice " + std::to_string(s.offset) + "+" +
                                std::to_string(s.dim) + " rows " + std::to_string(first) + "+" +
                                std::to_string(count);
      const std::vector<float> q = Random(s.dim, static_cast<uint32_t>(s.offset + 17));
      const std::vector<float> w = Random(count, static_cast<uint32_t>(first + 5));
      const float scale = 0.125f;

      // Scores: against the scalar kernel and against DotRows on the dequantized rows.
      std::vector<float> got(count + 1, -7.0f), want_scalar(count + 1, -7.0f), want_f32(count);
      DotRowsK(ctx, q.data(), page, first, count, s.offset, s.dim, scale, got.data());
      DotRowsK(scalar, q.data(), page, first, count, s.offset, s.dim, scale, want_scalar.data());
      DotRows(scalar, q.data(), &p.k[first * kv_dim + s.offset], kv_dim, count, s.dim, scale,
              want_f32.data());
      EXPECT_EQ(got[count], -7.0f) << where << ": wrote past out[count - 1]";
      for (int64_t i = 0; i < count; ++i) {
        float magnitude = 0.0f;  // sum |q_c * k_c| * scale: the rounding scale of this dot
        for (int64_t c = 0; c < s.dim; ++c) {
          magnitude += std::fabs(q[c] * p.k[(first + i) * kv_dim + s.offset + c]) * scale;
        }
        const float tol = 2e-6f * magnitude * static_cast<float>(s.dim) + 1e-6f;
        ASSERT_TRUE(std::isfinite(got[i])) << where;
        ASSERT_NEAR(got[i], want_scalar[i], tol) << where << " score " << i;
        ASSERT_NEAR(got[i], want_f32[i], tol) << where << " score " << i;
      }

      // Weighted values, added to a y that already holds something; y[dim] is a sentinel.
      std::vector<float> y0 = Random(s.dim + 1, 3);
      std::vector<float> y = y0, y_scalar = y0, y_f32 = y0;
      AxpyRowsV(ctx, w.data(), page, first, count, s.offset, s.dim, y.data());
      AxpyRowsV(scalar, w.data(), page, first, count, s.offset, s.dim, y_scalar.data());
      AxpyRows(scalar, w.data(), &p.v[first * kv_dim + s.offset], kv_dim, count, s.dim,
               y_f32.data());
      EXPECT_EQ(y[s.dim], y0[s.dim]) << where << ": wrote past y[head_dim - 1]";
      for (int64_t c = 0; c < s.dim; ++c) {
        float magnitude = std::fabs(y0[c]);
        for (int64_t i = 0; i < count; ++i) {
          magnitude += std::fabs(w[i] * p.v[(first + i) * kv_dim + s.offset + c]);
        }
        const float tol = 2e-6f * magnitude * static_cast<float>(count + 2) + 1e-6f;
        ASSERT_TRUE(std::isfinite(y[c])) << where;
        ASSERT_NEAR(y[c], y_scalar[c], tol) << where << " channel " << c;
        ASSERT_NEAR(y[c], y_f32[c], tol) << where << " channel " << c;
      }
    }
  }
}

TEST(CompressedAttentionTest, EveryIsaMatchesScalarAndDequantizedRows) {
  ThreadPool pool(1);
  OpsContext scalar(Isa::kScalar, &pool);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int bits : {8, 4}) {
      for (int64_t kv_dim : {32, 40, 64, 96, 256, 512}) {
        for (int64_t rows : {1, 7, 16}) {
          const TestPage p =
              MakePage(bits, rows, kv_dim, static_cast<uint32_t>(kv_dim * rows + bits));
          CheckPage(ctx, scalar, p,
                    std::string(IsaName(isa)) + " int" + std::to_string(bits) + " kv_dim " +
                        std::to_string(kv_dim) + " rows " + std::to_string(rows));
        }
      }
    }
  }
}

TEST(CompressedAttentionTest, AllZeroPageGivesZeroScoresAndLeavesYUnchanged) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int bits : {8, 4}) {
      TestPage p = MakePage(bits, 16, 64, 1);
      std::fill(p.k_scale.begin(), p.k_scale.end(), 0.0f);
      std::fill(p.k_min.begin(), p.k_min.end(), 0.0f);
      std::fill(p.v_scale.begin(), p.v_scale.end(), 0.0f);
      std::fill(p.v_min.begin(), p.v_min.end(), 0.0f);
      const std::vector<float> q = Random(64, 2), w = Random(16, 3), y0 = Random(64, 4);
      std::vector<float> scores(16, 1.0f), y = y0;
      DotRowsK(ctx, q.data(), p.view, 0, 16, 0, 64, 0.125f, scores.data());
      AxpyRowsV(ctx, w.data(), p.view, 0, 16, 0, 64, y.data());
      for (float s : scores) EXPECT_EQ(s, 0.0f) << IsaName(isa) << " int" << bits;
      EXPECT_EQ(y, y0) << IsaName(isa) << " int" << bits;
    }
  }
}

TEST(CompressedAttentionTest, ZeroRowsIsANoOp) {
  ThreadPool pool(1);
  OpsContext ctx(BestIsa(), &pool);
  const TestPage p = MakePage(8, 16, 64, 9);
  std::vector<float> y = {1.0f};
  DotRowsK(ctx, nullptr, p.view, 16, 0, 0, 64, 1.0f, nullptr);
  AxpyRowsV(ctx, nullptr, p.view, 16, 0, 0, 64, y.data());
  EXPECT_EQ(y[0], 1.0f);
}

}  // namespace
}  // namespace kvl::ops
