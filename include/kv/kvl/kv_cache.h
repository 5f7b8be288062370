// Where the forward pass keeps K and V. The forward pass sees only this interface. In the engine
// it is KvMemory's PagedKvCache (kvl/kv_manager.h): the paged pool, with the pages that left it
// reached through the pager; ContiguousKvCache below serves calibration, benchmarks and tests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/ops.h"  // ops::QuantKvLayerView
#include "kvl/status.h"

namespace kvl {

// Whether `type` is a block-quantized cache type (q8_0, q4_0, and their rotated forms q8_0r,
// q4_0r): rows are written quantized, one token at a time, and read by ops::DotRowsQuant /
// AxpyRowsQuant.
inline bool IsQuantKvType(DType type) {
  const DType format = StorageFormat(type);
  return format == DType::kQ8_0 || format == DType::kQ4_0;
}

// One layer's share of the pages a cache rebuilds from residual checkpoints in a forward run:
// `rows` tokens whose K and V of the layer are computed as extra rows of the run's own K and V
// projection matmuls (so the layer's weights stream from memory once for the step and the
// pages) and written to k_out / v_out, before the layer's attention reads them. The tokens and
// their count are the same at every layer of one run.
//  - input: the rows' layer input, [rows][dim] f32 (their residual checkpoints of this layer), or
//    nullptr at a layer without checkpoints, whose input the forward pass carried from the layer
//    before (`advance` was set there).
//  - advance: the next layer keeps no checkpoints, so this layer runs whole for these rows
//    (attention over their sequences, the FFN) as for a prefill chunk's, to give the next layer
//    its input. Every row they attend to at this layer must be readable in the cache by then:
//    earlier positions in the pool, streamed, or among this layer's rebuilt rows.
// Rebuilt rows are bit-identical to the ones the forward pass stored when the tokens were first
// run: the kernels are batch-invariant, and the rows go through the same operations.
struct KvLayerRebuild {
  int64_t rows = 0;
  const int64_t* positions = nullptr;  // [rows]
  const int32_t* seq_ids = nullptr;    // [rows] sequence slot of each row
  const float* input = nullptr;        // [rows][dim], or nullptr: carried
  bool advance = false;
  DType k_type = DType::kF32;
  void* k_out = nullptr;  // [rows][kv_dim] at k_type
  DType v_type = DType::kF32;
  void* v_out = nullptr;  // [rows][kv_dim] at v_type
};

class KvCache {
 public:
  // A run of consecutive positions [pos, pos + count) of one sequence and layer, in one of three
  // forms (the action lattice's fates of a page, as attention sees them):
  //  - kDense: rows at a fixed stride, K of position pos+i at k + i * stride elements, [kv_dim]
  //    each; K of element type `type`, V of `v_type` (f32 through k / v, the f16 / bf16 cache
  //    types through k_half / v_half, the q8_0 / q4_0 ones through k_q / v_q, whose row i starts
  //    RowBytes(type, i * stride) bytes in);
  //  - kCompressed: rows [first_row, first_row + count) of an int8 / int4 page layer, read by the
  //    fused-dequantization kernels (no decoded copy);
  //  - kDropped: evicted tokens; attention gives them no weight.
  struct Rows {
    enum class Kind { kDense, kCompressed, kDropped };
    Kind kind = Kind::kDense;
    DType type = DType::kF32;    // of K
    DType v_type = DType::kF32;  // of V
    float* k = nullptr;  // kDense, f32
    float* v = nullptr;
    int64_t count = 0;
    int64_t stride = 0;  // in elements
    uint16_t* k_half = nullptr;  // kDense, f16 / bf16
    uint16_t* v_half = nullptr;
    uint8_t* k_q = nullptr;  // kDense, q8_0 / q4_0 (blocks of 32 values, one scale each)
    uint8_t* v_q = nullptr;
    ops::QuantKvLayerView page;  // kCompressed
    int64_t first_row = 0;
  };

  virtual ~KvCache() = default;
  virtual int64_t kv_dim() const = 0;
  // Whether the cache holds K (V) rotated per head, as a rotated cache type (q8_0r, q4_0r) stores
  // rows: every row it hands out, in every form (dense, compressed, streamed), is then in that
  // basis, and the forward pass rotates Q to match the keys and each head's attention output
  // back from the values' basis.
  virtual bool keys_rotated() const { return false; }
  virtual bool values_rotated() const { return false; }
  virtual int64_t num_layers() const = 0;
  // Rows starting at `pos` (0 <= pos < capacity of the sequence, checked).
  virtual Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) = 0;

