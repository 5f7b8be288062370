#include "kvl/forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "for_each_row.h"
#include "kvl/quant.h"
#include "moe_ffn.h"

namespace kvl {

// Positions of per-position scratch reserved up front (see Forward::context_capacity_).
constexpr int64_t kInitialContextCapacity = 4096;
// Query rows an attention work item aims for (the GQA group's heads x consecutive positions of a
// prompt): enough that packing a tile's keys costs little per row, few enough that a prompt
// chunk still makes many items for the threads.
constexpr int64_t kAttentionRowsPerItem = 64;

void Forward::AttentionScratch::Allocate(int64_t tile_tokens, int64_t head_dim, int64_t rows) {
  // 64-byte alignment for the packed keys, which the kernels load whole vectors of.
  kt_storage.assign(static_cast<size_t>(ops::kAttentionTileFloats + 16), 0.0f);
  const auto addr = reinterpret_cast<uintptr_t>(kt_storage.data());
  kt = reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
  k_stage.resize(static_cast<size_t>(tile_tokens * head_dim));
  v_stage.resize(static_cast<size_t>(tile_tokens * head_dim));
  v_rows.resize(static_cast<size_t>(tile_tokens));
  tile_pos.resize(static_cast<size_t>(tile_tokens));
  q_rows.resize(static_cast<size_t>(rows));
  acc_rows.resize(static_cast<size_t>(rows));
  m.resize(static_cast<size_t>(rows));
  l.resize(static_cast<size_t>(rows));
  score_rows.resize(static_cast<size_t>(rows));
  tile_scores.resize(static_cast<size_t>(rows * tile_tokens));
}

void Forward::Activations::Reserve(const ModelConfig& c, int64_t n, int64_t n_full) {
  // Grown, never shrunk: a run's rows keep their contents (Run embeds before it learns the rows
  // the cache rebuilds).
  const auto grow = [](std::vector<float>& v, int64_t row_count, int64_t width) {
    const size_t size = static_cast<size_t>(row_count * width);
    if (v.size() < size) v.resize(size);
  };
  rows = std::max(rows, n);
  full_rows = std::max(full_rows, n_full);
  grow(x, full_rows, c.dim);
  grow(xn, rows, c.dim);
  grow(q, full_rows, c.q_dim());
  grow(k, rows, c.kv_dim());
  grow(v, rows, c.kv_dim());
  grow(attn, full_rows, c.q_dim());
  grow(proj, full_rows, c.dim);
  grow(gate, full_rows, c.ffn_dim);
  grow(up, full_rows, c.ffn_dim);
  for (std::vector<float>* angles : {&rope_cos, &rope_sin, &rope_cos_local, &rope_sin_local}) {
    grow(*angles, rows, c.head_dim / 2);
  }
}

int64_t Forward::ScratchBytesPerRow(const ModelConfig& c) {
  // Activations::Reserve's vectors for one full row, then ops::OpsContext::Reserve's int8 row
  // (one byte a column and a scale a block, at the widest input a matmul reads).
  const int64_t floats = 3 * c.dim + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_dim +
                         4 * (c.head_dim / 2);
  const int64_t widest = std::max({c.dim, c.q_dim(), c.ffn_dim});
  return floats * static_cast<int64_t>(sizeof(float)) + widest + widest / 8 +
         MoeFeedForward::ScratchBytesPerRow(c);
}

int64_t Forward::activation_bytes() const {
  const Activations& a = act_;
  size_t floats = 0;
  for (const std::vector<float>* v : {&a.x, &a.xn, &a.q, &a.k, &a.v, &a.attn, &a.proj, &a.gate,
                                      &a.up, &a.rope_cos, &a.rope_sin, &a.rope_cos_local,
                                      &a.rope_sin_local}) {
    floats += v->capacity();
  }
  return static_cast<int64_t>(floats * sizeof(float)) + (moe_ ? moe_->scratch_bytes() : 0);
}

ExpertRunTotals Forward::expert_run_totals() const {
  return moe_ ? moe_->counts() : ExpertRunTotals{};
}

void TokenBatch::Clear() {
  tokens.clear();
  positions.clear();
  seq_ids.clear();
  want_logits.clear();
  window_rebuild.clear();
}

void TokenBatch::Add(int32_t token, int64_t position, int32_t seq_id, bool logits) {
  tokens.push_back(token);
  positions.push_back(position);
  seq_ids.push_back(seq_id);
  want_logits.push_back(logits);
  window_rebuild.push_back(false);
}

void TokenBatch::AddWindowRebuild(int32_t token, int64_t position, int32_t seq_id) {
  Add(token, position, seq_id, /*logits=*/false);
  window_rebuild.back() = true;
}

namespace {
size_t Elems(int64_t a, int64_t b) { return static_cast<size_t>(a * b); }

// The first row of a dense run of K (or V) rows, whichever pointer its element type uses.
void* RowData(DType type, float* f32, uint16_t* half, uint8_t* quantized) {
  if (type == DType::kF32) return f32;
  return IsQuantKvType(type) ? static_cast<void*>(quantized) : half;
}
}  // namespace

Status CheckKvCacheTypes(const ModelConfig& config, DType k_type, DType v_type) {
  const int64_t d = config.head_dim;
  for (const DType type : {k_type, v_type}) {
    if (!IsRotatedKvType(type)) continue;
    if (!ops::IsHadamardSize(d) || d < 32 || d > ops::kMaxQuantHeadDim) {
      return InvalidArgumentError(fmt::format(
          "KV cache type {} rotates each head with a Walsh-Hadamard transform and needs head_dim a "
          "power of two from 32 to {}; this model's head_dim is {} (use {} instead)",
          DTypeName(type), ops::kMaxQuantHeadDim, d, DTypeName(StorageFormat(type))));
    }
  }
  return Status::Ok();
}

Forward::Forward(const Model& model, ops::OpsContext& ops, const ForwardOptions& options)
    : model_(model), config_(model.config()), ops_(ops), options_(options) {
  const ModelConfig& c = config_;
  const int64_t b = options_.max_batch_tokens;
  if (c.is_moe()) moe_ = std::make_unique<MoeFeedForward>(c, ops);
  context_capacity_ = std::min<int64_t>(options_.max_context, kInitialContextCapacity);
  ReserveRows(b + options_.max_rebuild_rows, b);
  attn_tile_tokens_ = ops::AttentionTileTokens(c.head_dim);
  const int64_t group = c.num_heads / c.num_kv_heads;
  attn_block_tokens_ = std::max<int64_t>(1, kAttentionRowsPerItem / group);
  attn_scratch_.resize(static_cast<size_t>(ops.pool()->num_threads()));
  for (AttentionScratch& s : attn_scratch_) s.Allocate(attn_tile_tokens_, c.head_dim, attn_block_tokens_ * group);
  logit_in_.resize(Elems(options_.max_logit_rows, c.dim));
  logits_.resize(Elems(options_.max_logit_rows, c.vocab_size));
  rebuild_cos_.resize(Elems(b, c.head_dim / 2));
  rebuild_sin_.resize(Elems(b, c.head_dim / 2));
  // RoPE per layer kind. The frequency factors (Llama-3, LongRoPE) depend on the context the
  // engine runs with, as llama.cpp picks Phi-3's long set by its context size.
  rope_global_ = {c.rope_freq_base, c.arch.rope_freq_scale, c.arch.rope_attn_factor,
                  model.rope_factors(options_.max_context)};
  rope_local_ = rope_global_;
  if (c.arch.sliding_window > 0) {
    if (c.arch.rope_freq_base_local > 0.0f) rope_local_.freq_base = c.arch.rope_freq_base_local;
    rope_local_.freq_scale = c.arch.rope_freq_scale_local;
  }
  local_rope_differs_ = rope_local_.freq_base != rope_global_.freq_base ||
                        rope_local_.freq_scale != rope_global_.freq_scale;
  // Quantized activations for the logits' input too (ReserveRows covers the layers').
  ops_.Reserve(options_.max_logit_rows, c.dim);
  PackWeights();
}

Forward::~Forward() = default;

void Forward::PackWeights() {
  const auto start = std::chrono::steady_clock::now();
  const ops::Isa isa = ops_.isa();
  packed_.reserve(static_cast<size_t>(8 * config_.num_layers + 1));
  const auto pack = [&](const MatrixView& w) {
    packed_.push_back(ops::PackMatrix(isa, w, ops_.pool()));
    const size_t bytes = packed_.back().bytes();
    packed_bytes_ += bytes;
    // The copy replaces the original: its mmapped pages leave the resident set (the file stays in
    // the page cache, where other processes share it).
    if (bytes > 0) model_.file().DropPages(w.data, static_cast<size_t>(w.rows * w.row_bytes));
    return packed_.back().view();
  };
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    LayerWeights w = model_.layer(l);
    for (MatrixView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down, &w.router}) {
      if (m->data != nullptr) *m = pack(*m);  // an MoE layer has no dense FFN, a dense no router
    }
    layers_.push_back(w);
  }
  output_ = pack(model_.output());
  pack_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const float* Forward::logits(int64_t row) const {
  KVL_CHECK(row >= 0 && row < num_logit_rows_);
  return logits_.data() + row * config_.vocab_size;
}

