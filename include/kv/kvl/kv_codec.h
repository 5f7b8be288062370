// The KV page codec: the "compress" action's int8 / int4 formats (KIVI: keys quantized per
// channel, values per token). A page is compressed layer by layer; attention reads the compressed
// layers directly through ops::DotRowsK / ops::AxpyRowsV (no decoded copy), and DecodeLayer is the
// reference dequantization, for tests and for promoting a page back to f32.
//
// Why per channel for K and per token for V: key outliers sit in a few fixed channels (a per-token
// scale would be set by them and crush every other channel), while value errors mix across
// channels in the weighted sum, so a per-token group scale tracks them best (KIVI, KVQuant).
//
// Layout of one compressed layer, every part starting on a 64-byte boundary from the layer start
// (T = block_tokens, D = kv_dim, R = row bytes = D for int8, D / 2 for int4, G = D / group):
//   k_q      [T][R]   uint8  key codes, a token's row contiguous
//   k_scale  [D]      float  per-channel key scale
//   k_min    [D]      float  per-channel key minimum (int4 only)
//   v_q      [T][R]   uint8  value codes
//   v_scale  [T][G]   float  per-(token, group) value scale
//   v_min    [T][G]   float  per-(token, group) value minimum (int4 only)
// A page is num_layers such layers back to back: [num_layers][CompressedLayerBytes].
// int4 packs two codes per byte: channel 2j in the low nibble, channel 2j + 1 in the high one.
// Codes and dequantization:
//   int8 keys:   scale_c = max_t |K[t][c]| / 127, q = round(K / scale_c) in [-127, 127],
//                K' = scale_c * q
//   int4 keys:   scale_c = (max_t K - min_t K) / 15, q = round((K - min_c) / scale_c) in [0, 15],
//                K' = scale_c * q + min_c
//   int8 values: per (token, group of 32 channels) scale = max |V| / 127, as for keys
//   int4 values: per (token, group) scale = (max - min) / 15 and min, as for keys
// Values are grouped by 32 channels when kv_dim % 32 == 0, else the whole row is one group.
// A zero scale (an all-zero, or for int4 constant, channel or group) gives code 0 and decodes to
// exactly 0 (int8) or min (int4): never a NaN. Rounding is to nearest, ties to even.
// Worst-case error per element: scale / 2, i.e. max|x| / 254 (int8), (max - min) / 30 (int4).
//
// Pages are meant to be full blocks (only full blocks are immutable); a partial block can be
// encoded too, but its unused rows then take part in the per-channel key ranges.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string_view>

#include "kvl/ops.h"  // ops::QuantKvLayerView: the kernels' view of a compressed layer

namespace kvl {

enum class KvCodecType : int32_t { kInt8 = 8, kInt4 = 4 };

std::string_view KvCodecName(KvCodecType type);  // "int8" / "int4"

// Value quantization group size for kv_dim channels: 32, or kv_dim when kv_dim % 32 != 0.
int64_t KvValueGroupSize(int64_t kv_dim);

// Byte offsets of the parts of one compressed layer (see the layout above); k_min / v_min are -1
// for int8.
struct KvCodecLayerLayout {
  int64_t row_bytes = 0;
  int64_t v_group = 0;
  int64_t v_groups = 0;
  int64_t k_q = 0, k_scale = 0, k_min = -1;
  int64_t v_q = 0, v_scale = 0, v_min = -1;
  int64_t bytes = 0;  // the whole layer, a multiple of 64
};

// Requirements: block_tokens > 0, kv_dim > 0, and kv_dim even for int4.
KvCodecLayerLayout CompressedLayerLayout(KvCodecType type, int64_t block_tokens, int64_t kv_dim);
int64_t CompressedLayerBytes(KvCodecType type, int64_t block_tokens, int64_t kv_dim);
int64_t CompressedPageBytes(KvCodecType type, int64_t block_tokens, int64_t num_layers,
                            int64_t kv_dim);

// k, v: [block_tokens][kv_dim] f32 (one layer of a KvBlockStorage block); out:
// CompressedLayerBytes bytes, float-aligned (64-aligned for the best kernel loads). Every byte of
// out is written (padding as zeros), so equal inputs give equal bytes.
void EncodeLayer(KvCodecType type, const float* k, const float* v, int64_t block_tokens,
                 int64_t kv_dim, uint8_t* out);
// The reference dequantization of EncodeLayer's output into k, v: [block_tokens][kv_dim].
void DecodeLayer(KvCodecType type, const uint8_t* in, int64_t block_tokens, int64_t kv_dim,
                 float* k, float* v);

// Whole pages: k, v are [num_layers][block_tokens][kv_dim] (KvBlockStorage's order within a
// block); out / in hold CompressedPageBytes bytes.
void EncodePage(KvCodecType type, const float* k, const float* v, int64_t block_tokens,
                int64_t num_layers, int64_t kv_dim, uint8_t* out);
void DecodePage(KvCodecType type, const uint8_t* in, int64_t block_tokens, int64_t num_layers,
                int64_t kv_dim, float* k, float* v);

// Where the parts of a compressed layer are: `layer_bytes` points at one layer (EncodeLayer's
// out); PageLayerView finds layer `layer` of a whole page.
ops::QuantKvLayerView LayerView(KvCodecType type, const uint8_t* layer_bytes, int64_t block_tokens,
                                int64_t kv_dim);
ops::QuantKvLayerView PageLayerView(KvCodecType type, const uint8_t* page, int64_t block_tokens,
                                    int64_t num_layers, int64_t kv_dim, int64_t layer);

}  // namespace kvl
