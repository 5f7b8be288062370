// Sliding-window layers in the KV hierarchy (kvl/kv_window_release.h): a Gemma-3-shaped chat
// whose history grows to many windows reuses it every turn (the pool's prefix, its last window's
// local K/V rebuilt from tokens or from checkpoints), bit-identical to an engine that keeps every
// layer's K/V, while the pool holds the global layer's K/V and the local layers' rows of one
// window (and one forward run) only.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "engine/greedy_reply.h"  // testing::MakeEngine
#include "kvl/engine.h"
#include "kvl/model.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

constexpr int32_t kTurns = 7;
constexpr int32_t kReplyTokens = 10;
constexpr int64_t kRunTokens = 8;  // -b: the ring holds window - 1 + this many rows

class WindowReleaseTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.shape = FindModelShape(GetParam()).value();
    o.weight_type = DType::kF32;
    o.seed = 5;
    o.output_path = (std::filesystem::temp_directory_path() /
                     fmt::format("kvl-window-{}-{}.gguf", GetParam(), ::getpid()))
                        .string();
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    path_ = o.output_path;
    config_ = Model::Load(path_).value()->config();
    ASSERT_GT(config_.arch.sliding_window, 0);
    // Fixed prices (no calibration per shape): rebuilding from checkpoints far cheaper than
    // running tokens, so a pool that keeps checkpoints rebuilds windows from them.
    prices_.model.layers = config_.num_layers;
    prices_.recompute_from_residual.call_ms = 0.01;
    prices_.recompute_from_tokens.token_layer_ms = 1.0;
    prices_.memory_copy_gbps = 10;
    prices_.ram.read.gbps = prices_.ram.write.gbps = 10;
  }
  void TearDown() override { std::filesystem::remove(path_); }

  EngineOptions Options(bool release) const {
    EngineOptions o;
    o.model_path = path_;
    o.num_threads = 2;
    o.context_length = 512;
    o.max_seqs = 1;
    o.block_tokens = 4;  // a turn reuses all of its history but the last (partial) page
    o.batch_size = kRunTokens;
    o.prefix_cache = true;
    o.kv_window_release = release;
    o.cost_profile = prices_;
    o.cache_type_k = o.cache_type_v = "f32";  // the block and ring bytes below are f32's
    return o;
  }

  // Turn k's prompt: the history (every earlier prompt and reply) and a new user message.
  struct Chat {
    std::vector<std::vector<int32_t>> replies;
    // Each generated token's log-probability: the log-softmax of every logit, so a window row
    // off by one bit anywhere shows here even where the greedy token does not change.
    std::vector<std::vector<float>> logprobs;
    std::vector<int64_t> history;  // per turn: the tokens before its new message
    std::vector<int64_t> cached;
    EngineMetrics metrics;
  };
  Chat RunChat(const EngineOptions& o) const {
    std::unique_ptr<Engine> e = testing::MakeEngine(o);
    Chat chat;
    if (e == nullptr) return chat;
    std::vector<int32_t> prompt;
    for (int32_t turn = 0; turn < kTurns; ++turn) {
      chat.history.push_back(static_cast<int64_t>(prompt.size()));
      const int64_t message = turn == 0 ? 80 : 9 + turn;
      for (int64_t k = 0; k < message; ++k) {
        prompt.push_back(
            static_cast<int32_t>(3 + (k * 7919 + 131 * turn + 17) % (config_.vocab_size - 3)));
      }
      Request r;
      r.prompt_ids = prompt;
      r.max_new_tokens = kReplyTokens;
      r.sampling.temperature = 0;
      r.ignore_eos = true;
      r.top_logprobs = 0;
      std::vector<int32_t> reply;
      std::vector<float> logprobs;
      int64_t cached = -1;
      EXPECT_TRUE(e->Submit(r, [&](const TokenEvent& ev) {
                     EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
                     if (ev.token >= 0) {
                       reply.push_back(ev.token);
                       logprobs.push_back(ev.logprob);
                     }
                     if (ev.finished) cached = ev.cached_prompt_tokens;
                   }).ok());
      e->RunUntilIdle();
      chat.replies.push_back(reply);
      chat.logprobs.push_back(logprobs);
      chat.cached.push_back(cached);
      prompt.insert(prompt.end(), reply.begin(), reply.end());
    }
    chat.metrics = e->Metrics();
    return chat;
  }

  // One block's K+V bytes of `layers` layers at f32.
  int64_t BlockBytes(int64_t layers) const { return 4 * layers * 2 * config_.kv_dim() * 4; }

  std::string path_;
  ModelConfig config_;
  MachineProfile prices_;
};

