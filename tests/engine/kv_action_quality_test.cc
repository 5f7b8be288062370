// Quality of each KV action through the real paged path (KvManager + KvPager + PagedKvCache +
// Forward), on stories260K: after every decode step, the action is applied to every page outside
// the attention sink and the recent window, and the next-token distribution is compared with
// keep-all's (mean KL divergence and top-1 agreement, teacher-forced on keep-all's greedy tokens).
// Compressed pages are read by the fused-dequantization kernels, streamed pages come back from
// the RAM tier layer by layer, evicted pages take no attention (eviction spares one page besides
// the sink and the window: the heaviest by attention mass, or for comparison the newest).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "kvl/forward.h"
#include "kvl/kv_pager.h"
#include "kvl/tokenizer.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr int32_t kBlock = 16;
constexpr int64_t kTotal = 192;     // tokens per prompt (prompt, then greedy keep-all tokens)
constexpr int64_t kScoreFrom = 64;  // positions scored: [kScoreFrom, kTotal)
constexpr int64_t kRecentBlocks = 2;
// Eviction keeps this many of the eligible pages (besides the sink and the recent window): the
// heaviest, or for comparison the newest. With one, the two choices differ on more prompts.
constexpr size_t kEvictKeepPages = 1;

enum class Treatment {
  kKeep,
  kInt8,
  kInt4,
  kDemoteRam,
  kRecomputeResidual,
  kEvictLightest,
  kEvictOldest
};

// One sequence in a paged pool, stepped token by token with a treatment applied between steps.
class PagedRun {
 public:
  PagedRun(const Model& model, ops::OpsContext& ops, DType k_type, DType v_type,
           bool checkpoints = false)
      : model_(model), forward_(model, ops, ForwardOptions{kTotal, 4, kTotal}) {
    const ModelConfig& c = model.config();
    KvManagerOptions o;
    o.layout =
        KvBlockLayout{kBlock, c.num_layers, c.kv_dim(), checkpoints ? c.dim : 0, k_type, v_type};
    o.budget_bytes = 64 * o.layout.block_bytes();  // keep-all of stories260K's whole context
    o.max_seqs = 1;
    manager_ = std::move(KvManager::Create(o).value());
    storage_ = std::move(KvBlockStorage::Create(o.layout, manager_->num_blocks()).value());
    pager_ = std::make_unique<KvPager>(*manager_, *storage_, 1, kTotal);
    pager_->set_track_attention(true);
    pager_->set_rebuilder(&forward_);
    cache_ = std::make_unique<PagedKvCache>(*manager_, *storage_, pager_.get());
    tier_ = MakeRamTier(RamTierOptions{});
    pager_->set_tiers({tier_.get(), nullptr});
    pager_->ReserveStaging(kTotal / kBlock, /*compresses=*/true);  // every page may stream
  }

  // Runs tokens[first, first + n) and returns the logits of the last one.
  std::vector<float> Run(const std::vector<int32_t>& tokens, int64_t first, int64_t n) {
    const KvSeqStep step{
        0, std::span(tokens).subspan(static_cast<size_t>(first), static_cast<size_t>(n))};
    const KvPlan plan = manager_->Plan(std::span(&step, 1));
    EXPECT_TRUE(plan.fits);
    manager_->Commit(plan);
    if (first == 0) pager_->StartSequence(0, &pages_);
    TokenBatch batch;
    for (int64_t p = first; p < first + n; ++p)
      batch.Add(tokens[static_cast<size_t>(p)], p, 0, p == first + n - 1);
    const SeqId seq = 0;
    pager_->BeginStep(std::span(&seq, 1));
    forward_.Run(batch, *cache_);
    EXPECT_TRUE(pager_->EndStep().empty());
    const float* logits = forward_.logits(0);
    return std::vector<float>(logits, logits + model_.config().vocab_size);
  }

