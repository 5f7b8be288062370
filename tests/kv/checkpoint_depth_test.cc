#include "kvl/checkpoint_depth.h"

#include <gtest/gtest.h>

namespace kvl {
namespace {

// A TinyLlama-like page: 22 layers, 16 tokens x 2048 floats of checkpoint per layer.
CheckpointDepthPrices Prices(double memory_price_ms_per_mib) {
  CheckpointDepthPrices p;
  p.num_layers = 22;
  p.page_residual_bytes = 22 * 16 * 2048 * 4;
  p.rebuild_kv_ms = 2.0;
  p.recompute_tokens_ms = 24.0;  // 1 ms per layer beyond the K/V projections
  p.memory_price_ms_per_mib = memory_price_ms_per_mib;
  return p;
}

TEST(CheckpointDepthTest, BytesShrinkAndRebuildGrowsWithTheStride) {
  const CheckpointDepthPrices p = Prices(0);
  const CheckpointDepthCost one = PriceCheckpointDepth(p, 1);
  EXPECT_EQ(one.layers_kept, 22);
  EXPECT_EQ(one.bytes, p.page_residual_bytes);
  EXPECT_DOUBLE_EQ(one.rebuild_ms, 2.0);  // K/V of every layer, nothing run
  const CheckpointDepthCost four = PriceCheckpointDepth(p, 4);
  EXPECT_EQ(four.layers_kept, 6);  // layers 0, 4, 8, 12, 16, 20
  EXPECT_EQ(four.bytes, 6 * 16 * 2048 * 4);
  EXPECT_DOUBLE_EQ(four.rebuild_ms, 2.0 + 16 * 1.0);  // 16 layers run whole
  const CheckpointDepthCost all = PriceCheckpointDepth(p, 22);
  EXPECT_EQ(all.layers_kept, 1);
  EXPECT_DOUBLE_EQ(all.rebuild_ms, 2.0 + 21 * 1.0);
}

TEST(CheckpointDepthTest, TheChoiceFollowsThePriceOfMemory) {
  // Free memory: every layer kept, nothing run.
  StatusOr<CheckpointDepthChoice> free = ChooseCheckpointDepth(Prices(0));
  ASSERT_TRUE(free.ok());
  EXPECT_EQ(free->every, 1);
  // Candidates 1, 2, 4, 8, 16 and 22.
  ASSERT_EQ(free->costs.size(), 6u);
  EXPECT_EQ(free->costs.back().every, 22);
  // Memory dear: one checkpoint layer.
  StatusOr<CheckpointDepthChoice> dear = ChooseCheckpointDepth(Prices(1e4));
  ASSERT_TRUE(dear.ok());
  EXPECT_EQ(dear->every, 22);
  // Both terms are linear in the layers kept: a checkpoint layer is 0.125 MiB, a layer run 1 ms,
  // so 8 ms per MiB is the break-even price; just under it every layer is kept, just over it one.
  EXPECT_EQ(ChooseCheckpointDepth(Prices(7))->every, 1);
  EXPECT_EQ(ChooseCheckpointDepth(Prices(9))->every, 22);
}

TEST(CheckpointDepthTest, ARebuildTimeLimitPicksTheSparsestStrideInTime) {
  CheckpointDepthPrices p = Prices(1e4);
  p.max_rebuild_ms = 18.5;  // s = 4 rebuilds in 18 ms, s = 8 in 21
  StatusOr<CheckpointDepthChoice> choice = ChooseCheckpointDepth(p);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->every, 4);
  EXPECT_NE(choice->Explain().find("every  4 layers"), std::string::npos);
  p.max_rebuild_ms = 1;  // nothing is fast enough: every layer kept
  EXPECT_EQ(ChooseCheckpointDepth(p)->every, 1);
}

TEST(CheckpointDepthTest, PricesThatCannotBeComparedAreRefused) {
  CheckpointDepthPrices p = Prices(1);
  p.num_layers = 0;
  EXPECT_EQ(ChooseCheckpointDepth(p).status().code(), StatusCode::kInvalidArgument);
  p = Prices(1);
  p.rebuild_kv_ms = -1;
  EXPECT_EQ(ChooseCheckpointDepth(p).status().code(), StatusCode::kInvalidArgument);
  p = Prices(1);
  p.max_rebuild_ms = -1;
  EXPECT_EQ(ChooseCheckpointDepth(p).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl
