// The lossless KV actions on every new architecture: under a budget that holds about two of six
// sequences, pages are demoted to RAM, kept as residual checkpoints (of every layer, or of every
// other layer with the layers between run again) or dropped and recomputed from their tokens, and the greedy output equals keep-all bit for bit. The prompts are longer
// than several of the test shapes' 6-token windows, so the rebuilt pages cross local layers'
// windows (Gemma) and every architecture's own K path (biases, Q/K norms, fused QKV, LongRoPE).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "engine/greedy_reply.h"
#include "engine/budget_tiers.h"
#include "kvl/engine.h"
#include "kvl/model.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

constexpr int64_t kContext = 256;
constexpr int32_t kSeqs = 6;
constexpr int32_t kNewTokens = 60;
constexpr int64_t kRunTokens = 64;  // -b on sliding-window shapes: their rings hold 64 + 5 rows

class ArchKvActionsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.shape = FindModelShape(GetParam()).value();
    o.weight_type = DType::kF32;
    o.seed = 11;
    o.output_path = (std::filesystem::temp_directory_path() /
                     fmt::format("kvl-arch-kv-{}-{}.gguf", GetParam(), ::getpid()))
                        .string();
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    path_ = o.output_path;
    const ModelConfig c = Model::Load(path_).value()->config();
    // A sliding-window shape's pool pages hold its global layers only; its local layers' rows
    // sit in one ring per sequence (window - 1 + kRunTokens rows), set aside from the budget.
    int64_t local = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) local += c.IsLocal(l) ? 1 : 0;
    full_page_bytes_ = 16 * c.num_layers * c.KvBytesPerTokenPerLayer(DType::kF32);
    page_bytes_ = 16 * (c.num_layers - local) * c.KvBytesPerTokenPerLayer(DType::kF32);
    ring_bytes_ = local == 0 ? 0
                             : kSeqs * (c.arch.sliding_window - 1 + kRunTokens) * local *
                                   c.KvBytesPerTokenPerLayer(DType::kF32);
    // Prices fixed rather than measured (as tests/engine/fixed_prices.h does for stories260K):
    // the forced policies decide what leaves; no calibration run per shape.
    prices_.model.layers = c.num_layers;
    prices_.recompute_from_residual.call_ms = 1;
    prices_.recompute_from_tokens.token_layer_ms = 10.0 / (16.0 * static_cast<double>(c.num_layers));
    prices_.memory_copy_gbps = 10;
    prices_.ram.read.gbps = prices_.ram.write.gbps = 10;
    vocab_ = c.vocab_size;
    windowed_ = c.arch.sliding_window > 0;
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // `released`: a sliding-window shape's local layers leave the pool (the rings are set aside
  // beside `budget_pages` pages of `page_bytes`).
  EngineOptions Options(int64_t budget_pages, int64_t page_bytes = 0, bool released = true) const {
    EngineOptions o;
    o.model_path = path_;
    o.num_threads = 2;
    o.context_length = kContext;
    o.max_seqs = kSeqs;
    if (ring_bytes_ > 0) o.batch_size = kRunTokens;
    // 0: the default budget (every sequence's whole context).
    o.kv_budget_bytes = budget_pages == 0 ? 0 : budget_pages * page_bytes + (released ? ring_bytes_ : 0);
    o.prefix_cache = false;  // resumed pages come from the actions, not the prefix cache
    o.cost_profile = prices_;
    o.cache_type_k = o.cache_type_v = "f32";  // the page and ring bytes above are f32's
    return o;
  }

  std::vector<std::vector<int32_t>> RunAll(Engine& e) const {
    std::vector<std::vector<int32_t>> out(kSeqs);
    for (int32_t i = 0; i < kSeqs; ++i) {
      Request r;
      for (int64_t k = 0; k < 40 + 5 * i; ++k) {
        r.prompt_ids.push_back(static_cast<int32_t>(3 + (k * 7919 + 101 * i + 13) % (vocab_ - 3)));
      }
      r.max_new_tokens = kNewTokens;
      r.sampling.temperature = 0;
      r.ignore_eos = true;
      EXPECT_TRUE(e.Submit(r, [&out, i](const TokenEvent& ev) {
                     EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                     if (ev.token >= 0) out[static_cast<size_t>(i)].push_back(ev.token);
                   }).ok());
    }
    e.RunUntilIdle();
    return out;
  }

  std::string path_;
  int64_t full_page_bytes_ = 0;  // every layer's K/V of 16 tokens
  int64_t page_bytes_ = 0;       // what a pool page holds with the local layers released
  int64_t ring_bytes_ = 0;
  int64_t vocab_ = 0;
  bool windowed_ = false;
  MachineProfile prices_;
};

