// The tiled online-softmax attention (PackAttentionKeys / AttentionTile): packing is an exact
// widening on every ISA; a row's result is bit-identical however many rows share its calls and
// whatever the tile's width; and the result is softmax(q K^T * scale) V, checked against a
// double-precision reference for every ISA path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvl/ops.h"
#include "kvl/quant.h"

namespace kvl::ops {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A 64-byte aligned float buffer.
struct Aligned {
  explicit Aligned(int64_t n) : data(static_cast<size_t>(n) + 16) {}
  float* get() {
    auto p = reinterpret_cast<uintptr_t>(data.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }
  std::vector<float> data;
};

TEST(AttentionTileTest, PackIsAnExactWideningOnEveryIsa) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int64_t d : {8, 20, 64, 100, 128, 256}) {
      const int64_t width = AttentionTileTokens(d);
      for (DType type : {DType::kF32, DType::kF16, DType::kBF16}) {
        const int64_t stride = 3 * d + 5;  // rows of several heads; this head at column d
        const std::vector<float> values = Random(stride * width, static_cast<uint32_t>(d));
        std::vector<uint16_t> half(values.size());
        for (size_t i = 0; i < values.size(); ++i) {
          half[i] = type == DType::kF16 ? quant::Fp32ToFp16(values[i]) : quant::Fp32ToBf16(values[i]);
        }
        auto widened = [&](int64_t e) {
          if (type == DType::kF32) return values[static_cast<size_t>(e)];
          return type == DType::kF16 ? quant::Fp16ToFp32(half[static_cast<size_t>(e)])
                                     : quant::Bf16ToFp32(half[static_cast<size_t>(e)]);
        };
        const void* base = type == DType::kF32 ? static_cast<const void*>(values.data() + d)
                                               : static_cast<const void*>(half.data() + d);
        Aligned kt(width * d);
        std::fill(kt.get(), kt.get() + width * d, -7.0f);
        // Two runs, the second not starting on a multiple of 16.
        const int64_t first = std::min<int64_t>(width, 13), second = width - first - 1;
        PackAttentionKeys(ctx, type, base, stride, first, d, kt.get(), width, 0);
        const void* second_base =
            type == DType::kF32 ? static_cast<const void*>(values.data() + d + first * stride)
                                : static_cast<const void*>(half.data() + d + first * stride);
        PackAttentionKeys(ctx, type, second_base, stride, second, d, kt.get(), width, first);
        for (int64_t c = 0; c < d; ++c) {
          for (int64_t j = 0; j < width; ++j) {
            const float want = j < first + second ? widened(j * stride + d + c) : -7.0f;
            ASSERT_EQ(kt.get()[c * width + j], want)
                << IsaName(isa) << " " << DTypeName(type) << " d " << d << " c " << c << " j " << j;
          }
        }
      }
    }
  }
}

// Keys and values of one head for `n` positions, and the tiles' packed keys.
struct Head {
  Head(const OpsContext& ctx, int64_t d, int64_t n, uint32_t seed)
      : d(d), n(n), width(AttentionTileTokens(d)), k(Random(n * d, seed, 2.0f)),
        v(Random(n * d, seed + 1)), kt((n + width - 1) / width * width * d) {
    for (int64_t t = 0; t * width < n; ++t) {
      PackAttentionKeys(ctx, DType::kF32, &k[static_cast<size_t>(t * width * d)], d,
                        std::min(width, n - t * width), d, tile(t), width, 0);
    }
    for (int64_t i = 0; i < n; ++i) v_rows.push_back(&v[static_cast<size_t>(i * d)]);
  }
  float* tile(int64_t t) { return kt.get() + t * width * d; }

  int64_t d, n, width;
  std::vector<float> k, v;
  Aligned kt;
  std::vector<const float*> v_rows;
};

// Runs rows (each seeing its own number of positions, visible[r]) over the head's tiles, `group`
// rows per call at most, rows taking part in a call only while their tile is full or their last.
std::vector<std::vector<float>> RunRows(const OpsContext& ctx, Head& h,
                                        const std::vector<std::vector<float>>& qs,
                                        const std::vector<int64_t>& visible, int64_t group) {
  const int64_t rows = static_cast<int64_t>(qs.size());
  std::vector<std::vector<float>> acc(qs.size(), std::vector<float>(static_cast<size_t>(h.d), 0.0f));
  std::vector<float> m(qs.size(), -std::numeric_limits<float>::infinity()), l(qs.size(), 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(h.d));
  for (int64_t t = 0; t * h.width < h.n; ++t) {
    for (int64_t r0 = 0; r0 < rows; r0 += group) {
      // Rows of this group by the count they see in this tile.
      for (int64_t r = r0; r < std::min(rows, r0 + group);) {
        const int64_t count = std::min(h.width, visible[static_cast<size_t>(r)] - t * h.width);
        if (count <= 0) {
          ++r;
          continue;
        }
        std::vector<const float*> q;
        std::vector<float*> a;
        int64_t end = r;
        while (end < std::min(rows, r0 + group) &&
               std::min(h.width, visible[static_cast<size_t>(end)] - t * h.width) == count) {
          q.push_back(qs[static_cast<size_t>(end)].data());
          a.push_back(acc[static_cast<size_t>(end)].data());
          ++end;
        }
        AttentionRows ar;
        ar.num_rows = end - r;
        ar.q = q.data();
        ar.m = &m[static_cast<size_t>(r)];
        ar.l = &l[static_cast<size_t>(r)];
        ar.acc = a.data();
        AttentionTile(ctx, h.tile(t), h.width, &h.v_rows[static_cast<size_t>(t * h.width)], count,
                      h.d, scale, ar);
        r = end;
      }
    }
  }
  for (size_t r = 0; r < qs.size(); ++r) {
    for (float& x : acc[r]) x /= l[r];
  }
  return acc;
}