void Forward::ReserveRows(int64_t rows, int64_t full_rows) {
  const ModelConfig& c = config_;
  act_.Reserve(c, rows, full_rows);
  // Quantized activations: K and V read dim columns for every row; the rows that run the whole
  // layer also feed Wo (q_dim) and W_down (ffn_dim).
  ops_.Reserve(act_.rows, c.dim);
  ops_.Reserve(act_.full_rows, std::max({c.dim, c.q_dim(), c.ffn_dim}));
  if (moe_) moe_->Reserve(act_.full_rows);
  const size_t n = static_cast<size_t>(act_.rows);
  attn_blocks_.reserve(n);
  mass_row_of_token_.resize(std::max(mass_row_of_token_.size(), n));
  for (auto* v : {&rows_batch_.tokens, &rows_batch_.seq_ids}) v->reserve(n);
  rows_batch_.positions.reserve(n);
  rows_batch_.want_logits.reserve(n);
}

void Forward::Run(const TokenBatch& batch, KvCache& kv) {
  const ModelConfig& c = config_;
  const int64_t n = batch.size();
  KVL_CHECK(n > 0 && n <= options_.max_batch_tokens);
  KVL_CHECK(kv.kv_dim() == c.kv_dim() && kv.num_layers() == c.num_layers);

  Embed(batch);
  PlanAttentionMass(batch, kv);  // the same tokens feed the accumulators on every layer
  RunLayers(batch, &kv, nullptr);
  const auto logits_start = std::chrono::steady_clock::now();
  Logits(batch);
  last_logits_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              logits_start)
                        .count();
}

void Forward::Rebuild(KvRebuildSource& source, KvCache* kv) {
  KVL_CHECK(kv == nullptr ||
            (kv->kv_dim() == config_.kv_dim() && kv->num_layers() == config_.num_layers));
  num_mass_rows_ = 0;  // rebuilt rows feed no accumulator
  RunLayers(empty_batch_, kv, &source);
}

// The step's tokens (`batch`, possibly none) and the rows the cache (or `source`) rebuilds, layer
// by layer: the rebuild work of a layer is asked for before the layer computes anything, so its
// rows join the layer's own matmuls.
void Forward::RunLayers(const TokenBatch& batch, KvCache* kv, KvRebuildSource* source) {
  const ModelConfig& c = config_;
  const int64_t n = batch.size();
  bool carried = false;  // the rebuilt rows' input of this layer is in act_.x
  for (int64_t l = 0; l < c.num_layers; ++l) {
    // The layer's input is the residual checkpoint K and V can be rebuilt from later (where the
    // cache keeps one: at every layer, or every s-th).
    for (int64_t t = 0; t < n; ++t) {
      const size_t i = static_cast<size_t>(t);
      if (batch.rebuilds_window(t)) continue;  // its checkpoints are kept already, exact
      if (float* checkpoint = kv->ResidualAt(batch.seq_ids[i], l, batch.positions[i])) {
        std::memcpy(checkpoint, &act_.x[Elems(t, c.dim)], sizeof(float) * static_cast<size_t>(c.dim));
      }
    }
    const KvLayerRebuild rebuild = source != nullptr ? source->Layer(l) : kv->BeginLayer(l);
    if (l == 0 || (rebuild.rows > 0 && rows_batch_.tokens.empty())) {
      PlanRows(batch, rebuild);
    } else {
      // The rows of the first layer that rebuilds any, at every later layer or none (a page
      // missing only its first layers: the frontier bench's depths; a sliding-window model's
      // local layers, whose rows live in the window rings).
      KVL_CHECK_MSG(rebuild.rows == 0 || rebuild.rows == rows_batch_.size() - n,
                    "a run's rebuilt rows must be the same at every layer that rebuilds");
    }
    KVL_CHECK_MSG(rebuild.rows == 0 || rebuild.input != nullptr || carried,
                  "a rebuilt row's layer input is neither a checkpoint nor carried");
    KVL_CHECK(!rebuild.advance || kv != nullptr);
    RunLayer(l, batch, kv, rebuild);
    carried = rebuild.advance;
  }
}

// The run's rows: the step's tokens, then the rebuilt ones (no token id, no logits), with their
// RoPE angles, computed once for every layer.
void Forward::PlanRows(const TokenBatch& batch, const KvLayerRebuild& rebuild) {
  const int64_t n = batch.size();
  const int64_t m = rebuild.rows;
  KVL_CHECK(m >= 0);
  if (n + m > act_.rows) ReserveRows(n + m, act_.full_rows);  // beyond max_rebuild_rows
  rows_batch_.Clear();
  if (m == 0) {
    ComputeRopeAngles(batch, act_);
    return;
  }
  int64_t longest = 0;
  for (int64_t t = 0; t < n; ++t) {
    const size_t i = static_cast<size_t>(t);
    if (batch.rebuilds_window(t)) {
      rows_batch_.AddWindowRebuild(batch.tokens[i], batch.positions[i], batch.seq_ids[i]);
    } else {
      rows_batch_.Add(batch.tokens[i], batch.positions[i], batch.seq_ids[i], batch.want_logits[i]);
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    rows_batch_.Add(/*token=*/0, rebuild.positions[i], rebuild.seq_ids[i], /*logits=*/false);
    mass_row_of_token_[static_cast<size_t>(n + i)] = -1;
    longest = std::max(longest, rebuild.positions[i] + 1);
  }
  if (longest > context_capacity_) GrowContextScratch(longest);
  ComputeRopeAngles(rows_batch_, act_);
}

// One transformer layer: act_.x from the layer's input to its output for the step's n tokens and
// the rebuilt rows that advance; the other rebuilt rows only get their K and V, computed in the
// same K and V matmuls as the step's.
void Forward::RunLayer(int64_t layer, const TokenBatch& batch, KvCache* kv,
                       const KvLayerRebuild& rebuild) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t n = batch.size();
  const int64_t m = rebuild.rows;
  const int64_t all = n + m;                            // rows that get K and V
  const int64_t full = rebuild.advance ? all : n;       // rows that run the whole layer
  if (full > act_.full_rows) ReserveRows(act_.rows, full);
  const TokenBatch& rows = m > 0 ? rows_batch_ : batch;
  Activations& a = act_;
  // Attention sublayer: x += Wo * attention(rope(Wq xn), rope(Wk xn), Wv xn).
  ForEachRow(*ops_.pool(), all, [&](int64_t t) {
    float* x = &a.x[Elems(t, c.dim)];
    if (t >= n && rebuild.input != nullptr) {
      // A rebuilt row at a checkpoint layer starts from its checkpoint.
      const float* input = rebuild.input + (t - n) * c.dim;
      if (!rebuild.advance) {
        ops::RmsNorm(ops_, input, w.attn_norm, c.dim, c.norm_eps, &a.xn[Elems(t, c.dim)]);
        return;
      }
      std::memcpy(x, input, sizeof(float) * static_cast<size_t>(c.dim));
    }
    ops::RmsNorm(ops_, x, w.attn_norm, c.dim, c.norm_eps, &a.xn[Elems(t, c.dim)]);
  });
  // Q only for the rows that attend; K and V for every row (MatMulGroup gives each matrix what it
  // gives alone, whatever the others' rows).
  const MatrixView qkv[] = {w.wq, w.wk, w.wv};
  float* const outs[] = {a.q.data(), a.k.data(), a.v.data()};
  const int64_t counts[] = {full, all, all};
  ops::MatMulGroup(ops_, qkv, a.xn.data(), counts, outs);
  StoreKv(layer, rows, n, kv, rebuild);
  if (full == 0) return;
  const TokenBatch& attending = rebuild.advance ? rows : batch;
  Attention(layer, attending, *kv, a);
  ops::MatMul(ops_, w.wo, a.attn.data(), full, a.proj.data());
  AddResidual(w.post_attn_norm, full, a);
  // Feed-forward sublayer: x += W_down (act(W_gate xn) * W_up xn), act silu or tanh-GELU; in an
  // MoE model, the sum of the chosen experts' FFNs (moe_ffn.h).
  ForEachRow(*ops_.pool(), full, [&](int64_t t) {
    ops::RmsNorm(ops_, &a.x[Elems(t, c.dim)], w.ffn_norm, c.dim, c.norm_eps, &a.xn[Elems(t, c.dim)]);
  });
  FeedForward(w, full, a);
  AddResidual(w.post_ffn_norm, full, a);
}

void Forward::AddResidual(const float* post_norm, int64_t n, Activations& a) {
  const int64_t dim = config_.dim;
  if (post_norm != nullptr) {
    ForEachRow(*ops_.pool(), n, [&](int64_t t) {
      ops::RmsNorm(ops_, &a.proj[Elems(t, dim)], post_norm, dim, config_.norm_eps,
                   &a.proj[Elems(t, dim)]);
    });
  }
  ForEachRow(*ops_.pool(), n, [&](int64_t t) {
    ops::Add(ops_, &a.x[Elems(t, dim)], &a.proj[Elems(t, dim)], dim);
  });
}

void Forward::Embed(const TokenBatch& batch) {
  const MatrixView& e = model_.token_embedding();
  ForEachRow(*ops_.pool(), batch.size(), [&](int64_t t) {
    const int32_t token = batch.tokens[static_cast<size_t>(t)];
    KVL_CHECK(token >= 0 && token < config_.vocab_size);
    const auto* row = static_cast<const uint8_t*>(e.data) + token * e.row_bytes;
    float* x = &act_.x[Elems(t, config_.dim)];
    ops::DequantizeRow(e.type, row, config_.dim, x);
    if (config_.arch.embed_scale != 1.0f) {
      for (int64_t i = 0; i < config_.dim; ++i) x[i] *= config_.arch.embed_scale;
    }
  });
}

