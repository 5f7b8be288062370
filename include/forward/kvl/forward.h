// The transformer forward pass over a batch of tokens that may belong to several sequences, for
// llama's block and what qwen2, qwen3, gemma2, gemma3 and phi3 add to it (ModelConfig::arch), and
// the Mixture-of-Experts FFN of qwen3moe and Mixtral-style llama files (ModelConfig::moe).
// One call = one step: embeddings, then per layer attention and a gated FFN (SwiGLU or GeGLU),
// then logits for the tokens that asked for them. K and V of every token in the batch are written
// into the KvCache before attention reads it, so a prefill chunk attends to itself causally; a
// local (sliding-window) layer's token attends only to its window; rows the cache no longer holds
// (a paged cache releases local layers' rows older than every window: kvl/kv_window_release.h)
// read as dropped, which the window's mask had excluded anyway.
//
// The pages a cache rebuilds from residual checkpoints are rows of the same run (KvCache::
// BeginLayer hands over each layer's): extra rows of each layer's K and V projections, and, where
// the next layer keeps no checkpoint, extra rows of the whole layer, so the forward pass never
// runs a batch of its own inside a step.
//
// Thread-safety: a Forward belongs to one step loop. It preallocates every activation buffer for
// its largest batch and max_rebuild_rows rebuilt rows; Run never allocates, but for the
// attention-mass scratch, sized once for max_logit_rows at the first Run whose cache tracks
// attention mass, and for rows past what was reserved (more rebuilt rows than max_rebuild_rows,
// or rebuilt rows that run whole layers: checkpoints every s > 1 layers), grown once to the most
// seen.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "kvl/kv_cache.h"
#include "kvl/model.h"
#include "kvl/ops.h"

namespace kvl {

// OK when the model can run with a KV cache of (k_type, v_type). A rotated type (q8_0r, q4_0r)
// rotates each head with a Walsh-Hadamard transform and quantizes the head to whole blocks of
// 32, so it needs head_dim a power of two from 32 to ops::kMaxQuantHeadDim; INVALID_ARGUMENT
// naming the type and the model's head_dim otherwise.
Status CheckKvCacheTypes(const ModelConfig& config, DType k_type, DType v_type);

struct ForwardOptions {
  int64_t max_batch_tokens = 512;  // tokens per Run (a longer prompt is run in chunks)
  int64_t max_logit_rows = 64;     // tokens per Run that may ask for logits
  int64_t max_context = 2048;      // longest sequence attention must cover
  // Rows a run may rebuild for its cache (KvLayerRebuild) beside its tokens: the engine passes
  // the pager's staging capacity in tokens.
  int64_t max_rebuild_rows = 0;
};

// The tokens of one step. All vectors have the same length (n_tokens).
struct TokenBatch {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;  // position of each token in its sequence
  std::vector<int32_t> seq_ids;    // KvCache sequence slot of each token
  std::vector<bool> want_logits;   // logits rows come out in batch order of these
  // [token] true: run only to rebuild its sequence's sliding-window layers' K/V
  // (kvl/kv_window_release.h): its global layers' K/V and its checkpoints are in the cache
  // already, exact, and are neither written nor replaced; it asks for no logits.
  std::vector<bool> window_rebuild;

  void Clear();
  void Add(int32_t token, int64_t position, int32_t seq_id, bool logits);
  void AddWindowRebuild(int32_t token, int64_t position, int32_t seq_id);
  bool rebuilds_window(int64_t t) const {
    return static_cast<size_t>(t) < window_rebuild.size() && window_rebuild[static_cast<size_t>(t)];
  }
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

class MoeFeedForward;  // src/forward/moe_ffn.h

// What a Mixture-of-Experts model's experts ran in a Forward, summed since its construction: one
// run is one expert's GEMM (gate/up, SwiGLU, down) over the rows of a layer that chose it.
struct ExpertRunTotals {
  int64_t runs = 0;
  int64_t rows = 0;  // tokens x top-k, summed over runs
};

class Forward final : public KvRebuilder {
 public:
  Forward(const Model& model, ops::OpsContext& ops, const ForwardOptions& options);
  ~Forward() override;

  // Runs one step. Token ids and positions must be valid (checked: the engine validates user
  // input before it gets here). Afterwards logits(i) is the i-th row that asked for logits. The
  // cache's rebuild work (KvCache::BeginLayer) runs inside the step, as extra rows.
  void Run(const TokenBatch& batch, KvCache& kv);

