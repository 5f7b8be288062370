// The recompute curves of calibration: K/V rebuilt from residual checkpoints and from tokens,
// timed at a grid of shapes (tokens x layers, tokens x position) and fitted (calibration_fit.cc).
//
// Both are timed through the forward pass itself, so they cost what the pager and a resumed
// sequence really pay: Forward::RebuildLayerKv (a rebuild on its own, as a restore pays, each
// layer on its own page of checkpoints, RebuildPages) for checkpoints, and
// Forward::Run of the page's tokens after `position` tokens of context for tokens. The context's
// K/V rows are zeros: attention's time does not depend on their values, only on how many there
// are, so the context costs nothing to set up.
//
// Which points are timed: the grid is ordered by its expected time (from the matmul rates just
// measured) and taken smallest first while the stage's budget (curve_seconds) lasts, so a small
// model gets the whole grid and a 7B-shaped one the points it can afford; the fit always gets at
// least kMinPoints.
#include <algorithm>
#include <cmath>
#include <memory>

#include "calibration_internal.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/model.h"

namespace kvl::calibration_internal {
namespace {

// The calibration's context cache, handing a forward run kStepRebuildRows rows to rebuild at
// every layer, as the pager does in a step: each layer its own page of (random) checkpoints and
// its own K/V rows out (RebuildPages), not one page shared by every layer.
class RebuildRowsCache final : public KvCache {
 public:
  RebuildRowsCache(ContiguousKvCache& kv, const ModelConfig& c)
      : kv_(kv), pages_(kStepRebuildRows * c.num_layers, c, 3) {
    for (int64_t t = 0; t < kStepRebuildRows; ++t) {
      positions_.push_back(t);
      seqs_.push_back(0);
    }
  }
  int64_t kv_dim() const override { return kv_.kv_dim(); }
  int64_t num_layers() const override { return kv_.num_layers(); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override { return kv_.RowsAt(seq, layer, pos); }
  KvLayerRebuild BeginLayer(int64_t layer) override {
    KvLayerRebuild r;
    r.rows = kStepRebuildRows;
    r.positions = positions_.data();
    r.seq_ids = seqs_.data();
    r.input = pages_.Checkpoints(layer, kStepRebuildRows);
    r.k_out = pages_.K(layer, kStepRebuildRows);
    r.v_out = pages_.V(layer, kStepRebuildRows);
    return r;
  }

 private:
  ContiguousKvCache& kv_;
  RebuildPages pages_;
  std::vector<int64_t> positions_;
  std::vector<int32_t> seqs_;
};

// Tokens per page and positions the grids span (the 16..4096).
constexpr int64_t kGridTokens[] = {16, 64, 256, 1024, 4096};
constexpr int64_t kGridPositions[] = {0, 256, 1024, 4096};
// Enough for the terms a curve can show (tokens recompute runs every layer: call and layer terms
// merge) and one more.
constexpr size_t kMinPoints = 4;

struct PlannedPoint {
  RecomputePoint shape;
  double expected_seconds = 0;
};

int SamplesFor(const PlannedPoint& p, const CalibrateOptions& o) {
  return p.expected_seconds > kLongPointSeconds ? 1 : o.repetitions;
}

// The grid's points, cheapest first, while their expected time (warm-up and samples included)
// fits the budget; at least kMinPoints of them.
std::vector<PlannedPoint> ChoosePoints(std::vector<PlannedPoint> grid, const CalibrateOptions& o) {
  std::stable_sort(grid.begin(), grid.end(), [](const PlannedPoint& a, const PlannedPoint& b) {
    return a.expected_seconds < b.expected_seconds;
  });
  std::vector<PlannedPoint> chosen;
  double spent = 0;
  for (const PlannedPoint& p : grid) {
    const double cost =
        (SamplesFor(p, o) + 1) * std::max(o.min_sample_seconds, p.expected_seconds);
    if (chosen.size() >= kMinPoints && spent + cost > o.curve_seconds) break;
    spent += cost;
    chosen.push_back(p);
  }
  return chosen;
}

// The layer counts a residual rebuild is timed at: 1, about half, and all.
std::vector<int64_t> GridLayers(int64_t num_layers) {
  std::vector<int64_t> layers = {1, std::max<int64_t>(1, num_layers / 2), num_layers};
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

}  // namespace

RebuildPages::RebuildPages(int64_t rows, const ModelConfig& c, uint32_t seed)
    : rows_(rows),
      dim_(c.dim),
      kv_dim_(c.kv_dim()),
      checkpoints_(RandomFloats(static_cast<size_t>(rows * c.dim), seed)),
      k_(static_cast<size_t>(rows * c.kv_dim())),
      v_(k_.size()) {}

int64_t RebuildPages::FirstRow(int64_t layer, int64_t tokens) const {
  KVL_CHECK_MSG(layer >= 0 && tokens > 0 && tokens <= rows_, "RebuildPages: the page does not fit");
  return (layer % (rows_ / tokens)) * tokens;
}

const float* RebuildPages::Checkpoints(int64_t layer, int64_t tokens) const {
  return checkpoints_.data() + FirstRow(layer, tokens) * dim_;
}
float* RebuildPages::K(int64_t layer, int64_t tokens) {
  return k_.data() + FirstRow(layer, tokens) * kv_dim_;
}
float* RebuildPages::V(int64_t layer, int64_t tokens) {
  return v_.data() + FirstRow(layer, tokens) * kv_dim_;
}

StatusOr<RecomputeCurves> MeasureRecomputeCurves(const Model& model, ThreadPool& pool,
                                                 const ops::OpsContext& ctx,
                                                 const CalibrateOptions& o,
                                                 std::span<const MatmulRate> rates,
                                                 const CalibrationProgress& progress) {
  const ModelConfig& c = model.config();
  // Expected seconds from the prefill-shaped rates (a page is many tokens per weight read).
  const MatmulRate& rate = rates.back();
  const double kv_flops_per_second = rate.kv_proj_gflops * 1e9;
  const double layer_flops_per_second = rate.layer_gflops * 1e9;
  // Attention per token and layer of context: q.k and p.v over every head, 2 FLOPs each, at
  // the layer rate (an underestimate of its time: it is not as efficient as a matmul).
  const double attention_flops = 4.0 * static_cast<double>(c.q_dim());

  std::vector<PlannedPoint> residual_grid, token_grid;
  for (int64_t t : kGridTokens) {
    for (int64_t l : GridLayers(c.num_layers)) {
      const double flops = static_cast<double>(t * l) * KvProjectionFlopsPerToken(c);
      residual_grid.push_back({{t, l, 0, 0}, flops / kv_flops_per_second});
    }
    // The grid's positions; where none but 0 fits the model's context (stories15M: 256), the
    // deepest position a page can sit at there, so that the curve still sees context.
    std::vector<int64_t> positions(std::begin(kGridPositions), std::end(kGridPositions));
    if (c.context_length > t && kGridPositions[1] + t > c.context_length) {
      positions.push_back(c.context_length - t);
    }
    for (int64_t p : positions) {
      if (c.context_length > 0 && p + t > c.context_length) continue;
      const double tl = static_cast<double>(t * c.num_layers);
      const double flops = tl * LayerFlopsPerToken(c) + tl * static_cast<double>(p) * attention_flops;
      token_grid.push_back({{t, c.num_layers, p, 0}, flops / layer_flops_per_second});
    }
  }
  std::vector<PlannedPoint> residual_plan = ChoosePoints(residual_grid, o);
  std::vector<PlannedPoint> token_plan = ChoosePoints(token_grid, o);

  // The decode step and prefill batch of the idle fraction, at a few contexts. A batch expected
  // to run long is sampled once, as a long recompute point is.
  const std::vector<int64_t> idle_contexts = DecodeIdleContexts(c.context_length);
  const PlannedPoint idle_batch{{kIdlePrefillTokens, c.num_layers, idle_contexts.back(), 0},
                                static_cast<double>(kIdlePrefillTokens * c.num_layers) *
                                    LayerFlopsPerToken(c) / layer_flops_per_second};
  const int idle_samples = SamplesFor(idle_batch, o);
  int64_t max_tokens = kIdlePrefillTokens;
  int64_t max_positions = idle_contexts.back() + kIdlePrefillTokens;
  int64_t samples = 3 * idle_samples * static_cast<int64_t>(idle_contexts.size());
  for (const auto* plan : {&residual_plan, &token_plan}) {
    for (const PlannedPoint& p : *plan) {
      max_tokens = std::max(max_tokens, p.shape.tokens);
      max_positions = std::max(max_positions, p.shape.position + p.shape.tokens);
      samples += SamplesFor(p, o);
    }
  }
  StageProgress stage(progress, "recompute", samples);

  ForwardOptions fo;
  fo.max_batch_tokens = max_tokens;
  fo.max_logit_rows = 1;
  fo.max_context = max_positions;
  fo.max_rebuild_rows = kStepRebuildRows;
  ops::OpsContext forward_ctx(ctx.isa(), &pool);
  Forward forward(model, forward_ctx, fo);

  // (a) From checkpoints, as the pager restores a checkpointed page: per layer, that layer's
  // [tokens][dim] page of checkpoints in, its [tokens][kv_dim] K and V rows out. Every layer has
  // pages of its own (RebuildPages), as a restore stages them: one page shared by every layer
  // would stay in the core's cache from layer to layer, which no restore's input does.
  // Up to kRebuildPagesBytes of them: a larger set (4096 tokens x 22 layers of TinyLlama's
  // checkpoints are 738 MiB) takes its pages in turn, each far past a core's cache already.
  constexpr int64_t kRebuildPagesBytes = int64_t{64} << 20;
  int64_t page_rows = 0;  // tokens x layers of the largest point, within kRebuildPagesBytes
  const int64_t rows_in_bound = kRebuildPagesBytes / (c.dim * static_cast<int64_t>(sizeof(float)));
  for (const PlannedPoint& p : residual_plan) {
    page_rows = std::max(page_rows, std::max(p.shape.tokens,
                                             std::min(p.shape.tokens * p.shape.layers, rows_in_bound)));
  }
  RebuildPages pages(page_rows, c, 2);
  std::vector<int64_t> positions(static_cast<size_t>(max_tokens));
  for (int64_t t = 0; t < max_tokens; ++t) positions[static_cast<size_t>(t)] = t;
  std::vector<RecomputePoint> residual_points;
  for (const PlannedPoint& planned : residual_plan) {
    RecomputePoint p = planned.shape;
    p.ms = 1e3 * MedianSecondsPerCall(SamplesFor(planned, o), o.min_sample_seconds, stage, [&] {
             for (int64_t l = 0; l < p.layers; ++l) {
               forward.RebuildLayerKv(l, pages.Checkpoints(l, p.tokens), positions.data(),
                                      p.tokens, DType::kF32, pages.K(l, p.tokens), DType::kF32,
                                      pages.V(l, p.tokens));
             }
           });
    residual_points.push_back(p);
  }

  // (b) From tokens: the page's tokens after p.position tokens of context (no logits: a page is
  // recomputed to refill K/V).
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> cache,
                       ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, max_positions));
  TokenBatch batch;
  std::vector<RecomputePoint> token_points;
  for (const PlannedPoint& planned : token_plan) {
    RecomputePoint p = planned.shape;
    batch.Clear();
    for (int64_t t = 0; t < p.tokens; ++t) {
      batch.Add(static_cast<int32_t>((t * 7 + 1) % c.vocab_size), p.position + t, 0, false);
    }
    p.ms = 1e3 * MedianSecondsPerCall(SamplesFor(planned, o), o.min_sample_seconds, stage,
                                      [&] { forward.Run(batch, *cache); });
    token_points.push_back(p);
  }

