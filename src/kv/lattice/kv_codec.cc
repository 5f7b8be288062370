// The KV page codec (format in kvl/kv_codec.h): scalar encode / decode. Encoding runs once per
// page when the policy compresses it, so it is plain C++; the hot path is the attention kernels in
// ops/, which read the codes without decoding.
#include "kvl/kv_codec.h"

#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvl/status.h"

namespace kvl {
namespace {

int64_t AlignUp64(int64_t n) { return (n + 63) & ~int64_t{63}; }

// Round to nearest, ties to even, inline (cvtss2si in the default rounding mode; nearbyintf is a
// library call on baseline x86-64).
int RoundToInt(float x) { return _mm_cvt_ss2si(_mm_set_ss(x)); }

int Clamp(int q, int lo, int hi) { return std::min(hi, std::max(lo, q)); }

// Symmetric int8 code of x for scale s (s == 0: code 0).
int8_t CodeInt8(float x, float s) {
  if (s == 0.0f) return 0;
  return static_cast<int8_t>(Clamp(RoundToInt(x / s), -127, 127));
}

// Asymmetric 4-bit code of x for (scale s, minimum m).
uint8_t CodeInt4(float x, float s, float m) {
  if (s == 0.0f) return 0;
  return static_cast<uint8_t>(Clamp(RoundToInt((x - m) / s), 0, 15));
}

void PutNibble(uint8_t* row, int64_t c, uint8_t code) {
  uint8_t& byte = row[c >> 1];
  byte = (c & 1) ? static_cast<uint8_t>((byte & 0x0F) | (code << 4))
                 : static_cast<uint8_t>((byte & 0xF0) | code);
}
int Nibble(const uint8_t* row, int64_t c) { return (row[c >> 1] >> ((c & 1) * 4)) & 0x0F; }

float* FloatsAt(uint8_t* base, int64_t offset) { return reinterpret_cast<float*>(base + offset); }
const float* FloatsAt(const uint8_t* base, int64_t offset) {
  return reinterpret_cast<const float*>(base + offset);
}

void CheckShape(KvCodecType type, int64_t block_tokens, int64_t kv_dim) {
  KVL_CHECK_MSG(type == KvCodecType::kInt8 || type == KvCodecType::kInt4, "unknown KV codec type");
  KVL_CHECK_MSG(block_tokens > 0 && kv_dim > 0, "KV codec: block_tokens and kv_dim must be > 0");
  KVL_CHECK_MSG(type != KvCodecType::kInt4 || kv_dim % 2 == 0,
                "KV codec: int4 needs an even kv_dim");
}

// Keys, per channel over the page's tokens.
void EncodeKeys(KvCodecType type, const float* k, int64_t tokens, int64_t dim,
                const KvCodecLayerLayout& l, uint8_t* out) {
  float* scale = FloatsAt(out, l.k_scale);
  uint8_t* codes = out + l.k_q;
  if (type == KvCodecType::kInt8) {
    std::fill(scale, scale + dim, 0.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t c = 0; c < dim; ++c) scale[c] = std::max(scale[c], std::fabs(k[t * dim + c]));
    }
    for (int64_t c = 0; c < dim; ++c) scale[c] /= 127.0f;
    for (int64_t t = 0; t < tokens; ++t) {
      auto* row = reinterpret_cast<int8_t*>(codes + t * l.row_bytes);
      for (int64_t c = 0; c < dim; ++c) row[c] = CodeInt8(k[t * dim + c], scale[c]);
    }
    return;
  }
  // int4: scale holds the running maximum until the ranges are known.
  float* min = FloatsAt(out, l.k_min);
  std::copy(k, k + dim, min);
  std::copy(k, k + dim, scale);
  for (int64_t t = 1; t < tokens; ++t) {
    for (int64_t c = 0; c < dim; ++c) {
      min[c] = std::min(min[c], k[t * dim + c]);
      scale[c] = std::max(scale[c], k[t * dim + c]);
    }
  }
  for (int64_t c = 0; c < dim; ++c) scale[c] = (scale[c] - min[c]) / 15.0f;
  for (int64_t t = 0; t < tokens; ++t) {
    uint8_t* row = codes + t * l.row_bytes;
    for (int64_t c = 0; c < dim; ++c) PutNibble(row, c, CodeInt4(k[t * dim + c], scale[c], min[c]));
  }
}

// Values, per (token, group of v_group channels).
void EncodeValues(KvCodecType type, const float* v, int64_t tokens, int64_t dim,
                  const KvCodecLayerLayout& l, uint8_t* out) {
  float* scale = FloatsAt(out, l.v_scale);
  for (int64_t t = 0; t < tokens; ++t) {
    uint8_t* row = out + l.v_q + t * l.row_bytes;
    for (int64_t g = 0; g < l.v_groups; ++g) {
      const float* x = v + t * dim + g * l.v_group;
      const int64_t c0 = g * l.v_group;
      if (type == KvCodecType::kInt8) {
        float amax = 0.0f;
        for (int64_t j = 0; j < l.v_group; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float s = amax / 127.0f;
        scale[t * l.v_groups + g] = s;
        for (int64_t j = 0; j < l.v_group; ++j) {
          row[c0 + j] = static_cast<uint8_t>(CodeInt8(x[j], s));
        }
      } else {
        float lo = x[0], hi = x[0];
        for (int64_t j = 1; j < l.v_group; ++j) {
          lo = std::min(lo, x[j]);
          hi = std::max(hi, x[j]);
        }
        const float s = (hi - lo) / 15.0f;
        scale[t * l.v_groups + g] = s;
        FloatsAt(out, l.v_min)[t * l.v_groups + g] = lo;
        for (int64_t j = 0; j < l.v_group; ++j) PutNibble(row, c0 + j, CodeInt4(x[j], s, lo));
      }
    }
  }
}

}  // namespace

std::string_view KvCodecName(KvCodecType type) {
  return type == KvCodecType::kInt4 ? "int4" : "int8";
}

int64_t KvValueGroupSize(int64_t kv_dim) { return kv_dim % 32 == 0 ? 32 : kv_dim; }

KvCodecLayerLayout CompressedLayerLayout(KvCodecType type, int64_t block_tokens, int64_t kv_dim) {
  CheckShape(type, block_tokens, kv_dim);
  const bool int4 = type == KvCodecType::kInt4;
  KvCodecLayerLayout l;
  l.row_bytes = int4 ? kv_dim / 2 : kv_dim;
  l.v_group = KvValueGroupSize(kv_dim);
  l.v_groups = kv_dim / l.v_group;
  const int64_t codes = AlignUp64(block_tokens * l.row_bytes);
  const int64_t k_params = AlignUp64(kv_dim * static_cast<int64_t>(sizeof(float)));
  const int64_t v_params =
      AlignUp64(block_tokens * l.v_groups * static_cast<int64_t>(sizeof(float)));
  int64_t at = 0;
  l.k_q = at;
  at += codes;
  l.k_scale = at;
  at += k_params;
  if (int4) {
    l.k_min = at;
    at += k_params;
  }
  l.v_q = at;
  at += codes;
  l.v_scale = at;
  at += v_params;
  if (int4) {
    l.v_min = at;
    at += v_params;
  }
  l.bytes = at;
  return l;
}

int64_t CompressedLayerBytes(KvCodecType type, int64_t block_tokens, int64_t kv_dim) {
  return CompressedLayerLayout(type, block_tokens, kv_dim).bytes;
}

int64_t CompressedPageBytes(KvCodecType type, int64_t block_tokens, int64_t num_layers,
                            int64_t kv_dim) {
  KVL_CHECK(num_layers > 0);
  return num_layers * CompressedLayerBytes(type, block_tokens, kv_dim);
}

void EncodeLayer(KvCodecType type, const float* k, const float* v, int64_t block_tokens,
                 int64_t kv_dim, uint8_t* out) {
  const KvCodecLayerLayout l = CompressedLayerLayout(type, block_tokens, kv_dim);
  KVL_CHECK(k != nullptr && v != nullptr && out != nullptr);
  KVL_CHECK_MSG(reinterpret_cast<uintptr_t>(out) % alignof(float) == 0,
                "EncodeLayer: out must be float-aligned");
  std::memset(out, 0, static_cast<size_t>(l.bytes));  // padding too: equal pages, equal bytes
  EncodeKeys(type, k, block_tokens, kv_dim, l, out);
  EncodeValues(type, v, block_tokens, kv_dim, l, out);
}

void DecodeLayer(KvCodecType type, const uint8_t* in, int64_t block_tokens, int64_t kv_dim,
                 float* k, float* v) {
  KVL_CHECK(in != nullptr && k != nullptr && v != nullptr);
  const ops::QuantKvLayerView p = LayerView(type, in, block_tokens, kv_dim);
  for (int64_t t = 0; t < block_tokens; ++t) {
    const uint8_t* krow = p.k_q + t * p.row_bytes;
    const uint8_t* vrow = p.v_q + t * p.row_bytes;
    const float* vs = p.v_scale + t * p.v_groups;
    for (int64_t c = 0; c < kv_dim; ++c) {
      const int64_t g = c / p.v_group;
      if (p.bits == 8) {
        k[t * kv_dim + c] = p.k_scale[c] * static_cast<float>(static_cast<int8_t>(krow[c]));
        v[t * kv_dim + c] = vs[g] * static_cast<float>(static_cast<int8_t>(vrow[c]));
      } else {
        const float kn = static_cast<float>(Nibble(krow, c));
        const float vn = static_cast<float>(Nibble(vrow, c));
        k[t * kv_dim + c] = p.k_scale[c] * kn + p.k_min[c];
        v[t * kv_dim + c] = vs[g] * vn + p.v_min[t * p.v_groups + g];
      }
    }
  }
}

void EncodePage(KvCodecType type, const float* k, const float* v, int64_t block_tokens,
                int64_t num_layers, int64_t kv_dim, uint8_t* out) {
  const int64_t layer_bytes = CompressedLayerBytes(type, block_tokens, kv_dim);
  const int64_t layer_floats = block_tokens * kv_dim;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    EncodeLayer(type, k + layer * layer_floats, v + layer * layer_floats, block_tokens, kv_dim,
                out + layer * layer_bytes);
  }
}