  // KvRebuilder: `source`'s rows alone through every layer (pages restored between steps), by the
  // same code as a step's rebuilt rows.
  void Rebuild(KvRebuildSource& source, KvCache* kv) override;

  // Rebuilds the K and V of every token of `batch` (sequence, position; token ids and logits flags
  // are ignored) on every layer from the residual checkpoints the cache holds, and writes them
  // into the cache. With the batch-invariant kernels the rebuilt rows are bit-identical to the
  // ones Run computed ("KV direct"): per layer one RmsNorm, the K and V projections and RoPE.
  void RebuildKvFromResiduals(const TokenBatch& batch, KvCache& kv);

  // K and V of `n` tokens on one layer, rebuilt from their checkpoints (checkpoints: [n][dim] f32,
  // positions: [n]) exactly as Run computed and stored them, written as [n][kv_dim] rows of
  // k_type / v_type (f32, f16, bf16, q8_0 or q4_0) to k_out / v_out. A rebuild on its own,
  // outside any step (never called while Run is inside a layer): what calibration and the
  // frontier bench time as the separate price of one layer's rebuild.
  void RebuildLayerKv(int64_t layer, const float* checkpoints, const int64_t* positions, int64_t n,
                      DType k_type, void* k_out, DType v_type, void* v_out);

  // Q of `n` tokens on one layer from their checkpoints (as RebuildLayerKv takes them): what the
  // layer's attention takes as queries, after RoPE (and the query scale of the models that scale
  // Q), in the model's own basis (never rotated), as [n][q_dim] floats to q_out. Outside any step;
  // `kvl bench quality` measures the q.k error of each cache type with it.
  void LayerQueries(int64_t layer, const float* checkpoints, const int64_t* positions, int64_t n,
                    float* q_out);

  const float* logits(int64_t row) const;  // [vocab]
  // Milliseconds the last Run spent on its logits (the final norm and the output matmul): the
  // part of an engine's decode step that the calibrated step, which asks for no logits, leaves
  // out (the engine adds it back to measure rebuilds in the step against the calibrated one).
  double last_logits_ms() const { return last_logits_ms_; }
  int64_t num_logit_rows() const { return num_logit_rows_; }
  const ForwardOptions& options() const { return options_; }
  // Zero for a dense model.
  ExpertRunTotals expert_run_totals() const;
  // The scratch one token's row of a run holds (its activations at full width and the quantized
  // copy the int8 matmuls read): what each row of max_batch_tokens costs resident, so that an
  // engine held to a memory budget can choose its step's rows (kvl/engine.h).
  static int64_t ScratchBytesPerRow(const ModelConfig& c);
  // The activations this pass holds now (reserved for max_batch_tokens rows and the rebuilt
  // rows, grown only by a run with more): what ScratchBytesPerRow is checked against.
  int64_t activation_bytes() const;
  // The weights repacked at construction for the ISA's int8 GEMM (ops::PackMatrix): their bytes
  // (0 where the ISA keeps the stored layout) and the seconds packing took.
  size_t packed_bytes() const { return packed_bytes_; }
  double pack_seconds() const { return pack_seconds_; }

 private:
  // The activations of one run: `rows` rows get K and V (the step's tokens, then the rebuilt
  // ones), the first `full_rows` of them run the whole layer (x, q, attn, proj, gate, up).
  struct Activations {
    // Grows to at least n rows and n_full full rows, keeping the contents.
    void Reserve(const ModelConfig& c, int64_t n, int64_t n_full);
    int64_t rows = 0;
    int64_t full_rows = 0;
    std::vector<float> x;         // [tokens][dim] residual stream
    std::vector<float> xn;        // [tokens][dim] normalized input of the current sublayer
    std::vector<float> q;         // [tokens][q_dim]
    std::vector<float> k;         // [tokens][kv_dim]
    std::vector<float> v;         // [tokens][kv_dim]
    std::vector<float> attn;      // [tokens][q_dim] attention output before Wo
    std::vector<float> proj;      // [tokens][dim] output of Wo or W_down
    std::vector<float> gate;      // [tokens][ffn_dim]
    std::vector<float> up;        // [tokens][ffn_dim]
    std::vector<float> rope_cos;  // [tokens][head_dim/2] global layers' angles
    std::vector<float> rope_sin;  // [tokens][head_dim/2]
    std::vector<float> rope_cos_local;  // [tokens][head_dim/2] local layers' (where they differ)
    std::vector<float> rope_sin_local;  // [tokens][head_dim/2]
  };
  // One layer kind's RoPE: angle_i = freq_scale * p * base^(-2i/rope_dim) / factors[i], computed
  // in float as ggml does (the power by repeated products), cos and sin times attn_factor.
  struct RopeParams {
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    float attn_factor = 1.0f;
    const float* factors = nullptr;  // [head_dim/2] or null
  };