  // The residual-stream checkpoint of (seq, layer, pos): the layer's input, [dim] floats, from
  // which that token's K and V of the layer can be rebuilt exactly (one RmsNorm, two projections
  // and RoPE). nullptr when this cache keeps no checkpoints; the forward pass writes them when
  // the cache offers them.
  virtual float* ResidualAt(int32_t seq, int64_t layer, int64_t pos) { return nullptr; }

  // The forward pass calls this at the start of each layer, before it computes anything there:
  // a cache that streams pages from a slower tier has that layer's rows in place when it returns
  // (and fetches the next layer's meanwhile), and hands over the layer's rebuild work, which the
  // forward pass runs as extra rows of the layer's own K and V projections (KvLayerRebuild).
  virtual KvLayerRebuild BeginLayer(int64_t layer) { return {}; }

  // Per-position attention-mass accumulators of a sequence ([positions] floats), or nullptr when
  // the cache does not track attention. The forward pass adds, for each token that asks for
  // logits, its attention weights averaged over the layers and heads (a step adds 1 in all).
  virtual float* AttentionMass(int32_t seq) { return nullptr; }
};

// Rebuild work outside a forward run (a page restored at resume or promoted back between steps):
// each layer's rows, asked for in layer order.
class KvRebuildSource {
 public:
  virtual ~KvRebuildSource() = default;
  virtual KvLayerRebuild Layer(int64_t layer) = 0;
};

// What rebuilds pages' K and V from their residual checkpoints (the forward pass does), for
// caches that keep pages as checkpoints and rebuild them between steps. Inside a step the cache
// hands the rebuild to the forward pass's own run instead (KvCache::BeginLayer).
class KvRebuilder {
 public:
  virtual ~KvRebuilder() = default;
  // Runs `source`'s layers, in order, for its rows alone: their K and V written where each layer
  // says, the layers that advance attending over `kv` (which may be nullptr where none does).
  virtual void Rebuild(KvRebuildSource& source, KvCache* kv) = 0;
};

// One contiguous f32 buffer per sequence slot: [seq][layer][pos][kv_dim] for K and for V.
// Thread-safety: RowsAt may be called concurrently for disjoint rows.
class ContiguousKvCache final : public KvCache {
 public:
  // num_seqs slots of max_positions tokens each; with residual_dim > 0 it also keeps residual
  // checkpoints of that width. RESOURCE_EXHAUSTED when it would not fit.
  static StatusOr<std::unique_ptr<ContiguousKvCache>> Create(int64_t num_layers, int64_t kv_dim,
                                                             int32_t num_seqs,
                                                             int64_t max_positions,
                                                             int64_t residual_dim = 0);

  int64_t kv_dim() const override { return kv_dim_; }
  int64_t num_layers() const override { return num_layers_; }
  int64_t max_positions() const { return max_positions_; }
  int32_t num_seqs() const { return num_seqs_; }
  int64_t bytes() const { return static_cast<int64_t>(2 * k_.size() * sizeof(float)); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override;
  float* ResidualAt(int32_t seq, int64_t layer, int64_t pos) override;
  // Zeroes every K and V row of a sequence (tests of "no persistent KV": what remains must be
  // rebuilt from checkpoints before it is read).
  void ClearKv(int32_t seq);

 private:
  ContiguousKvCache(int64_t num_layers, int64_t kv_dim, int32_t num_seqs, int64_t max_positions,
                    int64_t residual_dim);
  size_t RowIndex(int32_t seq, int64_t layer, int64_t pos) const;

  int64_t num_layers_;
  int64_t kv_dim_;
  int32_t num_seqs_;
  int64_t max_positions_;
  std::vector<float> k_;  // [seq][layer][pos][kv_dim]
  std::vector<float> v_;  // [seq][layer][pos][kv_dim]
  int64_t residual_dim_;
  std::vector<float> residual_;  // [seq][layer][pos][residual_dim], empty when not kept
};

}  // namespace kvl
