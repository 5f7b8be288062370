// The forward pass's scratch follows its rows: an engine held to a KV budget picks its step's
// rows by Forward::ScratchBytesPerRow (kvl/engine.h, Engine::step_tokens), so the estimate must
// be what a Forward really reserves, and a smaller max_batch_tokens must reserve less.
#include <gtest/gtest.h>

#include "forward_harness.h"
#include "test_paths.h"

namespace kvl {
namespace {

TEST(ForwardScratchTest, ActivationsAreReservedPerRowAsEstimated) {
  Harness small(testing::Stories260KPath(), ops::BestIsa(), 1, 64);
  Harness large(testing::Stories260KPath(), ops::BestIsa(), 1, 512);
  const int64_t per_row = Forward::ScratchBytesPerRow(small.model->config());
  ASSERT_GT(per_row, 0);
  const int64_t small_bytes = small.forward.activation_bytes();
  const int64_t large_bytes = large.forward.activation_bytes();
  // The activations are the estimate less the int8 copy of a row (held by ops::OpsContext): at
  // least 80% of it and never more.
  EXPECT_LE(small_bytes, 64 * per_row);
  EXPECT_GE(small_bytes, 64 * per_row * 8 / 10);
  // Eight times the rows, eight times the activations.
  EXPECT_EQ(large_bytes, 8 * small_bytes);
}

TEST(ForwardScratchTest, TinyLlamaShapeRowIsAboutNinetyKiB) {
  // The figure the engine's budget rule is sized by (docs/BENCHMARKS.md, disk-only turns):
  // TinyLlama-1.1B's shape, dim 2048, 32 heads of 64, 4 KV heads, ffn 5632.
  ModelConfig c;
  c.dim = 2048;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.ffn_dim = 5632;
  const int64_t per_row = Forward::ScratchBytesPerRow(c);
  EXPECT_GT(per_row, 85 * 1024);
  EXPECT_LT(per_row, 100 * 1024);
}

}  // namespace
}  // namespace kvl