TEST(AttentionTileTest, RowsAreBitIdenticalWhateverTheirCompany) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int64_t d : {8, 64, 72, 128}) {
      Head h(ctx, d, 150, static_cast<uint32_t>(d));
      std::vector<std::vector<float>> qs;
      std::vector<int64_t> visible;
      for (int64_t r = 0; r < 11; ++r) {
        qs.push_back(Random(d, static_cast<uint32_t>(100 + r)));
        visible.push_back(r % 3 == 0 ? 150 : 150 - 7 * r);  // some share counts, some do not
      }
      const auto alone = RunRows(ctx, h, qs, visible, 1);
      for (int64_t group : {2, 3, 4, 5, 8, 11}) {
        EXPECT_EQ(RunRows(ctx, h, qs, visible, group), alone) << IsaName(isa) << " d " << d
                                                              << " group " << group;
      }
    }
  }
}

TEST(AttentionTileTest, MatchesSoftmaxAttentionOnEveryIsa) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    for (int64_t d : {8, 64, 100, 256}) {
      const int64_t n = 300;
      Head h(ctx, d, n, static_cast<uint32_t>(7 * d));
      std::vector<std::vector<float>> qs;
      std::vector<int64_t> visible;
      for (int64_t r = 0; r < 6; ++r) {
        qs.push_back(Random(d, static_cast<uint32_t>(200 + r)));
        visible.push_back(n - 37 * r);
      }
      const auto got = RunRows(ctx, h, qs, visible, 4);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      for (size_t r = 0; r < qs.size(); ++r) {
        std::vector<double> s(static_cast<size_t>(visible[r]));
        double max = -1e300;
        for (int64_t j = 0; j < visible[r]; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double{qs[r][c]} * h.k[static_cast<size_t>(j * d + c)];
          s[static_cast<size_t>(j)] = dot * scale;
          max = std::max(max, dot * scale);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - max));
        for (int64_t c = 0; c < d; ++c) {
          double want = 0;
          for (int64_t j = 0; j < visible[r]; ++j) want += s[static_cast<size_t>(j)] * h.v[static_cast<size_t>(j * d + c)];
          want /= sum;
          ASSERT_NEAR(got[r][static_cast<size_t>(c)], want, 2e-5)
              << IsaName(isa) << " d " << d << " row " << r << " c " << c;
        }
      }
    }
  }
}

TEST(AttentionTileTest, ScoresOutAreTheScaledDotProducts) {
  ThreadPool pool(1);
  for (Isa isa : RunnableIsas()) {
    OpsContext ctx(isa, &pool);
    const int64_t d = 64;
    Head h(ctx, d, 40, 5);
    const std::vector<float> q = Random(d, 6);
    const float* qp = q.data();
    std::vector<float> acc(d, 0.0f), scores(40, 0.0f);
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    float* accp = acc.data();
    float* sp = scores.data();
    AttentionRows rows;
    rows.num_rows = 1;
    rows.q = &qp;
    rows.m = &m;
    rows.l = &l;
    rows.acc = &accp;
    rows.scores = &sp;
    AttentionTile(ctx, h.tile(0), h.width, h.v_rows.data(), 40, d, 0.125f, rows);
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < 40; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += double{q[c]} * h.k[static_cast<size_t>(j * d + c)];
      EXPECT_NEAR(scores[static_cast<size_t>(j)], dot * 0.125, 1e-4) << IsaName(isa) << " j " << j;
      max = std::max(max, scores[static_cast<size_t>(j)]);
    }
    EXPECT_EQ(m, max) << IsaName(isa);
  }
}

TEST(AttentionTileTest, TileTokensFitTheTile) {
  for (int64_t d = 1; d <= kMaxAttentionHeadDim; ++d) {
    const int64_t t = AttentionTileTokens(d);
    EXPECT_EQ(t % 16, 0);
    EXPECT_LE(t, kMaxAttentionTileTokens);
    EXPECT_LE(t * d, kAttentionTileFloats) << d;
  }
  EXPECT_EQ(AttentionTileTokens(64), 64);
  EXPECT_EQ(AttentionTileTokens(128), 32);
  EXPECT_EQ(AttentionTileTokens(256), 16);
}

}  // namespace
}  // namespace kvl::ops