void DecodePage(KvCodecType type, const uint8_t* in, int64_t block_tokens, int64_t num_layers,
                int64_t kv_dim, float* k, float* v) {
  const int64_t layer_bytes = CompressedLayerBytes(type, block_tokens, kv_dim);
  const int64_t layer_floats = block_tokens * kv_dim;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    DecodeLayer(type, in + layer * layer_bytes, block_tokens, kv_dim, k + layer * layer_floats,
                v + layer * layer_floats);
  }
}

ops::QuantKvLayerView LayerView(KvCodecType type, const uint8_t* layer_bytes, int64_t block_tokens,
                                int64_t kv_dim) {
  const KvCodecLayerLayout l = CompressedLayerLayout(type, block_tokens, kv_dim);
  KVL_CHECK(layer_bytes != nullptr);
  KVL_CHECK_MSG(reinterpret_cast<uintptr_t>(layer_bytes) % alignof(float) == 0,
                "LayerView: a compressed layer must be float-aligned");
  ops::QuantKvLayerView p;
  p.bits = static_cast<int32_t>(type);
  p.rows = block_tokens;
  p.kv_dim = kv_dim;
  p.row_bytes = l.row_bytes;
  p.k_q = layer_bytes + l.k_q;
  p.k_scale = FloatsAt(layer_bytes, l.k_scale);
  p.k_min = l.k_min >= 0 ? FloatsAt(layer_bytes, l.k_min) : nullptr;
  p.v_q = layer_bytes + l.v_q;
  p.v_group = l.v_group;
  p.v_groups = l.v_groups;
  p.v_scale = FloatsAt(layer_bytes, l.v_scale);
  p.v_min = l.v_min >= 0 ? FloatsAt(layer_bytes, l.v_min) : nullptr;
  return p;
}

ops::QuantKvLayerView PageLayerView(KvCodecType type, const uint8_t* page, int64_t block_tokens,
                                    int64_t num_layers, int64_t kv_dim, int64_t layer) {
  KVL_CHECK(layer >= 0 && layer < num_layers);
  return LayerView(type, page + layer * CompressedLayerBytes(type, block_tokens, kv_dim),
                   block_tokens, kv_dim);
}

}  // namespace kvl