  void Apply(Treatment t) {
    const std::vector<BlockId>& table = manager_->block_table(0);
    const int64_t full = manager_->num_tokens(0) / kBlock;
    const int64_t end =
        std::min<int64_t>(full, static_cast<int64_t>(table.size()) - 1) - kRecentBlocks;
    std::vector<int64_t> eligible;
    for (int64_t b = 1; b < end; ++b) {
      if (table[static_cast<size_t>(b)] != kNoBlock) eligible.push_back(b);
    }
    switch (t) {
      case Treatment::kKeep:
        return;
      case Treatment::kInt8:
      case Treatment::kInt4:
      case Treatment::kDemoteRam:
      case Treatment::kRecomputeResidual: {
        const KvAction a = t == Treatment::kInt8        ? KvAction::kCompressInt8
                           : t == Treatment::kInt4      ? KvAction::kCompressInt4
                           : t == Treatment::kDemoteRam ? KvAction::kDemoteRam
                                                        : KvAction::kRecomputeResidual;
        for (int64_t b : eligible) EXPECT_TRUE(Detach(b, a));
        return;
      }
      case Treatment::kEvictLightest:
      case Treatment::kEvictOldest: {
        // Keep the heaviest pages besides the sinks and the window (H2O's heavy hitters), or for
        // comparison the newest.
        if (t == Treatment::kEvictLightest) {
          std::stable_sort(eligible.begin(), eligible.end(), [&](int64_t a, int64_t b) {
            return pager_->PageMass(0, a) < pager_->PageMass(0, b);
          });
        }
        for (size_t i = 0; i + kEvictKeepPages < eligible.size(); ++i) {
          EXPECT_TRUE(Detach(eligible[i], KvAction::kEvict));
        }
        return;
      }
    }
  }

  // Takes one page of the sequence out of the pool through a one-action page plan.
  bool Detach(int64_t block_index, KvAction action) {
    KvPagePlan plan;
    plan.actions.push_back({0, block_index, action});
    plan.state_version = manager_->state_version();
    pager_->Apply(plan);
    return plan.actions[0].applied;
  }

  // Resident KV bytes (blocks and slabs) as a fraction of what f32 keep-all holds now.
  double resident_fraction() const {
    const ModelConfig& c = model_.config();
    const int64_t f32_block = 2 * c.num_layers * kBlock * c.kv_dim() * 4;
    const int64_t blocks = (manager_->num_tokens(0) + kBlock - 1) / kBlock;
    return static_cast<double>(manager_->stats().kv_bytes_used) /
           static_cast<double>(blocks * f32_block);
  }

 private:
  const Model& model_;
  Forward forward_;
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<KvPager> pager_;
  KvSequencePages pages_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<KvTier> tier_;
};

struct Quality {
  double mean_kld = 0;
  double top1 = 0;
  bool bit_identical = true;
  double resident_fraction = 0;    // mean resident KV bytes vs f32 keep-all's, over the steps
  std::vector<double> prompt_kld;  // mean KLD of each prompt
};

struct Prompt {
  std::vector<int32_t> tokens;             // the prompt, then keep-all's greedy tokens
  std::vector<std::vector<float>> logits;  // keep-all, by position
};

class KvActionQualityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = std::move(Model::Load(testing::Stories260KPath()).value()).release();
    tokenizer_ = std::move(Tokenizer::FromGguf(model_->file()).value()).release();
    // One thread: the pool's workers spin while they wait, and on a busy 2-core machine a
    // 2-thread pool made this suite 20x slower (18.7 s against 0.9 s) with the same figures.
    pool_ = new ThreadPool(1);
    ops_ = new ops::OpsContext(ops::BestIsa(), pool_);
    // Keep-all: each prompt continued greedily to kTotal tokens; its logits at every position.
    for (size_t i = 0; i < 6; ++i) {
      std::vector<int32_t> tokens = tokenizer_->Encode(testing::StoryPrompts()[i], true);
      PagedRun keep(*model_, *ops_, DType::kF32, DType::kF32);
      std::vector<std::vector<float>> logits;
      int64_t done = 0;
      while (static_cast<int64_t>(tokens.size()) < kTotal) {
        logits.resize(tokens.size());
        logits.back() = keep.Run(tokens, done, static_cast<int64_t>(tokens.size()) - done);
        done = static_cast<int64_t>(tokens.size());
        const auto& l = logits.back();
        tokens.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      }
      prompts_.push_back({tokens, logits});
    }
  }

  // The treatment applied before every decode step of every prompt, teacher-forced on keep-all's
  // tokens, against keep-all's logits.
  static Quality Measure(Treatment t, DType k_type = DType::kF32, DType v_type = DType::kF32) {
    Quality q;
    double kld = 0, agree = 0, resident = 0;
    int64_t count = 0;
    for (const auto& [tokens, keep_logits] : prompts_) {
      PagedRun run(*model_, *ops_, k_type, v_type, t == Treatment::kRecomputeResidual);
      run.Run(tokens, 0, kScoreFrom);
      double prompt_kld = 0;
      int64_t prompt_count = 0;
      for (int64_t pos = kScoreFrom; pos + 1 < kTotal; ++pos) {
        run.Apply(t);
        const std::vector<float> got = run.Run(tokens, pos, 1);
        const std::vector<float>& want = keep_logits[static_cast<size_t>(pos)];
        q.bit_identical =
            q.bit_identical && std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
        const ops::LogitsDivergence d =
            ops::CompareLogits(want.data(), got.data(), static_cast<int64_t>(want.size()));
        prompt_kld += d.kld;
        agree += d.same_top1;
        resident += run.resident_fraction();
        ++prompt_count;
      }
      kld += prompt_kld;
      count += prompt_count;
      q.prompt_kld.push_back(prompt_kld / static_cast<double>(prompt_count));
    }
    q.mean_kld = kld / static_cast<double>(count);
    q.top1 = agree / static_cast<double>(count);
    q.resident_fraction = resident / static_cast<double>(count);
    return q;
  }

  static void Print(const char* name, const Quality& q) {
    std::printf("  %-26s mean KLD %.3e  top-1 %.3f  resident KV %.2f of f32 keep-all%s\n", name,
                q.mean_kld, q.top1, q.resident_fraction,
                q.bit_identical ? "  (bit-identical)" : "");
  }

  static inline Model* model_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ThreadPool* pool_ = nullptr;
  static inline ops::OpsContext* ops_ = nullptr;
  static inline std::vector<Prompt> prompts_;
};

TEST_F(KvActionQualityTest, EachActionAgainstKeepAll) {
  std::printf(
      "KV actions on stories260K, 6 prompts x %lld decode steps, every page outside the "
      "sink and the last %lld pages acted on:\n",
      static_cast<long long>(kTotal - kScoreFrom - 1), static_cast<long long>(kRecentBlocks));
  const Quality keep = Measure(Treatment::kKeep);
  const Quality demote = Measure(Treatment::kDemoteRam);
  const Quality residual = Measure(Treatment::kRecomputeResidual);
  const Quality residual_f16 = Measure(Treatment::kRecomputeResidual, DType::kF16, DType::kF16);
  const Quality int8 = Measure(Treatment::kInt8);
  const Quality int4 = Measure(Treatment::kInt4);
  const Quality f16 = Measure(Treatment::kKeep, DType::kF16, DType::kF16);
  const Quality bf16 = Measure(Treatment::kKeep, DType::kBF16, DType::kBF16);
  Print("keep (f32)", keep);
  Print("demote-ram, streamed", demote);
  Print("recompute-residual, rebuilt", residual);
  Print("  the same, f16 cache", residual_f16);
  Print("compress int8", int8);
  Print("compress int4", int4);
  Print("-ctk/-ctv f16", f16);
  Print("-ctk/-ctv bf16", bf16);

  // Bounds are about 2x the KLD and a few points under the top-1 measured on x86 (scalar, AVX2 and
  // AVX-512 paths; 6 prompts x 127 steps), so a kernel or codec that gets worse fails while the
  // ISA paths' rounding differences (a few % of the f16/bf16 KLD, none elsewhere) do not.
  EXPECT_TRUE(keep.bit_identical);
  EXPECT_TRUE(demote.bit_identical);               // lossless: the same logits, bit for bit
  EXPECT_LT(demote.resident_fraction, 0.7);        // 0.52
  EXPECT_TRUE(residual.bit_identical);             // rebuilt K/V equal the stored ones
  EXPECT_EQ(residual_f16.mean_kld, f16.mean_kld);  // rebuilt f16 rows equal stored f16 rows
  EXPECT_LT(f16.mean_kld, 2e-6);                   // 6.6e-7 .. 7.0e-7 by ISA
  EXPECT_GE(f16.top1, 0.99);                       // 1.000
  EXPECT_NEAR(f16.resident_fraction, 0.5, 0.01);
  EXPECT_LT(bf16.mean_kld, 1e-4);  // 4.0e-5
  EXPECT_GE(bf16.top1, 0.98);      // 0.997 .. 0.999 by ISA
  // Compression really happened (the logits moved) and stayed close.
  EXPECT_FALSE(int8.bit_identical);
  EXPECT_LT(int8.mean_kld, 1.5e-5);        // 6.0e-6
  EXPECT_GE(int8.top1, 0.99);              // 1.000
  EXPECT_LT(int8.resident_fraction, 0.8);  // 0.73
  EXPECT_GT(int4.mean_kld, int8.mean_kld);
  EXPECT_LT(int4.mean_kld, 4e-4);                             // 1.8e-4
  EXPECT_GE(int4.top1, 0.97);                                 // 0.992
  EXPECT_LT(int4.resident_fraction, int8.resident_fraction);  // 0.69
}