  void Embed(const TokenBatch& batch);
  void ComputeRopeAngles(const TokenBatch& batch, Activations& a);
  void AnglesFor(int64_t position, const RopeParams& rope, float* cos, float* sin) const;
  const RopeParams& RopeOf(int64_t layer) const {
    return config_.IsLocal(layer) ? rope_local_ : rope_global_;
  }
  // K and V of one token as the cache stores them: biases, the per-head K norm, RoPE on K.
  void FinishKv(const LayerWeights& w, float* k, float* v, const float* cos,
                const float* sin) const;
  // Q of one token before attention: bias, per-head norm, RoPE, and the scale where llama.cpp
  // scales Q rather than the scores.
  void FinishQ(const LayerWeights& w, float* q, const float* cos, const float* sin) const;
  // Tokens of one attention work item: batch tokens [first_token, first_token + num_tokens), of
  // one sequence at consecutive positions.
  struct AttentionBlock {
    int64_t first_token;
    int64_t num_tokens;
  };
  // One thread's attention scratch, sized at construction for one tile and one work item.
  struct AttentionScratch {
    void Allocate(int64_t tile_tokens, int64_t head_dim, int64_t rows);
    std::vector<float> kt_storage;
    float* kt = nullptr;             // [head_dim][tile] packed keys (ops::PackAttentionKeys)
    std::vector<float> k_stage;      // [tile][head_dim] keys dequantized before packing
    std::vector<float> v_stage;      // [tile][head_dim] values widened or dequantized
    std::vector<const float*> v_rows;  // [tile] the values the tile's rows read
    std::vector<int64_t> tile_pos;   // [tile] the position of each gathered row
    std::vector<const float*> q_rows;  // [rows]
    std::vector<float*> acc_rows;      // [rows] into attn_
    std::vector<float> m, l;           // [rows] online-softmax state
    std::vector<float*> score_rows;    // [rows] into tile_scores, or null (no mass tracked)
    std::vector<float> tile_scores;    // [rows][tile]
  };

  // Room for `rows` rows of which `full_rows` run whole layers (activations, quantized inputs,
  // attention work items, the rows' batch).
  void ReserveRows(int64_t rows, int64_t full_rows);
  // Every layer for the step's tokens (`batch`, may be empty) and the rebuilt rows that the cache
  // (source == nullptr) or `source` hands over at each layer.
  void RunLayers(const TokenBatch& batch, KvCache* kv, KvRebuildSource* source);
  // rows_batch_ and the RoPE angles of the run's rows, at its first layer.
  void PlanRows(const TokenBatch& batch, const KvLayerRebuild& rebuild);
  void RunLayer(int64_t layer, const TokenBatch& batch, KvCache* kv, const KvLayerRebuild& rebuild);
  void StoreKv(int64_t layer, const TokenBatch& rows, int64_t n, KvCache* kv,
               const KvLayerRebuild& rebuild);
  void Attention(int64_t layer, const TokenBatch& batch, KvCache& kv, Activations& a);
  void PlanAttentionBlocks(const TokenBatch& batch);
  int64_t GatherTile(int64_t layer, int32_t seq, int64_t kv_head, int64_t begin, int64_t end,
                     KvCache& kv, AttentionScratch& s) const;
  void PrefetchTile(int64_t layer, int32_t seq, int64_t kv_head, int64_t begin, int64_t end,
                    KvCache& kv) const;
  // mass_rows: per batch token its row of mass_scratch_ or -1; nullptr: no token feeds mass.
  void AttendBlock(int64_t layer, const TokenBatch& batch, const AttentionBlock& block,
                   int64_t kv_head, KvCache& kv, AttentionScratch& s, Activations& a,
                   const int64_t* mass_rows);
  // Runs the query rows [r0, r0 + num_rows) of a block over the first `visible` gathered rows of
  // the thread's tile, copying their scores into the mass scratch where tracked.
  void AttendRows(const TokenBatch& batch, const AttentionBlock& block, int64_t kv_head,
                  AttentionScratch& s, int64_t r0, int64_t num_rows, int64_t visible,
                  float scale, float softcap, const int64_t* mass_rows, bool any_mass);
  void GrowContextScratch(int64_t positions);
  void PlanAttentionMass(const TokenBatch& batch, KvCache& kv);
  void StoreRow(const float* row, DType type, void* out) const;
  void AccumulateAttentionMass(const TokenBatch& batch, KvCache& kv);
  void FeedForward(const LayerWeights& w, int64_t n, Activations& a);
  // x += post_norm(proj) (Gemma's post-attention / post-FFN norms), or x += proj.
  void AddResidual(const float* post_norm, int64_t n, Activations& a);
  void MatMulShared(std::initializer_list<const MatrixView*> ws, const float* x, int64_t n,
                    std::initializer_list<float*> ys);
  void Logits(const TokenBatch& batch);

