// The tiled attention over contexts of many tiles: prefill, chunked prefill and decode agree bit
// for bit; how the cache splits its rows into runs changes nothing; the attention mass adds one
// per step; evicted rows get no weight.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "forward/forward_harness.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/synthetic_model.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr int64_t kMaxContext = 256;

// A contiguous cache that hands out its rows in runs of at most max_run rows, can report a range
// of positions as evicted once they are written, and tracks attention mass.
class RunsCache final : public KvCache {
 public:
  RunsCache(const ModelConfig& c, int64_t max_run)
      : inner_(std::move(ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, kMaxContext).value())),
        max_run_(max_run),
        mass_(static_cast<size_t>(kMaxContext), 0.0f) {}
  int64_t kv_dim() const override { return inner_->kv_dim(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override {
    Rows rows = inner_->RowsAt(seq, layer, pos);
    rows.count = std::min(rows.count, max_run_);
    if (pos < drop_begin_) {
      rows.count = std::min(rows.count, drop_begin_ - pos);
    } else if (pos < drop_end_) {
      rows.count = std::min(rows.count, drop_end_ - pos);
      rows.kind = Rows::Kind::kDropped;
    }
    return rows;
  }
  float* AttentionMass(int32_t seq) override { return track_mass_ ? mass_.data() : nullptr; }

  void Drop(int64_t begin, int64_t end) {
    drop_begin_ = begin;
    drop_end_ = end;
  }
  void TrackMass() { track_mass_ = true; }
  const std::vector<float>& mass() const { return mass_; }

 private:
  std::unique_ptr<ContiguousKvCache> inner_;
  int64_t max_run_;
  int64_t drop_begin_ = kMaxContext, drop_end_ = kMaxContext;
  bool track_mass_ = false;
  std::vector<float> mass_;  // [pos]
};

// Logits of every position of ids, run in chunks of `chunk` tokens through `kv`.
std::vector<std::vector<float>> AllLogits(Forward& forward, KvCache& kv, int64_t vocab,
                                          const std::vector<int32_t>& ids, int64_t chunk,
                                          size_t begin = 0) {
  std::vector<std::vector<float>> out;
  for (; begin < ids.size(); begin += static_cast<size_t>(chunk)) {
    const size_t end = std::min(ids.size(), begin + static_cast<size_t>(chunk));
    TokenBatch batch;
    for (size_t i = begin; i < end; ++i) batch.Add(ids[i], static_cast<int64_t>(i), 0, true);
    forward.Run(batch, kv);
    for (int64_t r = 0; r < forward.num_logit_rows(); ++r) {
      out.emplace_back(forward.logits(r), forward.logits(r) + vocab);
    }
  }
  return out;
}

struct Runner {
  Runner(const std::string& path, ops::Isa isa, int threads)
      : model(std::move(Model::Load(path).value())),
        pool(threads),
        ops(isa, &pool),
        forward(*model, ops, ForwardOptions{64, 64, kMaxContext}) {}
  int64_t vocab() const { return model->config().vocab_size; }
  std::unique_ptr<Model> model;
  ThreadPool pool;
  ops::OpsContext ops;
  Forward forward;
};

// 200 positions are several tiles (64 positions each for these head sizes): prefill in chunks
// that straddle tile boundaries, and decode, give the same logits bit for bit, on every ISA, from
// runs of any length.
TEST(AttentionTilesTest, ManyTilesPrefillChunksDecodeAndRunLengthsAgree) {
  const std::string tiny = ::testing::TempDir() + "/attn-tiles-tiny.gguf";
  ASSERT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test"), DType::kF32, 3, tiny}).ok());
  for (const std::string& path : {testing::Stories260KPath(), tiny}) {
    for (ops::Isa isa : ops::RunnableIsas()) {
      Runner s(path, isa, 2);
      const std::vector<int32_t> ids = SomeTokens(200, s.vocab());
      std::vector<std::vector<float>> want;
      for (int64_t max_run : {int64_t{1000}, int64_t{16}, int64_t{5}}) {
        for (int64_t chunk : {int64_t{64}, int64_t{37}, int64_t{1}}) {
          RunsCache kv(s.model->config(), max_run);
          const auto got = AllLogits(s.forward, kv, s.vocab(), ids, chunk);
          ASSERT_EQ(got.size(), ids.size());
          if (want.empty()) {
            want = got;
            continue;
          }
          for (size_t t = 0; t < ids.size(); ++t) {
            ASSERT_EQ(got[t], want[t]) << path << " " << ops::IsaName(isa) << " run " << max_run
                                       << " chunk " << chunk << " pos " << t;
          }
        }
      }
    }
  }
}

// Every step adds the newest token's attention weights, averaged over layers and heads: 1 in all.
// Evicted positions get no weight, and what they leave is shared by the others.
TEST(AttentionTilesTest, MassAddsOnePerStepAndEvictedRowsGetNone) {
  Runner s(testing::Stories260KPath(), ops::BestIsa(), 2);
  RunsCache kv(s.model->config(), 16);
  const std::vector<int32_t> ids = SomeTokens(150, s.vocab());
  kv.TrackMass();
  AllLogits(s.forward, kv, s.vocab(), ids, 64);  // every token asks for logits: 150 mass rows
  double total = 0;
  for (float m : kv.mass()) total += m;
  EXPECT_NEAR(total, 150.0, 1e-3);

  // Evict [16, 48) and decode: the logits change, stay finite, and the evicted rows get nothing.
  std::vector<int32_t> longer = ids;
  longer.push_back(5);
  const std::vector<float> before = kv.mass();
  kv.Drop(16, 48);
  const auto dropped = AllLogits(s.forward, kv, s.vocab(), longer, 1, ids.size());
  ASSERT_EQ(dropped.size(), 1u);
  for (float x : dropped[0]) ASSERT_TRUE(std::isfinite(x));
  double added = 0;
  for (int64_t p = 0; p <= 150; ++p) {
    const float delta = kv.mass()[static_cast<size_t>(p)] - before[static_cast<size_t>(p)];
    if (p >= 16 && p < 48) {
      EXPECT_EQ(delta, 0.0f) << p;
    }
    added += delta;
  }
  EXPECT_NEAR(added, 1.0, 1e-4);

  RunsCache full(s.model->config(), 16);
  const auto kept = AllLogits(s.forward, full, s.vocab(), longer, 64);
  EXPECT_NE(kept.back(), dropped[0]);
}

}  // namespace
}  // namespace kvl