// The angles as ggml's CPU RoPE computes them (in float, the power of the base as a running
// product), so that long positions round as llama.cpp's do.
void Forward::AnglesFor(int64_t position, const RopeParams& rope, float* cos, float* sin) const {
  const int64_t half = config_.rope_dim / 2;
  const float theta_scale = std::pow(rope.freq_base, -2.0f / static_cast<float>(config_.rope_dim));
  float theta = static_cast<float>(position);
  for (int64_t i = 0; i < half; ++i) {
    const float factor = rope.factors != nullptr ? rope.factors[i] : 1.0f;
    const float angle = rope.freq_scale * (theta / factor);
    cos[i] = std::cos(angle) * rope.attn_factor;
    sin[i] = std::sin(angle) * rope.attn_factor;
    theta *= theta_scale;
  }
}

void Forward::ComputeRopeAngles(const TokenBatch& batch, Activations& a) {
  const int64_t half = config_.head_dim / 2;
  ForEachRow(*ops_.pool(), batch.size(), [&](int64_t t) {
    const int64_t pos = batch.positions[static_cast<size_t>(t)];
    AnglesFor(pos, rope_global_, &a.rope_cos[Elems(t, half)], &a.rope_sin[Elems(t, half)]);
    if (local_rope_differs_) {
      AnglesFor(pos, rope_local_, &a.rope_cos_local[Elems(t, half)],
                &a.rope_sin_local[Elems(t, half)]);
    }
  });
}

void Forward::FinishKv(const LayerWeights& w, float* k, float* v, const float* cos,
                       const float* sin) const {
  const ModelConfig& c = config_;
  if (w.k_bias != nullptr) {
    ops::Add(ops_, k, w.k_bias, c.kv_dim());
    ops::Add(ops_, v, w.v_bias, c.kv_dim());
  }
  if (w.k_norm != nullptr) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      ops::RmsNorm(ops_, k + h * c.head_dim, w.k_norm, c.head_dim, c.norm_eps, k + h * c.head_dim);
    }
  }
  ops::Rope(ops_, k, c.num_kv_heads, c.head_dim, cos, sin, c.rope_neox);
}

void Forward::FinishQ(const LayerWeights& w, float* q, const float* cos, const float* sin) const {
  const ModelConfig& c = config_;
  if (w.q_bias != nullptr) ops::Add(ops_, q, w.q_bias, c.q_dim());
  if (w.q_norm != nullptr) {
    for (int64_t h = 0; h < c.num_heads; ++h) {
      ops::RmsNorm(ops_, q + h * c.head_dim, w.q_norm, c.head_dim, c.norm_eps, q + h * c.head_dim);
    }
  }
  ops::Rope(ops_, q, c.num_heads, c.head_dim, cos, sin, c.rope_neox);
  if (c.arch.attn_scale_on_q) {
    const float scale = c.AttentionScale();
    for (int64_t i = 0; i < c.q_dim(); ++i) q[i] *= scale;
  }
}

// One K or V row of kv_dim floats into the cache at its element type (f32 copied, f16 / bf16
// narrowed, q8_0 / q4_0 quantized by ggml's reference quantizers, q8_0r / q4_0r rotated per head
// and then quantized; the same bytes on every ISA): the one way rows enter a cache, so rebuilt
// rows match stored ones bit for bit.
void Forward::StoreRow(const float* row, DType type, void* out) const {
  const int64_t n = config_.kv_dim();
  if (IsRotatedKvType(type)) {
    // A head at a time: its blocks of 32 are its own (head_dim a multiple of 32, checked by
    // CheckKvCacheTypes), so the bytes are those of the whole rotated row quantized at once.
    const int64_t d = config_.head_dim;
    KVL_CHECK_MSG(ops::IsHadamardSize(d) && d >= 32 && d <= ops::kMaxQuantHeadDim,
                  "a rotated KV cache type on a model whose head_dim it cannot rotate");
    alignas(64) float head[ops::kMaxQuantHeadDim];
    for (int64_t at = 0; at < n; at += d) {
      std::memcpy(head, row + at, sizeof(float) * static_cast<size_t>(d));
      ops::HadamardRotate(ops_, head, 1, d);
      quant::QuantizeRow(type, head, d, static_cast<uint8_t*>(out) + RowBytes(type, at));
    }
    return;
  }
  if (type == DType::kF32) {
    std::memcpy(out, row, sizeof(float) * static_cast<size_t>(n));
  } else if (IsQuantKvType(type)) {
    quant::QuantizeRow(type, row, n, out);
  } else {
    ops::NarrowRow(ops_, type, row, n, static_cast<uint16_t*>(out));
  }
}

// Rotates K by each row's position and stores K and V (narrowed to the cache's element type): the
// step's n tokens into the cache, the rebuilt rows where the cache asked for them.
void Forward::StoreKv(int64_t layer, const TokenBatch& rows, int64_t n, KvCache* kv,
                      const KvLayerRebuild& rebuild) {
  const ModelConfig& c = config_;
  const int64_t half = c.head_dim / 2;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const bool local = local_rope_differs_ && c.IsLocal(layer);
  const float* cos = local ? act_.rope_cos_local.data() : act_.rope_cos.data();
  const float* sin = local ? act_.rope_sin_local.data() : act_.rope_sin.data();
  const bool global = !c.IsLocal(layer);
  // A window rebuild's global rows are the cached ones, exact; its own would not be (its hidden
  // state is exact only inside its receptive field).
  const auto skipped = [&](int64_t t) { return t < n && global && rows.rebuilds_window(t); };
  ForEachRow(*ops_.pool(), n + rebuild.rows, [&](int64_t t) {
    if (skipped(t)) return;
    float* k = &act_.k[Elems(t, c.kv_dim())];
    float* v = &act_.v[Elems(t, c.kv_dim())];
    FinishKv(w, k, v, cos + t * half, sin + t * half);
    if (t >= n) {
      // A rebuilt row goes to its own slot of the buffer the cache gave: stored on the thread that
      // finished it (the step's rows go through the cache, below, on the calling thread).
      const int64_t row = (t - n) * c.kv_dim();
      StoreRow(k, rebuild.k_type, static_cast<uint8_t*>(rebuild.k_out) + RowBytes(rebuild.k_type, row));
      StoreRow(v, rebuild.v_type, static_cast<uint8_t*>(rebuild.v_out) + RowBytes(rebuild.v_type, row));
    }
  });
  for (int64_t t = 0; t < n; ++t) {
    if (skipped(t)) continue;
    const float* k = &act_.k[Elems(t, c.kv_dim())];
    const float* v = &act_.v[Elems(t, c.kv_dim())];
    const KvCache::Rows out = kv->RowsAt(rows.seq_ids[static_cast<size_t>(t)], layer,
                                         rows.positions[static_cast<size_t>(t)]);
    KVL_CHECK_MSG(out.kind == KvCache::Rows::Kind::kDense, "new K/V rows must be writable");
    StoreRow(k, out.type, RowData(out.type, out.k, out.k_half, out.k_q));
    StoreRow(v, out.v_type, RowData(out.v_type, out.v, out.v_half, out.v_q));
  }
}