TEST_P(WindowReleaseTest, ChatReusesItsHistoryWithOneWindowOfLocalKv) {
  const Chat keep_all = RunChat(Options(false));
  const Chat windowed = RunChat(Options(true));
  ASSERT_EQ(windowed.replies.size(), static_cast<size_t>(kTurns));
  EXPECT_EQ(windowed.replies, keep_all.replies);
  EXPECT_EQ(windowed.logprobs, keep_all.logprobs);
  const int64_t window = config_.arch.sliding_window;
  int64_t local = 0;
  for (int64_t l = 0; l < config_.num_layers; ++l) local += config_.IsLocal(l) ? 1 : 0;
  const int64_t global = config_.num_layers - local;
  for (int32_t turn = 1; turn < kTurns; ++turn) {
    const double history = static_cast<double>(windowed.history[static_cast<size_t>(turn)]);
    EXPECT_GT(history, 10.0 * static_cast<double>(window));  // many windows long
    EXPECT_GE(static_cast<double>(windowed.cached[static_cast<size_t>(turn)]), 0.95 * history)
        << "turn " << turn;
    EXPECT_EQ(windowed.cached[static_cast<size_t>(turn)], keep_all.cached[static_cast<size_t>(turn)]);
  }
  // Every turn after the first started from a prefix without its local rows: the window was
  // rebuilt from the tokens of its receptive field only (window - 1 per local layer), never the
  // history.
  const EngineMetrics& m = windowed.metrics;
  EXPECT_EQ(m.kv_window_rebuilds_from_tokens, kTurns - 1);
  EXPECT_EQ(m.kv_window_rebuilds_from_residuals, 0);
  EXPECT_LE(m.kv_window_tokens_rebuilt, (kTurns - 1) * local * (window - 1));
  EXPECT_EQ(keep_all.metrics.kv_window_ring_bytes, 0);
  // The pool's bytes: blocks of the global layers only (the same blocks as keep-all's, at
  // global / num_layers of the bytes), and a ring of window - 1 + one run's rows per local layer.
  EXPECT_EQ(m.kv.blocks_used_peak, keep_all.metrics.kv.blocks_used_peak);
  EXPECT_EQ(m.kv.kv_bytes_peak, m.kv.blocks_used_peak * BlockBytes(global));
  EXPECT_EQ(keep_all.metrics.kv.kv_bytes_peak,
            keep_all.metrics.kv.blocks_used_peak * BlockBytes(config_.num_layers));
  EXPECT_EQ(m.kv_window_ring_bytes,
            (window - 1 + kRunTokens) * local * 2 * config_.kv_dim() * 4);
  const int64_t last_turn_tokens =
      windowed.history.back() + static_cast<int64_t>(windowed.replies.back().size()) + 9 + kTurns;
  EXPECT_LT(m.kv_window_ring_bytes * 5, last_turn_tokens * local * 2 * config_.kv_dim() * 4);
  EXPECT_LT(m.kv_resident_bytes_peak, keep_all.metrics.kv_resident_bytes_peak);
}

// A pool that keeps residual checkpoints of every layer rebuilds a cached prefix's window from
// them (priced far below running its tokens here): the same replies.
TEST_P(WindowReleaseTest, WindowsRebuiltFromCheckpointsMatchKeepAll) {
  EngineOptions keep = Options(false);
  keep.kv_policy = "recompute-residual";
  keep.kv_tiers = {"ram:64MiB"};
  EngineOptions release = keep;
  release.kv_window_release = true;
  const Chat keep_all = RunChat(keep);
  const Chat windowed = RunChat(release);
  ASSERT_EQ(windowed.replies.size(), static_cast<size_t>(kTurns));
  EXPECT_EQ(windowed.replies, keep_all.replies);
  EXPECT_EQ(windowed.logprobs, keep_all.logprobs);
  EXPECT_EQ(windowed.metrics.kv_window_rebuilds_from_residuals, kTurns - 1);
  EXPECT_EQ(windowed.metrics.kv_window_rebuilds_from_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowReleaseTest,
                         ::testing::Values("test-gemma3", "test-gemma2"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace kvl
