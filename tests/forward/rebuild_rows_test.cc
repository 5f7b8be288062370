// Pages kept as residual checkpoints are rebuilt as extra rows of a forward run
// (KvLayerRebuild): their K and V in the layer's own K and V matmuls, and, where a layer keeps no
// checkpoint, the layer before run whole for them as for a prefill chunk's rows. Both rest on
// the kernels' batch invariance: a rebuilt row must equal, bit for bit, what the forward pass
// stored when the token was first run, whatever rows it runs beside (a decode step's tokens, other
// pages) and whatever chunks the token was first computed in.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "forward/forward_harness.h"
#include "kvl/ops.h"
#include "kvl/synthetic_model.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr int64_t kPrefillTokens = 20;  // in chunks of 7
constexpr int64_t kTokens = 48;         // the rest one decode step at a time
constexpr int64_t kPageFirst = 16;      // the page rebuilt: positions [16, 32)
constexpr int64_t kPageTokens = 16;

// The page's rows at every layer, with checkpoints at the layers `checkpoint_every` divides
// (the others carried from the layer before); each layer's K and V written to a buffer of its own.
class PageSource final : public KvRebuildSource {
 public:
  PageSource(ContiguousKvCache& kv, const ModelConfig& c, int64_t checkpoint_every,
             int64_t input_shift = 0)
      : kv_(kv), c_(c), every_(checkpoint_every), shift_(input_shift) {
    for (int64_t t = 0; t < kPageTokens; ++t) positions_.push_back(kPageFirst + t);
    seqs_.assign(static_cast<size_t>(kPageTokens), 0);
    const size_t rows = static_cast<size_t>(kPageTokens * c.kv_dim());
    k_.assign(static_cast<size_t>(c.num_layers), std::vector<float>(rows));
    v_.assign(static_cast<size_t>(c.num_layers), std::vector<float>(rows));
    input_.resize(static_cast<size_t>(kPageTokens * c.dim));
  }

  KvLayerRebuild Layer(int64_t layer) override {
    KvLayerRebuild r;
    r.rows = kPageTokens;
    r.positions = positions_.data();
    r.seq_ids = seqs_.data();
    if (layer % every_ == 0) {
      // `shift_` hands a later layer's checkpoint instead: a wrong input the check must catch.
      const int64_t from = std::min(layer + shift_, c_.num_layers - 1);
      for (int64_t t = 0; t < kPageTokens; ++t) {
        std::memcpy(&input_[static_cast<size_t>(t * c_.dim)], kv_.ResidualAt(0, from, kPageFirst + t),
                    sizeof(float) * static_cast<size_t>(c_.dim));
      }
      r.input = input_.data();
    }
    r.advance = layer + 1 < c_.num_layers && (layer + 1) % every_ != 0;
    r.k_out = k_[static_cast<size_t>(layer)].data();
    r.v_out = v_[static_cast<size_t>(layer)].data();
    return r;
  }

  // Rows whose rebuilt K or V differs in any bit from what the cache stored, over every layer.
  int64_t DifferingRows() {
    int64_t differing = 0;
    const size_t kv_dim = static_cast<size_t>(c_.kv_dim());
    for (int64_t l = 0; l < c_.num_layers; ++l) {
      for (int64_t t = 0; t < kPageTokens; ++t) {
        const KvCache::Rows stored = kv_.RowsAt(0, l, kPageFirst + t);
        const size_t at = static_cast<size_t>(t) * kv_dim;
        differing += std::memcmp(&k_[static_cast<size_t>(l)][at], stored.k, kv_dim * sizeof(float)) != 0 ||
                     std::memcmp(&v_[static_cast<size_t>(l)][at], stored.v, kv_dim * sizeof(float)) != 0;
      }
    }
    return differing;
  }

 private:
  ContiguousKvCache& kv_;
  const ModelConfig& c_;
  int64_t every_, shift_;
  std::vector<int64_t> positions_;
  std::vector<int32_t> seqs_;
  std::vector<float> input_;
  std::vector<std::vector<float>> k_, v_;
};