void Forward::RebuildKvFromResiduals(const TokenBatch& batch, KvCache& kv) {
  const ModelConfig& c = config_;
  const int64_t n = batch.size();
  KVL_CHECK(n > 0 && n <= options_.max_batch_tokens);
  ComputeRopeAngles(batch, act_);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[static_cast<size_t>(l)];
    for (int64_t t = 0; t < n; ++t) {
      const size_t i = static_cast<size_t>(t);
      const float* checkpoint = kv.ResidualAt(batch.seq_ids[i], l, batch.positions[i]);
      KVL_CHECK_MSG(checkpoint != nullptr, "RebuildKvFromResiduals: the cache keeps no checkpoints");
      ops::RmsNorm(ops_, checkpoint, w.attn_norm, c.dim, c.norm_eps, &act_.xn[Elems(t, c.dim)]);
    }
    MatMulShared({&w.wk, &w.wv}, act_.xn.data(), n, {act_.k.data(), act_.v.data()});
    StoreKv(l, batch, n, &kv, KvLayerRebuild{});
  }
}

// Per token one RmsNorm of its checkpoint, the K and V projections and RoPE on K, stored through
// StoreRow: Run's operations for K and V, so the rows match the stored ones bit for bit.
void Forward::RebuildLayerKv(int64_t layer, const float* checkpoints, const int64_t* positions,
                             int64_t n, DType k_type, void* k_out, DType v_type, void* v_out) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t half = c.head_dim / 2;
  const int64_t chunk = options_.max_batch_tokens;  // rebuild_cos_ / rebuild_sin_ hold a chunk
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t m = std::min(chunk, n - begin);
    for (int64_t t = 0; t < m; ++t) {
      ops::RmsNorm(ops_, checkpoints + (begin + t) * c.dim, w.attn_norm, c.dim, c.norm_eps,
                   &act_.xn[Elems(t, c.dim)]);
      AnglesFor(positions[begin + t], RopeOf(layer), &rebuild_cos_[Elems(t, half)],
                &rebuild_sin_[Elems(t, half)]);
    }
    MatMulShared({&w.wk, &w.wv}, act_.xn.data(), m, {act_.k.data(), act_.v.data()});
    for (int64_t t = 0; t < m; ++t) {
      float* k = &act_.k[Elems(t, c.kv_dim())];
      float* v = &act_.v[Elems(t, c.kv_dim())];
      FinishKv(w, k, v, &rebuild_cos_[Elems(t, half)], &rebuild_sin_[Elems(t, half)]);
      const int64_t row = (begin + t) * c.kv_dim();
      StoreRow(k, k_type, static_cast<uint8_t*>(k_out) + RowBytes(k_type, row));
      StoreRow(v, v_type, static_cast<uint8_t*>(v_out) + RowBytes(v_type, row));
    }
  }
}

// Per token one RmsNorm of its checkpoint, the Q projection, and FinishQ: Attention's queries.
void Forward::LayerQueries(int64_t layer, const float* checkpoints, const int64_t* positions,
                           int64_t n, float* q_out) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t half = c.head_dim / 2;
  const int64_t chunk = std::min(options_.max_batch_tokens, act_.full_rows);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t m = std::min(chunk, n - begin);
    for (int64_t t = 0; t < m; ++t) {
      ops::RmsNorm(ops_, checkpoints + (begin + t) * c.dim, w.attn_norm, c.dim, c.norm_eps,
                   &act_.xn[Elems(t, c.dim)]);
      AnglesFor(positions[begin + t], RopeOf(layer), &rebuild_cos_[Elems(t, half)],
                &rebuild_sin_[Elems(t, half)]);
    }
    ops::MatMul(ops_, w.wq, act_.xn.data(), m, act_.q.data());
    for (int64_t t = 0; t < m; ++t) {
      float* q = &act_.q[Elems(t, c.q_dim())];
      FinishQ(w, q, &rebuild_cos_[Elems(t, half)], &rebuild_sin_[Elems(t, half)]);
      std::memcpy(q_out + (begin + t) * c.q_dim(), q, sizeof(float) * static_cast<size_t>(c.q_dim()));
    }
  }
}

// Computes softmax(q k^T / sqrt(d)) v for every (token, head) of `batch` over the positions the
// token sees, as a tiled online softmax (ops::AttentionTile), after rotating q: work items are
// (run of up to attn_block_tokens_ consecutive positions of one sequence, KV head), and each item
// visits the sequence's K/V once, in tiles of attn_tile_tokens_ positions aligned to multiples of
// the tile size, for all of its query rows (the GQA group's heads x the run's positions). Tiles
// are fixed by position and each row's arithmetic depends only on its own q and the rows it sees,
// so batching, chunking, threads and how the cache splits its rows into runs never change a
// result. Every K/V row of the layer the batch reads is stored before (StoreKv).
void Forward::Attention(int64_t layer, const TokenBatch& batch, KvCache& kv, Activations& a) {
  const ModelConfig& c = config_;
  const int64_t n = batch.size();
  const int64_t half = c.head_dim / 2;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const bool local = local_rope_differs_ && c.IsLocal(layer);
  const float* cos = local ? a.rope_cos_local.data() : a.rope_cos.data();
  const float* sin = local ? a.rope_sin_local.data() : a.rope_sin.data();
  // Keys held rotated (q8_0r, q4_0r) meet queries rotated the same way: q.k is unchanged.
  const bool rotate_q = kv.keys_rotated();
  ForEachRow(*ops_.pool(), n, [&](int64_t t) {
    float* q = &a.q[Elems(t, c.q_dim())];
    FinishQ(w, q, cos + t * half, sin + t * half);
    if (rotate_q) ops::HadamardRotate(ops_, q, c.num_heads, c.head_dim);
  });

  PlanAttentionBlocks(batch);
  const int64_t num_blocks = static_cast<int64_t>(attn_blocks_.size());
  const int64_t* mass_rows = mass_row_of_token_.data();
  // The longest items (the latest positions) first, so no thread is left with one at the end.
  ops_.pool()->ParallelFor(num_blocks * c.num_kv_heads, [&](int64_t task, int thread) {
    const int64_t block = num_blocks - 1 - task / c.num_kv_heads;
    AttendBlock(layer, batch, attn_blocks_[static_cast<size_t>(block)], task % c.num_kv_heads,
                kv, attn_scratch_[static_cast<size_t>(thread)], a, mass_rows);
  });
  if (num_mass_rows_ > 0) AccumulateAttentionMass(batch, kv);
}