TEST_F(KvActionQualityTest, EvictingByAttentionMassBeatsEvictingTheOldest) {
  const Quality heavy = Measure(Treatment::kEvictLightest);
  const Quality oldest = Measure(Treatment::kEvictOldest);
  Print("evict lightest (H2O)", heavy);
  Print("evict oldest (same count)", oldest);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    std::printf("    prompt %zu: mean KLD %.3e evicting the lightest, %.3e the oldest\n", i,
                heavy.prompt_kld[i], oldest.prompt_kld[i]);
  }
  EXPECT_LT(heavy.mean_kld, 3e-2);  // 1.45e-2 (no ISA path differs)
  EXPECT_GE(heavy.top1, 0.9);       // 0.954
  // Heavy hitters against the oldest pages, same page count: on most of these prompts the pages
  // with the most attention mass (mean per step since the page filled, which favours pages that
  // just left the recent window) are the newest ones, so both choices evict the same pages and
  // give the same KLD. Where they differ, mass wins: prompt 5 drops from 2.8e-2 to 5.3e-3; the
  // worst loss is 1% (prompt 3). Measured: mean KLD 1.448e-2 vs 1.830e-2, top-1 0.954 vs 0.951.
  EXPECT_LT(heavy.mean_kld, 0.9 * oldest.mean_kld);
  EXPECT_GE(heavy.top1, oldest.top1);
  size_t clear_wins = 0;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_LE(heavy.prompt_kld[i], 1.05 * oldest.prompt_kld[i]) << "prompt " << i;
    clear_wins += heavy.prompt_kld[i] < 0.5 * oldest.prompt_kld[i];
  }
  EXPECT_GE(clear_wins, 1u);
}

