// The KV page codec: sizes and layout, error bounds of the int8 / int4 round trip per channel
// (keys) and per group (values), degenerate inputs (zero and constant channels), and that the
// views handed to the attention kernels point at exactly the bytes DecodeLayer reads.
#include "kvl/kv_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace kvl {
namespace {

constexpr KvCodecType kTypes[] = {KvCodecType::kInt8, KvCodecType::kInt4};

std::vector<float> Random(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Pages are float-aligned buffers; 64-aligned as a real pool would give.
struct Buffer {
  explicit Buffer(int64_t bytes) : words(static_cast<size_t>((bytes + 63) / 64) * 16 + 16) {}
  uint8_t* data() {
    const auto p = reinterpret_cast<uintptr_t>(words.data());
    return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t{63});
  }
  std::vector<float> words;
};

// Dequantizes through the view only, as the kernels read a page (an independent check on
// DecodeLayer and on the view's pointers).
void DecodeThroughView(const ops::QuantKvLayerView& p, std::vector<float>& k,
                       std::vector<float>& v) {
  k.assign(static_cast<size_t>(p.rows * p.kv_dim), 0.0f);
  v.assign(k.size(), 0.0f);
  for (int64_t t = 0; t < p.rows; ++t) {
    for (int64_t c = 0; c < p.kv_dim; ++c) {
      const int64_t g = c / p.v_group;
      const uint8_t kb = p.k_q[t * p.row_bytes + (p.bits == 8 ? c : c / 2)];
      const uint8_t vb = p.v_q[t * p.row_bytes + (p.bits == 8 ? c : c / 2)];
      const float vs = p.v_scale[t * p.v_groups + g];
      if (p.bits == 8) {
        k[t * p.kv_dim + c] = p.k_scale[c] * static_cast<float>(static_cast<int8_t>(kb));
        v[t * p.kv_dim + c] = vs * static_cast<float>(static_cast<int8_t>(vb));
      } else {
        const int kn = (kb >> ((c & 1) * 4)) & 15, vn = (vb >> ((c & 1) * 4)) & 15;
        k[t * p.kv_dim + c] = p.k_scale[c] * static_cast<float>(kn) + p.k_min[c];
        v[t * p.kv_dim + c] = vs * static_cast<float>(vn) + p.v_min[t * p.v_groups + g];
      }
    }
  }
}

// Worst-case round-trip error of a set of values: half a quantization step (+ float slack).
float Bound(KvCodecType type, float lo, float hi) {
  const float amax = std::max(std::fabs(lo), std::fabs(hi));
  const float half_step = type == KvCodecType::kInt8 ? amax / 254.0f : (hi - lo) / 30.0f;
  return half_step * 1.0001f + 1e-6f * amax + 1e-30f;
}

TEST(KvCodecTest, SizesAtTinyLlamaShape) {
  // kv_dim 256, 16 tokens: int8 = 4096 K codes + 1024 K scales + 4096 V codes + 512 V scales.
  EXPECT_EQ(CompressedLayerBytes(KvCodecType::kInt8, 16, 256), 9728);
  // int4 = 2048 + 1024 + 1024 (K codes, scales, mins) + 2048 + 512 + 512 (V).
  EXPECT_EQ(CompressedLayerBytes(KvCodecType::kInt4, 16, 256), 7168);
  EXPECT_EQ(CompressedPageBytes(KvCodecType::kInt8, 16, 22, 256), 22 * 9728);
  const double f32_page = 2.0 * 22 * 16 * 256 * 4;
  EXPECT_GT(f32_page / CompressedPageBytes(KvCodecType::kInt8, 16, 22, 256), 3.3);
  EXPECT_GT(f32_page / CompressedPageBytes(KvCodecType::kInt4, 16, 22, 256), 4.5);
  EXPECT_EQ(KvValueGroupSize(256), 32);
  EXPECT_EQ(KvValueGroupSize(40), 40);
  for (KvCodecType type : kTypes) {
    for (int64_t tokens : {1, 7, 16}) {
      for (int64_t dim : {8, 32, 40, 96, 256}) {
        const KvCodecLayerLayout l = CompressedLayerLayout(type, tokens, dim);
        EXPECT_EQ(l.bytes % 64, 0);
        for (int64_t off : {l.k_q, l.k_scale, l.v_q, l.v_scale}) EXPECT_EQ(off % 64, 0);
        EXPECT_EQ(l.k_min >= 0, type == KvCodecType::kInt4);
      }
    }
  }
}

TEST(KvCodecTest, RoundTripWithinHalfAStepPerChannelAndGroup) {
  for (KvCodecType type : kTypes) {
    for (int64_t tokens : {1, 7, 16}) {
      for (int64_t dim : {8, 32, 40, 64, 96, 256}) {
        const int64_t n = tokens * dim;
        std::vector<float> k = Random(n, 1 + static_cast<uint32_t>(dim * tokens));
        std::vector<float> v = Random(n, 2 + static_cast<uint32_t>(dim * tokens), 0.5f);
        // Key outlier channels (what per-channel scales exist for) and a shifted channel.
        for (int64_t t = 0; t < tokens; ++t) {
          k[t * dim + 1] *= 40.0f;
          k[t * dim + dim - 1] += 5.0f;
        }
        Buffer buf(CompressedLayerBytes(type, tokens, dim));
        EncodeLayer(type, k.data(), v.data(), tokens, dim, buf.data());
        std::vector<float> kd(n), vd(n);
        DecodeLayer(type, buf.data(), tokens, dim, kd.data(), vd.data());

        const std::string what = std::string(KvCodecName(type)) + " tokens " +
                                 std::to_string(tokens) + " dim " + std::to_string(dim);
        for (int64_t c = 0; c < dim; ++c) {  // keys: per channel over tokens
          float lo = k[c], hi = k[c];
          for (int64_t t = 0; t < tokens; ++t) {
            lo = std::min(lo, k[t * dim + c]);
            hi = std::max(hi, k[t * dim + c]);
          }
          for (int64_t t = 0; t < tokens; ++t) {
            ASSERT_LE(std::fabs(kd[t * dim + c] - k[t * dim + c]), Bound(type, lo, hi))
                << what << " key t " << t << " c " << c;
          }
        }
        const int64_t gs = KvValueGroupSize(dim);
        for (int64_t t = 0; t < tokens; ++t) {  // values: per token and group
          for (int64_t g = 0; g < dim / gs; ++g) {
            const float* x = &v[t * dim + g * gs];
            const auto [lo, hi] = std::minmax_element(x, x + gs);
            for (int64_t j = 0; j < gs; ++j) {
              ASSERT_LE(std::fabs(vd[t * dim + g * gs + j] - x[j]), Bound(type, *lo, *hi))
                  << what << " value t " << t << " c " << g * gs + j;
            }
          }
        }
        // The view reads the same bytes DecodeLayer reads.
        std::vector<float> kv, vv;
        DecodeThroughView(LayerView(type, buf.data(), tokens, dim), kv, vv);
        EXPECT_EQ(kv, kd) << what;
        EXPECT_EQ(vv, vd) << what;
      }
    }
  }
}

TEST(KvCodecTest, ZeroAndConstantDataDecodeExactlyWithoutNaN) {
  const int64_t tokens = 7, dim = 64;
  for (KvCodecType type : kTypes) {
    std::vector<float> k = Random(tokens * dim, 3), v = Random(tokens * dim, 4);
    for (int64_t t = 0; t < tokens; ++t) {
      k[t * dim + 5] = 0.0f;  // an all-zero key channel
      k[t * dim + 6] = 2.5f;  // a constant key channel
      for (int64_t c = 32; c < 64; ++c)
        v[t * dim + c] = t == 3 ? 0.0f : -1.25f;  // zero/constant groups
    }
    Buffer buf(CompressedLayerBytes(type, tokens, dim));
    EncodeLayer(type, k.data(), v.data(), tokens, dim, buf.data());
    std::vector<float> kd(tokens * dim), vd(tokens * dim);
    DecodeLayer(type, buf.data(), tokens, dim, kd.data(), vd.data());
    for (int64_t i = 0; i < tokens * dim; ++i) {
      ASSERT_TRUE(std::isfinite(kd[i]) && std::isfinite(vd[i])) << KvCodecName(type) << " " << i;
    }
    for (int64_t t = 0; t < tokens; ++t) {
      EXPECT_EQ(kd[t * dim + 5], 0.0f);
      // int8 codes 2.5 as 127 * (2.5 / 127): within a rounding of 2.5; int4 keeps min exactly.
      if (type == KvCodecType::kInt4) {
        EXPECT_EQ(kd[t * dim + 6], 2.5f);
      } else {
        EXPECT_NEAR(kd[t * dim + 6], 2.5f, 1e-6f);
      }
      for (int64_t c = 32; c < 64; ++c) {
        if (t == 3) {
          EXPECT_EQ(vd[t * dim + c], 0.0f);
        } else if (type == KvCodecType::kInt4) {
          EXPECT_EQ(vd[t * dim + c], -1.25f);
        } else {
          EXPECT_NEAR(vd[t * dim + c], -1.25f, 1e-6f);
        }
      }
    }
    // A page of zeros: every scale 0, every value decodes to 0.
    std::vector<float> zeros(tokens * dim, 0.0f);
    EncodeLayer(type, zeros.data(), zeros.data(), tokens, dim, buf.data());
    DecodeLayer(type, buf.data(), tokens, dim, kd.data(), vd.data());
    for (int64_t i = 0; i < tokens * dim; ++i) ASSERT_TRUE(kd[i] == 0.0f && vd[i] == 0.0f);
  }
}

TEST(KvCodecTest, EncodingIsDeterministicIncludingPadding) {
  const int64_t tokens = 7, dim = 96;  // padding after every part
  const std::vector<float> k = Random(tokens * dim, 5), v = Random(tokens * dim, 6);
  for (KvCodecType type : kTypes) {
    const int64_t bytes = CompressedLayerBytes(type, tokens, dim);
    Buffer a(bytes), b(bytes);
    std::fill(a.data(), a.data() + bytes, uint8_t{0xAB});
    std::fill(b.data(), b.data() + bytes, uint8_t{0x11});
    EncodeLayer(type, k.data(), v.data(), tokens, dim, a.data());
    EncodeLayer(type, k.data(), v.data(), tokens, dim, b.data());
    EXPECT_TRUE(std::equal(a.data(), a.data() + bytes, b.data())) << KvCodecName(type);
  }
}

TEST(KvCodecTest, PagesAreLayersBackToBack) {
  const int64_t tokens = 16, layers = 3, dim = 64, n = layers * tokens * dim;
  const std::vector<float> k = Random(n, 7), v = Random(n, 8);
  for (KvCodecType type : kTypes) {
    const int64_t layer_bytes = CompressedLayerBytes(type, tokens, dim);
    Buffer page(CompressedPageBytes(type, tokens, layers, dim));
    EncodePage(type, k.data(), v.data(), tokens, layers, dim, page.data());
    std::vector<float> kd(n), vd(n);
    DecodePage(type, page.data(), tokens, layers, dim, kd.data(), vd.data());
    for (int64_t layer = 0; layer < layers; ++layer) {
      Buffer one(layer_bytes);
      EncodeLayer(type, &k[layer * tokens * dim], &v[layer * tokens * dim], tokens, dim,
                  one.data());
      EXPECT_TRUE(
          std::equal(one.data(), one.data() + layer_bytes, page.data() + layer * layer_bytes));
      const ops::QuantKvLayerView view =
          PageLayerView(type, page.data(), tokens, layers, dim, layer);
      EXPECT_EQ(view.k_q, page.data() + layer * layer_bytes);
      std::vector<float> kv, vv;
      DecodeThroughView(view, kv, vv);
      EXPECT_TRUE(std::equal(kv.begin(), kv.end(), kd.begin() + layer * tokens * dim));
      EXPECT_TRUE(std::equal(vv.begin(), vv.end(), vd.begin() + layer * tokens * dim));
    }
  }
}

}  // namespace
}  // namespace kvl