// Runs of consecutive batch tokens of one sequence at consecutive positions, split every
// attn_block_tokens_ tokens. Which tokens share an item changes no result, only the speed.
void Forward::PlanAttentionBlocks(const TokenBatch& batch) {
  attn_blocks_.clear();
  for (int64_t t = 0; t < batch.size(); ++t) {
    const size_t i = static_cast<size_t>(t);
    if (!attn_blocks_.empty()) {
      AttentionBlock& last = attn_blocks_.back();
      const size_t prev = static_cast<size_t>(last.first_token + last.num_tokens - 1);
      if (last.num_tokens < attn_block_tokens_ && prev + 1 == i &&
          batch.seq_ids[prev] == batch.seq_ids[i] &&
          batch.positions[prev] + 1 == batch.positions[i]) {
        ++last.num_tokens;
        continue;
      }
    }
    attn_blocks_.push_back({t, 1});
  }
}

// Gathers the K/V rows of positions [begin, end) of one KV head into the thread's tile: keys
// packed for ops::AttentionTile, values as row pointers (into the cache for f32 rows, into the
// thread's staging once widened or dequantized otherwise). Evicted rows are left out (they get
// no weight); tile_pos says which position each gathered row holds. Returns the rows gathered.
int64_t Forward::GatherTile(int64_t layer, int32_t seq, int64_t kv_head, int64_t begin,
                            int64_t end, KvCache& kv, AttentionScratch& s) const {
  const int64_t d = config_.head_dim;
  const int64_t kv_offset = kv_head * d;
  const int64_t width = attn_tile_tokens_;
  int64_t count = 0;
  for (int64_t p = begin; p < end;) {
    const KvCache::Rows rows = kv.RowsAt(seq, layer, p);
    KVL_CHECK(rows.count > 0);
    const int64_t m = std::min(rows.count, end - p);
    float* k_stage = &s.k_stage[Elems(count, d)];
    float* v_stage = &s.v_stage[Elems(count, d)];
    switch (rows.kind) {
      case KvCache::Rows::Kind::kDense:
        if (IsQuantKvType(rows.type)) {
          const int64_t row_bytes = RowBytes(rows.type, rows.stride);
          for (int64_t i = 0; i < m; ++i) {
            ops::DequantizeCols(ops_, rows.type, rows.k_q + i * row_bytes, kv_offset, d,
                                k_stage + i * d);
          }
          ops::PackAttentionKeys(ops_, DType::kF32, k_stage, d, m, d, s.kt, width, count);
        } else {
          const void* k = rows.type == DType::kF32 ? static_cast<const void*>(rows.k + kv_offset)
                                                   : static_cast<const void*>(rows.k_half + kv_offset);
          ops::PackAttentionKeys(ops_, rows.type, k, rows.stride, m, d, s.kt, width, count);
        }
        for (int64_t i = 0; i < m; ++i) {
          const float*& v = s.v_rows[static_cast<size_t>(count + i)];
          float* staged = v_stage + i * d;
          if (rows.v_type == DType::kF32) {
            v = rows.v + i * rows.stride + kv_offset;
          } else if (IsQuantKvType(rows.v_type)) {
            ops::DequantizeCols(ops_, rows.v_type,
                                rows.v_q + i * RowBytes(rows.v_type, rows.stride), kv_offset, d,
                                staged);
            v = staged;
          } else {
            ops::WidenRow(ops_, rows.v_type, rows.v_half + i * rows.stride + kv_offset, d, staged);
            v = staged;
          }
        }
        break;
      case KvCache::Rows::Kind::kCompressed:
        for (int64_t i = 0; i < m; ++i) {
          ops::DequantizeQuantKvRow(rows.page, rows.first_row + i, kv_offset, d, k_stage + i * d,
                                    v_stage + i * d);
          s.v_rows[static_cast<size_t>(count + i)] = v_stage + i * d;
        }
        ops::PackAttentionKeys(ops_, DType::kF32, k_stage, d, m, d, s.kt, width, count);
        break;
      case KvCache::Rows::Kind::kDropped:
        p += m;  // evicted tokens take no weight: they are not in the tile at all
        continue;
    }
    for (int64_t i = 0; i < m; ++i) s.tile_pos[static_cast<size_t>(count + i)] = p + i;
    count += m;
    p += m;
  }
  return count;
}

// Asks for the K/V bytes of one KV head at positions [begin, end) ahead of GatherTile: in decode
// at a long context every tile comes from DRAM, in 16-token blocks scattered over the pool, and
// without this each tile's misses would be waited for one by one.
void Forward::PrefetchTile(int64_t layer, int32_t seq, int64_t kv_head, int64_t begin,
                           int64_t end, KvCache& kv) const {
  const int64_t d = config_.head_dim;
  const int64_t kv_offset = kv_head * d;
  for (int64_t p = begin; p < end;) {
    const KvCache::Rows rows = kv.RowsAt(seq, layer, p);
    const int64_t m = std::min(rows.count, end - p);
    if (rows.kind == KvCache::Rows::Kind::kDense) {
      for (const bool key : {true, false}) {
        const DType type = key ? rows.type : rows.v_type;
        const auto* base = static_cast<const uint8_t*>(
            key ? RowData(type, rows.k, rows.k_half, rows.k_q)
                : RowData(type, rows.v, rows.v_half, rows.v_q));
        if (IsQuantKvType(type)) {
          // The blocks of 32 values that hold the head's channels.
          const int64_t block_bytes = RowBytes(type, 32);
          const int64_t first = kv_offset / 32, last = (kv_offset + d - 1) / 32;
          ops::PrefetchRows(base + first * block_bytes, RowBytes(type, rows.stride), m,
                            (last - first + 1) * block_bytes);
        } else {
          const int64_t elem = type == DType::kF32 ? 4 : 2;
          ops::PrefetchRows(base + kv_offset * elem, rows.stride * elem, m, d * elem);
        }
      }
    }
    p += m;
  }
}