TEST_P(ArchKvActionsTest, LosslessActionsMatchKeepAll) {
  std::vector<std::vector<int32_t>> keep_all;
  {
    EngineOptions o = Options(0);
    o.kv_window_release = false;  // keep-all: every layer's K/V in the pool's blocks
    std::unique_ptr<Engine> e = std::move(Engine::Create(o).value());
    keep_all = RunAll(*e);
    EXPECT_EQ(e->Metrics().preemptions, 0);
  }
  for (const auto& out : keep_all) ASSERT_EQ(out.size(), static_cast<size_t>(kNewTokens));
  struct Case {
    const char* policy;
    std::vector<std::string> tiers;
    KvAction action;
    int64_t checkpoint_every = 1;  // 2: every other layer's input kept, the others run again
  };
  for (const Case& c : {Case{"demote", {"ram:64MiB"}, KvAction::kDemoteRam},
                        Case{"recompute-residual", {"ram:64MiB"}, KvAction::kRecomputeResidual},
                        Case{"recompute-residual", {"ram:64MiB"}, KvAction::kRecomputeResidual, 2},
                        Case{"recompute-tokens", {}, KvAction::kRecomputeTokens}}) {
    // ~2.5 of the six 100-110-token sequences' K/V (with the local layers released: their
    // global layers'); where checkpoints are kept, as many bytes as before the release (the
    // checkpoints of every layer stay in the blocks). Partial-depth checkpoints keep every layer.
    const bool released = c.checkpoint_every == 1;
    const bool checkpoints = c.action == KvAction::kRecomputeResidual;
    EngineOptions o =
        Options(16, checkpoints || !released ? full_page_bytes_ : page_bytes_, released);
    o.kv_policy = c.policy;
    testing::SetTiersBesidePool(&o, c.tiers);
    o.kv_checkpoint_every = c.checkpoint_every;
    StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(RunAll(**e), keep_all) << GetParam() << " " << c.policy << " every "
                                     << c.checkpoint_every;
    const EngineMetrics m = (*e)->Metrics();
    EXPECT_GT(m.preemptions, 0) << c.policy;
    EXPECT_GT(m.kv_actions[static_cast<size_t>(c.action)].pages, 0) << c.policy;
    EXPECT_GT(m.kv_actions[static_cast<size_t>(c.action)].pages_restored, 0) << c.policy;
    if (windowed_) {
      // Sliding-window shapes run with their local layers' K/V released (one window per
      // sequence), except under partial-depth checkpoints (rebuilding the layers between two
      // checkpoints runs the local layers over their old windows), and a resumed sequence's
      // window came back exactly: rebuilt from checkpoints or from its tokens.
      EXPECT_EQ(m.kv_window_ring_bytes > 0, c.checkpoint_every == 1) << c.policy;
      if (c.checkpoint_every == 1 && c.action != KvAction::kRecomputeTokens) {
        EXPECT_GT(m.kv_window_rebuilds_from_residuals + m.kv_window_rebuilds_from_tokens, 0)
            << c.policy;
      }
    }
  }
}

// The store across requests and processes: a second engine on the same disk tier promotes the
// prompt's pages (every local and global layer's K/V) instead of computing them, and its reply is
// the first engine's, which is keep-all's.
TEST_P(ArchKvActionsTest, StoredPagesServeASecondEngineBitIdentically) {
  const std::string disk = (std::filesystem::temp_directory_path() /
                            fmt::format("kvl-arch-store-{}-{}.pages", GetParam(), ::getpid()))
                               .string();
  std::filesystem::remove(disk);
  std::vector<int32_t> prompt;
  for (int64_t k = 0; k < 100; ++k) {
    prompt.push_back(static_cast<int32_t>(3 + (k * 613 + 29) % (vocab_ - 3)));
  }
  EngineOptions o = Options(0);
  o.max_seqs = 2;
  o.prefix_cache = true;  // pages get their content ids, which the store files them under
  // Recomputing priced above a disk read, so that the store's pages are promoted.
  o.cost_profile->recompute_from_residual.call_ms = 5;
  o.cost_profile->recompute_from_tokens.token_layer_ms *= 5;
  o.cost_profile->disk_buffered.read.gbps = o.cost_profile->disk_buffered.write.gbps = 1;
  EngineOptions keep = o;
  keep.kv_window_release = false;  // keep-all: every layer's K/V in the pool's blocks
  const testing::GreedyReply keep_all =
      testing::GenerateGreedy(*testing::MakeEngine(keep), prompt, 24);
  o.kv_tiers = {"disk:" + disk + ":64MiB"};
  const testing::GreedyReply first = testing::GenerateGreedy(*testing::MakeEngine(o), prompt, 24);
  std::unique_ptr<Engine> second_engine = testing::MakeEngine(o);
  const testing::GreedyReply second = testing::GenerateGreedy(*second_engine, prompt, 24);
  std::filesystem::remove(disk);
  ASSERT_EQ(keep_all.tokens.size(), 24u);
  EXPECT_EQ(first.tokens, keep_all.tokens);
  EXPECT_EQ(second.tokens, keep_all.tokens);
  EXPECT_EQ(first.cached_prompt_tokens, 0);
  EXPECT_EQ(second.cached_prompt_tokens, (100 - 1) / 16 * 16);  // every full page but the last's
  // On a sliding-window shape the promoted pages hold the global layers only: the second engine
  // rebuilt the last window's local K/V from the prompt's tokens.
  if (windowed_) {
    EXPECT_EQ(second_engine->Metrics().kv_window_rebuilds_from_tokens, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ArchKvActionsTest,
                         ::testing::Values("test-llama3", "test-qwen2", "test-qwen3",
                                           "test-gemma2", "test-gemma3", "test-phi3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace kvl