// A cache whose rows are the contiguous cache's and which hands a page's rebuild to every run,
// as the pager does inside a step.
class RebuildingCache final : public KvCache {
 public:
  RebuildingCache(ContiguousKvCache& kv, PageSource& source) : kv_(kv), source_(source) {}
  int64_t kv_dim() const override { return kv_.kv_dim(); }
  int64_t num_layers() const override { return kv_.num_layers(); }
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override { return kv_.RowsAt(seq, layer, pos); }
  float* ResidualAt(int32_t seq, int64_t layer, int64_t pos) override {
    return kv_.ResidualAt(seq, layer, pos);
  }
  KvLayerRebuild BeginLayer(int64_t layer) override { return source_.Layer(layer); }

 private:
  ContiguousKvCache& kv_;
  PageSource& source_;
};

std::vector<std::string> ModelPaths(std::string* q8) {
  std::vector<std::string> paths = {testing::Stories260KPath()};
  // A q8_0 model too: its matmuls quantize the activations per row (the int8 GEMM path).
  *q8 = ::testing::TempDir() + "/rebuild-rows-" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(WriteSyntheticModel({*FindModelShape("tiny-test"), DType::kQ8_0, 3, *q8}).ok());
  paths.push_back(*q8);
  return paths;
}

void RunSequence(Harness& h, std::vector<int32_t>* ids) {
  const ModelConfig& c = h.model->config();
  *ids = SomeTokens(kTokens, c.vocab_size);
  const std::vector<int32_t> prefill(ids->begin(), ids->begin() + kPrefillTokens);
  h.AllLogits(prefill, 7);
  for (int64_t p = kPrefillTokens; p < kTokens; ++p) {
    TokenBatch step;
    step.Add((*ids)[static_cast<size_t>(p)], p, 0, true);
    h.forward.Run(step, *h.kv);
  }
}

TEST(RebuildRowsTest, APageRebuiltOnItsOwnIsBitIdentical) {
  std::string q8;
  for (const std::string& path : ModelPaths(&q8)) {
    for (ops::Isa isa : ops::RunnableIsas()) {
      Harness h(path, isa, 2, 64, /*residuals=*/true);
      std::vector<int32_t> ids;
      RunSequence(h, &ids);
      for (int64_t every : {1, 2, 3}) {
        PageSource page(*h.kv, h.model->config(), every);
        h.forward.Rebuild(page, h.kv.get());
        EXPECT_EQ(page.DifferingRows(), 0) << path << " " << ops::IsaName(isa) << " s=" << every;
      }
    }
  }
  std::remove(q8.c_str());
}

// Inside a step: the page's rows ride in a decode step of the same sequence (after every token
// it attends to), and the step's own logits are those of the step without them.
TEST(RebuildRowsTest, APageRebuiltInsideAStepIsBitIdenticalAndChangesNothingElse) {
  std::string q8;
  for (const std::string& path : ModelPaths(&q8)) {
    for (ops::Isa isa : ops::RunnableIsas()) {
      for (int64_t every : {1, 2}) {
        Harness plain(path, isa, 1, 64, /*residuals=*/true);
        Harness riding(path, isa, 1, 64, /*residuals=*/true);
        std::vector<int32_t> ids;
        RunSequence(plain, &ids);
        RunSequence(riding, &ids);
        const int64_t vocab = plain.model->config().vocab_size;
        TokenBatch step;
        step.Add(ids[5], kTokens, 0, true);
        plain.forward.Run(step, *plain.kv);
        const std::vector<float> expected(plain.forward.logits(0), plain.forward.logits(0) + vocab);
        PageSource page(*riding.kv, riding.model->config(), every);
        RebuildingCache cache(*riding.kv, page);
        riding.forward.Run(step, cache);
        EXPECT_EQ(page.DifferingRows(), 0) << path << " s=" << every;
        EXPECT_EQ(std::memcmp(riding.forward.logits(0), expected.data(), sizeof(float) * vocab), 0)
            << path << " s=" << every;
      }
    }
  }
  std::remove(q8.c_str());
}

// The check above can fail: a page rebuilt from the next layer's checkpoints is not the page.
TEST(RebuildRowsTest, AWrongInputIsCaught) {
  Harness h(testing::Stories260KPath(), ops::BestIsa(), 2, 64, /*residuals=*/true);
  std::vector<int32_t> ids;
  RunSequence(h, &ids);
  PageSource page(*h.kv, h.model->config(), 2, /*input_shift=*/1);
  h.forward.Rebuild(page, h.kv.get());
  EXPECT_GT(page.DifferingRows(), 0);
}

}  // namespace
}  // namespace kvl