// One work item: the query rows of `block`'s tokens for the heads of one KV head's group.
void Forward::AttendBlock(int64_t layer, const TokenBatch& batch, const AttentionBlock& block,
                          int64_t kv_head, KvCache& kv, AttentionScratch& s, Activations& a,
                          const int64_t* mass_rows) {
  const ModelConfig& c = config_;
  const int64_t d = c.head_dim;
  const int64_t group = c.num_heads / c.num_kv_heads;
  const int64_t num_rows = block.num_tokens * group;
  const int32_t seq = batch.seq_ids[static_cast<size_t>(block.first_token)];
  const int64_t first_pos = batch.positions[static_cast<size_t>(block.first_token)];
  const int64_t end_pos = first_pos + block.num_tokens;  // one past the last token's position
  KVL_CHECK(end_pos <= context_capacity_);  // PlanAttentionMass grew the mass scratch
  // Where llama.cpp scales Q (Gemma, Phi-3), FinishQ did; the scores are then taken as they are.
  const float scale = c.arch.attn_scale_on_q ? 1.0f : c.AttentionScale();
  // A local layer's token at position p sees (p - window, p]: llama.cpp's sliding-window mask.
  const int64_t window = c.IsLocal(layer) ? c.arch.sliding_window : 0;
  const int64_t last_pos = end_pos - 1;
  const float softcap = c.arch.attn_softcap;
  const bool values_rotated = kv.values_rotated();

  // Row r = token i of the block (r / group), head kv_head * group + r % group. Its output
  // accumulates in place in a.attn.
  bool any_mass = false;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t t = block.first_token + r / group;
    const int64_t h = kv_head * group + r % group;
    const size_t ri = static_cast<size_t>(r);
    s.q_rows[ri] = &a.q[Elems(t, c.q_dim()) + h * d];
    s.acc_rows[ri] = &a.attn[Elems(t, c.q_dim()) + h * d];
    std::fill(s.acc_rows[ri], s.acc_rows[ri] + d, 0.0f);
    s.m[ri] = -std::numeric_limits<float>::infinity();
    s.l[ri] = 0.0f;
    const int64_t mass_row = mass_rows != nullptr ? mass_rows[t] : -1;
    s.score_rows[ri] = mass_row >= 0 ? &s.tile_scores[Elems(r, attn_tile_tokens_)] : nullptr;
    if (mass_row >= 0) {
      // Positions left out of every tile (evicted) keep -inf: no weight.
      float* weights = &mass_scratch_[Elems(mass_row * c.num_heads + h, context_capacity_)];
      std::fill(weights, weights + batch.positions[static_cast<size_t>(t)] + 1,
                -std::numeric_limits<float>::infinity());
      any_mass = true;
    }
  }

  // Tiles are fixed by position; with a window, those wholly before the first token's window
  // are skipped, and a token whose window starts inside a tile sees a tile regathered from its
  // window's first position (so what a row sees depends on its position only).
  const int64_t first_seen = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  for (int64_t begin = first_seen / attn_tile_tokens_ * attn_tile_tokens_; begin < end_pos;
       begin += attn_tile_tokens_) {
    const int64_t end = std::min(begin + attn_tile_tokens_, end_pos);
    const int64_t count = GatherTile(layer, seq, kv_head, begin, end, kv, s);
    if (end < end_pos) {
      PrefetchTile(layer, seq, kv_head, end, std::min(end + attn_tile_tokens_, end_pos), kv);
    }
    if (count == 0) continue;
    // Every token of the block sees the whole tile: one call for all rows. Otherwise (the tiles
    // that hold the block's own positions, or a window's edge) each token sees the gathered rows
    // in its own range.
    const bool whole = end <= first_pos + 1 && (window == 0 || begin > last_pos - window);
    if (whole) {
      AttendRows(batch, block, kv_head, s, 0, num_rows, count, scale, softcap, mass_rows, any_mass);
      continue;
    }
    bool window_edge = false;
    for (int64_t i = 0; i < block.num_tokens; ++i) {
      const int64_t pos = first_pos + i;
      const int64_t visible =
          std::upper_bound(s.tile_pos.begin(), s.tile_pos.begin() + count, pos) - s.tile_pos.begin();
      if (window > 0 && pos - window + 1 > begin) {
        window_edge |= pos - window + 1 < end;  // its window starts inside: below
        continue;
      }
      if (visible == 0) continue;
      AttendRows(batch, block, kv_head, s, i * group, group, visible, scale, softcap, mass_rows,
                 any_mass);
    }
    if (!window_edge) continue;
    for (int64_t i = 0; i < block.num_tokens; ++i) {
      const int64_t pos = first_pos + i;
      const int64_t lo = pos - window + 1;
      if (lo <= begin || lo >= end) continue;
      const int64_t seen = GatherTile(layer, seq, kv_head, lo, std::min(end, pos + 1), kv, s);
      if (seen == 0) continue;
      AttendRows(batch, block, kv_head, s, i * group, group, seen, scale, softcap, mass_rows,
                 any_mass);
    }
  }

  for (int64_t r = 0; r < num_rows; ++r) {
    const size_t ri = static_cast<size_t>(r);
    const float inv = 1.0f / s.l[ri];  // the token's own row is always in its last tile: l > 0
    for (int64_t k = 0; k < d; ++k) s.acc_rows[ri][k] *= inv;
    // A weighted sum of rotated values is the rotated sum: the rotation (its own inverse) takes
    // it back to the model's basis.
    if (values_rotated) ops::HadamardRotate(ops_, s.acc_rows[ri], 1, d);
    if (s.score_rows[ri] != nullptr) {
      // The weights the pager tracks: the scores gathered above, normalized as one softmax.
      const int64_t t = block.first_token + r / group;
      const int64_t h = kv_head * group + r % group;
      float* weights = &mass_scratch_[Elems(mass_rows[t] * c.num_heads + h, context_capacity_)];
      ops::Softmax(ops_, weights, batch.positions[static_cast<size_t>(t)] + 1);
    }
  }
}