  // (c) The compute a decode step leaves idle: one token against a prefill batch, per token,
  // both after each context.
  // (d) The same step with rebuilt rows riding in it (the pager's rebuild in the step).
  RebuildRowsCache rebuilding(*cache, c);
  auto run_ms = [&](int64_t tokens, int64_t context, KvCache& kv) {
    batch.Clear();
    for (int64_t t = 0; t < tokens; ++t) {
      batch.Add(static_cast<int32_t>((t * 7 + 1) % c.vocab_size), context + t, 0, false);
    }
    return 1e3 * MedianSecondsPerCall(idle_samples, o.min_sample_seconds, stage,
                                      [&] { forward.Run(batch, kv); });
  };
  RecomputeCurves curves;
  for (int64_t context : idle_contexts) {
    DecodeIdlePoint point;
    point.context = context;
    point.step_ms = run_ms(1, context, *cache);
    point.rebuild_rows = kStepRebuildRows;
    point.step_with_rebuild_ms = run_ms(1, context, rebuilding);
    point.batch_ms_per_token =
        run_ms(kIdlePrefillTokens, context, *cache) / static_cast<double>(kIdlePrefillTokens);
    KVL_CHECK(curves.decode_idle.Add(point));
  }
  stage.Finish();
  curves.from_residual = FitRecomputeCurve(std::move(residual_points));
  curves.from_tokens = FitRecomputeCurve(std::move(token_points));
  return curves;
}

}  // namespace kvl::calibration_internal

namespace kvl {

std::vector<int64_t> DecodeIdleContexts(int64_t context_length) {
  // The longest context where the batch fits: kIdlePrefillTokens before the model's end.
  const int64_t longest =
      context_length > 0
          ? std::clamp<int64_t>(context_length - kIdlePrefillTokens, 0, kIdleLongContextTokens)
          : kIdleLongContextTokens;
  const int64_t shortest = std::min(kIdleShortContextTokens, longest);
  std::vector<int64_t> contexts = {shortest, (shortest + longest) / 2, longest};
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  return contexts;
}

}  // namespace kvl
