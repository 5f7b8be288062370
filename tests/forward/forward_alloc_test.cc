// Forward::Run in steady decode (four sequences, one token each) must not touch the heap once warm,
// on a contiguous cache and on the paged pool (with the KV manager's plan and commit in the same
// step), with attention-mass tracking on. This file also holds test_forward's allocation hooks.
#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <vector>

#include "alloc_counter.h"
#include "forward_harness.h"
#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/kv_manager.h"
#include "test_paths.h"

KVL_ALLOC_COUNTER_HOOKS()

namespace kvl {
namespace {

using ::kvl::testing::AllocCounter;

constexpr int kSeqs = 4;
constexpr int64_t kPromptTokens = 6;
constexpr int64_t kMaxContext = 256;

// A contiguous cache that also tracks attention mass, as the pager does for the paged pool.
class MassTrackingCache final : public KvCache {
 public:
  explicit MassTrackingCache(const ModelConfig& c)
      : inner_(std::move(
            ContiguousKvCache::Create(c.num_layers, c.kv_dim(), kSeqs, kMaxContext).value())),
        mass_(static_cast<size_t>(kSeqs * kMaxContext), 0.0f) {}
  int64_t kv_dim() const override { return inner_->kv_dim(); }
  int64_t num_layers() const override { return inner_->num_layers(); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override {
    return inner_->RowsAt(seq, layer, pos);
  }
  float* AttentionMass(int32_t seq) override {
    return &mass_[static_cast<size_t>(seq * kMaxContext)];
  }
  float mass(int32_t seq, int64_t pos) const {
    return mass_[static_cast<size_t>(seq * kMaxContext + pos)];
  }

 private:
  std::unique_ptr<ContiguousKvCache> inner_;
  std::vector<float> mass_;  // [seq][pos]
};

// Detached pages the paged cache never needs here (nothing is detached); it tracks attention mass.
class MassOnlyPages final : public KvDetachedPages {
 public:
  MassOnlyPages() : mass_(static_cast<size_t>(kSeqs * kMaxContext), 0.0f) {}
  KvCache::Rows RowsAt(int32_t, int64_t, int64_t, int64_t) override {
    KVL_CHECK_MSG(false, "no page is detached in this test");
    return {};
  }
  KvLayerRebuild BeginLayer(int64_t) override { return {}; }
  float* AttentionMass(int32_t seq) override {
    return &mass_[static_cast<size_t>(seq * kMaxContext)];
  }

 private:
  std::vector<float> mass_;  // [seq][pos]
};

// A model, its forward pass and four sequences decoding greedily. Step() may be handed a hook that
// runs before the forward pass (the paged test plans and commits the KV manager there).
class DecodeLoop {
 public:
  explicit DecodeLoop(ops::Isa isa)
      : model_(std::move(Model::Load(testing::Stories260KPath()).value())),
        pool_(2),
        ops_(isa, &pool_),
        forward_(*model_, ops_, ForwardOptions{16, 16, kMaxContext}) {
    batch_.tokens.reserve(16);
    batch_.positions.reserve(16);
    batch_.seq_ids.reserve(16);
    batch_.want_logits.reserve(16);
    const std::vector<int32_t> ids = SomeTokens(kPromptTokens, model_->config().vocab_size);
    for (int s = 0; s < kSeqs; ++s) {
      next_[s] = ids[static_cast<size_t>(s)];  // four different first tokens
      positions_[s] = 0;
    }
  }

  const ModelConfig& config() const { return model_->config(); }
  const std::array<int32_t, kSeqs>& next() const { return next_; }

  // One token per sequence at its next position, then the argmax of each logits row becomes its
  // sequence's next token. Only the first `logits_seqs` sequences ask for logits (the others
  // repeat their token), so a warm-up can start with fewer attention-mass rows than later steps
  // need. No gtest assertions here: they may allocate.
  void Step(KvCache& kv, int logits_seqs = kSeqs) {
    batch_.Clear();
    for (int s = 0; s < kSeqs; ++s) batch_.Add(next_[s], positions_[s]++, s, s < logits_seqs);
    forward_.Run(batch_, kv);
    const int64_t vocab = model_->config().vocab_size;
    for (int s = 0; s < logits_seqs; ++s) {
      const float* row = forward_.logits(s);
      int32_t best = 0;
      for (int32_t v = 1; v < vocab; ++v) best = row[v] > row[best] ? v : best;
      next_[s] = best;
    }
  }

 private:
  std::unique_ptr<Model> model_;
  ThreadPool pool_;
  ops::OpsContext ops_;
  Forward forward_;
  TokenBatch batch_;
  std::array<int32_t, kSeqs> next_{};
  std::array<int64_t, kSeqs> positions_{};
};

TEST(ForwardAllocTest, DecodeOnContiguousCacheDoesNotAllocate) {
  DecodeLoop loop(ops::BestIsa());
  MassTrackingCache kv(loop.config());
  // Warm-up with one sequence feeding attention mass; the counted steps have one to four, so the
  // mass scratch sized at the first step must already hold every later step's rows.
  for (int i = 0; i < 2; ++i) loop.Step(kv, /*logits_seqs=*/1);
  AllocCounter counter;
  for (int i = 0; i < 100; ++i) loop.Step(kv, 1 + i % kSeqs);
  const int64_t allocations = counter.Stop();
  EXPECT_EQ(allocations, 0);
  // Attention mass was really accumulated: each step that asked for sequence 2's logits (half of
  // the counted ones) added 1 over its positions.
  float total = 0.0f;
  for (int64_t p = 0; p < 102; ++p) total += kv.mass(2, p);
  EXPECT_NEAR(total, 50.0f, 1e-2f);
}

TEST(ForwardAllocTest, DecodeOnPagedCacheWithPlanAndCommitDoesNotAllocate) {
  DecodeLoop loop(ops::BestIsa());
  const ModelConfig& c = loop.config();
  KvManagerOptions options;
  options.layout = KvBlockLayout{16, c.num_layers, c.kv_dim(), 0, DType::kF16, DType::kF16};
  options.budget_bytes = 64 * options.layout.block_bytes();
  options.max_seqs = kSeqs;
  options.max_seq_tokens = kMaxContext;
  std::unique_ptr<KvManager> manager = std::move(KvManager::Create(options).value());
  std::unique_ptr<KvBlockStorage> storage =
      std::move(KvBlockStorage::Create(options.layout, manager->num_blocks()).value());
  MassOnlyPages pages;
  PagedKvCache kv(*manager, *storage, &pages);

  std::array<KvSeqStep, kSeqs> steps;
  for (int s = 0; s < kSeqs; ++s) steps[s] = KvSeqStep{s, std::span(&loop.next()[s], 1)};
  KvPlan plan;
  bool all_fit = true;
  // The KV manager learns each token as the forward pass is asked to compute it.
  auto step = [&] {
    manager->Plan(steps, &plan);
    all_fit &= plan.fits;
    if (!plan.fits) return;
    manager->Commit(plan);
    loop.Step(kv);
  };
  for (int i = 0; i < 40; ++i) step();  // warm-up: two block boundaries per sequence
  AllocCounter counter;
  for (int i = 0; i < 100; ++i) step();
  const int64_t allocations = counter.Stop();
  EXPECT_EQ(allocations, 0);
  EXPECT_TRUE(all_fit);
  EXPECT_EQ(manager->num_tokens(3), 140);
}

}  // namespace
}  // namespace kvl