void Forward::AttendRows(const TokenBatch& batch, const AttentionBlock& block, int64_t kv_head,
                         AttentionScratch& s, int64_t r0, int64_t num_rows, int64_t visible,
                         float scale, float softcap, const int64_t* mass_rows, bool any_mass) {
  const ModelConfig& c = config_;
  const int64_t group = c.num_heads / c.num_kv_heads;
  const size_t r = static_cast<size_t>(r0);
  ops::AttentionRows rows;
  rows.num_rows = num_rows;
  rows.q = &s.q_rows[r];
  rows.m = &s.m[r];
  rows.l = &s.l[r];
  rows.acc = &s.acc_rows[r];
  rows.scores = any_mass ? &s.score_rows[r] : nullptr;
  rows.softcap = softcap;
  ops::AttentionTile(ops_, s.kt, attn_tile_tokens_, s.v_rows.data(), visible, c.head_dim, scale,
                     rows);
  if (!any_mass) return;
  for (int64_t row = r0; row < r0 + num_rows; ++row) {
    const float* scores = s.score_rows[static_cast<size_t>(row)];
    if (scores == nullptr) continue;
    const int64_t t = block.first_token + row / group;
    const int64_t h = kv_head * group + row % group;
    float* weights = &mass_scratch_[Elems(mass_rows[t] * c.num_heads + h, context_capacity_)];
    for (int64_t j = 0; j < visible; ++j) weights[s.tile_pos[static_cast<size_t>(j)]] = scores[j];
  }
}

// Which tokens' attention weights feed the cache's attention-mass accumulators (those that ask
// for logits: the newest token of each sequence), each given a row of mass_scratch_.
void Forward::GrowContextScratch(int64_t positions) {
  KVL_CHECK(positions <= options_.max_context);
  context_capacity_ = std::min(options_.max_context, std::max(positions, 2 * context_capacity_));
  if (!mass_scratch_.empty()) {
    mass_scratch_.resize(Elems(options_.max_logit_rows * config_.num_heads, context_capacity_));
  }
}

void Forward::PlanAttentionMass(const TokenBatch& batch, KvCache& kv) {
  const int64_t n = batch.size();
  int64_t longest = 0;
  for (int64_t t = 0; t < n; ++t) {
    longest = std::max<int64_t>(longest, batch.positions[static_cast<size_t>(t)] + 1);
  }
  if (longest > context_capacity_) GrowContextScratch(longest);
  int64_t rows = 0;
  for (int64_t t = 0; t < n; ++t) {
    const size_t i = static_cast<size_t>(t);
    const bool feeds_mass = batch.want_logits[i] && kv.AttentionMass(batch.seq_ids[i]) != nullptr;
    mass_row_of_token_[i] = feeds_mass ? rows++ : -1;
  }
  KVL_CHECK(rows <= options_.max_logit_rows);  // Logits checks the same of every logits row
  // Sized at the first Run that tracks mass (many caches never do), for the most rows any Run can
  // have (one per logits row), so a later step with more such tokens never reallocates.
  if (rows > 0 && mass_scratch_.empty()) {
    mass_scratch_.resize(Elems(options_.max_logit_rows * config_.num_heads, context_capacity_));
  }
  num_mass_rows_ = rows;
}

// mass[p] += weight of position p averaged over the layers and heads (so a step adds 1 in all).
// Summed here, serially and in a fixed order, so the accumulators are deterministic.
void Forward::AccumulateAttentionMass(const TokenBatch& batch, KvCache& kv) {
  const ModelConfig& c = config_;
  const float share = 1.0f / static_cast<float>(c.num_layers * c.num_heads);
  for (int64_t t = 0; t < batch.size(); ++t) {
    const int64_t row = mass_row_of_token_[static_cast<size_t>(t)];
    if (row < 0) continue;
    float* mass = kv.AttentionMass(batch.seq_ids[static_cast<size_t>(t)]);
    const int64_t num_visible = batch.positions[static_cast<size_t>(t)] + 1;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const float* weights = &mass_scratch_[Elems(row * c.num_heads + h, context_capacity_)];
      for (int64_t p = 0; p < num_visible; ++p) mass[p] += share * weights[p];
    }
  }
}

// Projections of the same normalized input x in one parallel region (x quantized once).
void Forward::MatMulShared(std::initializer_list<const MatrixView*> ws, const float* x,
                           int64_t n, std::initializer_list<float*> ys) {
  KVL_CHECK(ws.size() == ys.size() && ws.size() <= ops::kMaxGroup);
  MatrixView views[ops::kMaxGroup];
  size_t count = 0;
  for (const MatrixView* w : ws) views[count++] = *w;
  ops::MatMulGroup(ops_, std::span<const MatrixView>(views, count), x, n,
                   std::span<float* const>(ys.begin(), ys.size()));
}

void Forward::FeedForward(const LayerWeights& w, int64_t n, Activations& a) {
  const ModelConfig& c = config_;
  if (moe_) {
    moe_->Run(w, a.xn.data(), n, a.gate.data(), a.up.data(), a.proj.data());
    return;
  }
  MatMulShared({&w.w_gate, &w.w_up}, a.xn.data(), n, {a.gate.data(), a.up.data()});
  if (c.arch.gelu_ffn) {
    ops::GeGlu(ops_, a.gate.data(), a.up.data(), n * c.ffn_dim);
  } else {
    ops::SwiGlu(ops_, a.gate.data(), a.up.data(), n * c.ffn_dim);
  }
  ops::MatMul(ops_, w.w_down, a.gate.data(), n, a.proj.data());
}

void Forward::Logits(const TokenBatch& batch) {
  const ModelConfig& c = config_;
  num_logit_rows_ = 0;
  for (int64_t t = 0; t < batch.size(); ++t) {
    if (!batch.want_logits[static_cast<size_t>(t)]) continue;
    KVL_CHECK(num_logit_rows_ < options_.max_logit_rows);
    ops::RmsNorm(ops_, &act_.x[Elems(t, c.dim)], model_.output_norm(), c.dim, c.norm_eps,
                 &logit_in_[Elems(num_logit_rows_, c.dim)]);
    ++num_logit_rows_;
  }
  if (num_logit_rows_ > 0) {
    ops::MatMul(ops_, output_, logit_in_.data(), num_logit_rows_, logits_.data());
    if (c.arch.final_softcap > 0.0f) {
      ops::SoftCap(logits_.data(), num_logit_rows_ * c.vocab_size, c.arch.final_softcap);
    }
  }
}

}  // namespace kvl