// -ctk / -ctv q8_0 and q4_0 against the f32 cache, keys only, values only and both; and the pager
// on q8_0 pages: streamed through the RAM tier they come back byte for byte (the same logits as
// keeping them), rebuilt from checkpoints they are requantized to the same bytes, and compressed
// to int4 they are dequantized first (ops::DequantizeRow) and encoded as f32 pages are. (An int8
// page would take more bytes than the q8_0 block it replaces: the engine never plans that, and
// KvPager::DetachPage refuses it, as the slabs of one block cannot hold it.)
TEST_F(KvActionQualityTest, QuantizedCacheTypesAgainstF32) {
  std::printf("KV cache types on stories260K against the f32 cache, 6 prompts x %lld steps:\n",
              static_cast<long long>(kTotal - kScoreFrom - 1));
  const DType f32 = DType::kF32, q8 = DType::kQ8_0, q4 = DType::kQ4_0;
  const Quality q8_k = Measure(Treatment::kKeep, q8, f32);
  const Quality q8_v = Measure(Treatment::kKeep, f32, q8);
  const Quality q8_kv = Measure(Treatment::kKeep, q8, q8);
  const Quality q4_k = Measure(Treatment::kKeep, q4, f32);
  const Quality q4_v = Measure(Treatment::kKeep, f32, q4);
  const Quality q4_kv = Measure(Treatment::kKeep, q4, q4);
  const Quality q8_demote = Measure(Treatment::kDemoteRam, q8, q8);
  const Quality q8_residual = Measure(Treatment::kRecomputeResidual, q8, q8);
  const Quality q8_int4 = Measure(Treatment::kInt4, q8, q8);
  Print("-ctk q8_0", q8_k);
  Print("-ctv q8_0", q8_v);
  Print("-ctk/-ctv q8_0", q8_kv);
  Print("-ctk q4_0", q4_k);
  Print("-ctv q4_0", q4_v);
  Print("-ctk/-ctv q4_0", q4_kv);
  Print("q8_0, demote-ram", q8_demote);
  Print("q8_0, recompute-residual", q8_residual);
  Print("q8_0, compress int4", q8_int4);

  // Bounds about 2x the KLD and a few points under the top-1 measured (scalar, AVX2, AVX-512 agree
  // to the digits shown). Keys suffer far more than values: keys have outlier channels (why KIVI
  // and our int8 / int4 pages quantize them per channel), and a block of 32 shares one scale
  // across them; on stories260K a block spans four 8-wide heads, so one head's outlier sets the
  // scale of the other three, and at 4 bits their keys mostly round to zero. Values are fine at
  // 4 bits. Measured: KLD / top-1
  //   q8_0 K 1.51e-3 / 0.978, V 7.46e-6 / 0.999, both 1.44e-3 / 0.978;
  //   q4_0 K 0.844 / 0.579,   V 1.82e-3 / 0.972, both 0.822 / 0.589.
  EXPECT_LT(q8_kv.mean_kld, 3e-3);
  EXPECT_GE(q8_kv.top1, 0.95);
  EXPECT_LT(q8_k.mean_kld, 3e-3);
  EXPECT_GE(q8_k.top1, 0.95);
  EXPECT_LT(q8_v.mean_kld, 2e-5);
  EXPECT_GE(q8_v.top1, 0.99);
  EXPECT_LT(q4_v.mean_kld, 4e-3);
  EXPECT_GE(q4_v.top1, 0.94);
  EXPECT_LT(q4_k.mean_kld, 1.2);
  EXPECT_GE(q4_k.top1, 0.45);
  EXPECT_LT(q4_kv.mean_kld, 1.2);
  EXPECT_GE(q4_kv.top1, 0.45);
  EXPECT_GT(q4_kv.mean_kld, q8_kv.mean_kld);
  EXPECT_NEAR(q8_kv.resident_fraction, 34.0 / 128.0, 0.01);
  EXPECT_NEAR(q4_kv.resident_fraction, 18.0 / 128.0, 0.01);
  // Streaming and rebuilding are lossless on q8_0 pages: the very logits of keeping them.
  EXPECT_EQ(q8_demote.mean_kld, q8_kv.mean_kld);
  EXPECT_EQ(q8_demote.top1, q8_kv.top1);
  EXPECT_EQ(q8_residual.mean_kld, q8_kv.mean_kld);
  EXPECT_LT(q8_demote.resident_fraction, q8_kv.resident_fraction);
  // Compressing q8_0 pages to int4 adds the codec's error to q8_0's, and saves bytes.
  EXPECT_GT(q8_int4.mean_kld, q8_kv.mean_kld);
  EXPECT_LT(q8_int4.mean_kld, 3.5e-3);  // 1.68e-3
  EXPECT_GE(q8_int4.top1, 0.95);       // 0.979
  EXPECT_LT(q8_int4.resident_fraction, q8_kv.resident_fraction);
}

}  // namespace
}  // namespace kvl