  // Repacks every projection and the output matrix for ops_'s ISA (see packed_bytes()).
  void PackWeights();

  const Model& model_;
  const ModelConfig& config_;
  ops::OpsContext& ops_;
  ForwardOptions options_;
  // The weights the matmuls read: the model's views, with Q8_0 / Q4_0 ones replaced by packed
  // copies where the ISA has a packed kernel. The packed copies replace the mmapped originals
  // (which Forward no longer reads) rather than adding to them; the token embedding stays in the
  // file, read a row at a time.
  std::vector<ops::PackedMatrix> packed_;
  std::vector<LayerWeights> layers_;  // [layer]
  MatrixView output_;                 // [vocab][dim]
  // The experts' FFN of an MoE model (null for a dense one). Its experts stay in the mapped file,
  // unpacked: an MoE file is mostly experts (17 of Qwen3-30B-A3B's 18 GB at Q4_K_M), which a
  // packed copy would move out of the page cache into anonymous memory.
  std::unique_ptr<MoeFeedForward> moe_;
  size_t packed_bytes_ = 0;
  double pack_seconds_ = 0.0;

  // Sized for max_batch_tokens + max_rebuild_rows rows, max_batch_tokens of them full.
  Activations act_;
  // The run's rows where it rebuilds any: the step's tokens, then the rebuilt rows (reserved).
  TokenBatch rows_batch_;
  const TokenBatch empty_batch_;  // Rebuild's step tokens: none
  RopeParams rope_global_;  // every layer's, or the global layers' where local ones differ
  RopeParams rope_local_;   // the sliding-window layers'
  bool local_rope_differs_ = false;
  std::vector<float> rebuild_cos_;  // RebuildLayerKv's own RoPE angles (Run's stay intact)
  std::vector<float> rebuild_sin_;
  // Per-position scratch is sized for context_capacity_ positions, the longest sequence seen so
  // far (at least min(max_context, 4096)), not for max_context: -c bounds it, the tokens really
  // attended to size it, so a huge -c reserves nothing up front. Grown by doubling.
  int64_t context_capacity_ = 0;
  int64_t attn_tile_tokens_ = 0;   // positions per K/V tile (ops::AttentionTileTokens)
  int64_t attn_block_tokens_ = 0;  // consecutive positions per attention work item, at most
  std::vector<AttentionBlock> attn_blocks_;        // this Run's work items, reserved per token
  std::vector<AttentionScratch> attn_scratch_;     // [threads]
  std::vector<float> logit_in_;  // [max_logit_rows][dim]
  // Attention weights of the tokens whose cache tracks attention mass,
  // [max_logit_rows][head][context_capacity_]; sized at the first use.
  std::vector<float> mass_scratch_;
  std::vector<int64_t> mass_row_of_token_;  // [tokens]: row in mass_scratch_, or -1
  int64_t num_mass_rows_ = 0;               // tokens of this Run that feed attention mass
  std::vector<float> logits_;    // [max_logit_rows][vocab]
  double last_logits_ms_ = 0;
  int64_t num_logit_rows_ = 0;
};

}  // namespace kvl
