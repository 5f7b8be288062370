// The pages a residual rebuild is timed on (calibration_internal::RebuildPages): each layer reads
// a page of checkpoints of its own and writes K/V rows of its own, as a restore does, so that no
// layer's input is left in the core's cache by the layer before it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "calibrate/calibration_internal.h"
#include "kvl/model.h"

namespace kvl::calibration_internal {
namespace {

ModelConfig SmallShape() {
  ModelConfig c;
  c.dim = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  return c;
}

TEST(RebuildPagesTest, EachLayerReadsAndWritesAPageOfItsOwn) {
  const ModelConfig c = SmallShape();
  constexpr int64_t kTokens = 16, kLayers = 4;
  RebuildPages pages(kTokens * kLayers, c, 7);
  const size_t page_floats = static_cast<size_t>(kTokens * c.dim);
  for (int64_t l = 1; l < kLayers; ++l) {
    // The pages sit one after the other, a page apart: none overlaps the one before it.
    EXPECT_EQ(pages.Checkpoints(l, kTokens) - pages.Checkpoints(l - 1, kTokens),
              kTokens * c.dim);
    EXPECT_EQ(pages.K(l, kTokens) - pages.K(l - 1, kTokens), kTokens * c.kv_dim());
    EXPECT_EQ(pages.V(l, kTokens) - pages.V(l - 1, kTokens), kTokens * c.kv_dim());
    // And they hold other checkpoints (a layer does not reread the previous layer's input).
    EXPECT_NE(std::memcmp(pages.Checkpoints(l, kTokens), pages.Checkpoints(0, kTokens),
                          page_floats * sizeof(float)),
              0)
        << "layer " << l;
  }
  // K and V rows of one layer are apart too.
  EXPECT_NE(pages.K(0, kTokens), pages.V(0, kTokens));
}

TEST(RebuildPagesTest, SmallerPagesShareTheRoomOfTheLargestSet) {
  const ModelConfig c = SmallShape();
  RebuildPages pages(64, c, 7);
  // 64 rows: one layer of 64 tokens, or 4 layers of 16, or 64 layers of 1.
  EXPECT_EQ(pages.Checkpoints(0, 64), pages.Checkpoints(0, 16));
  EXPECT_EQ(pages.Checkpoints(3, 16) - pages.Checkpoints(0, 16), 3 * 16 * c.dim);
  EXPECT_EQ(pages.Checkpoints(63, 1) - pages.Checkpoints(0, 1), 63 * c.dim);
}

TEST(RebuildPagesTest, SameSeedSameCheckpoints) {
  const ModelConfig c = SmallShape();
  RebuildPages a(32, c, 5), b(32, c, 5), other(32, c, 6);
  const size_t bytes = static_cast<size_t>(32 * c.dim) * sizeof(float);
  EXPECT_EQ(std::memcmp(a.Checkpoints(0, 32), b.Checkpoints(0, 32), bytes), 0);
  EXPECT_NE(std::memcmp(a.Checkpoints(0, 32), other.Checkpoints(0, 32), bytes), 0);
}

TEST(RebuildPagesTest, LayersPastTheRoomTakeThePagesInTurn) {
  const ModelConfig c = SmallShape();
  RebuildPages pages(64, c, 7);  // room for 2 pages of 32 tokens
  EXPECT_EQ(pages.Checkpoints(2, 32), pages.Checkpoints(0, 32));
  EXPECT_EQ(pages.Checkpoints(3, 32), pages.Checkpoints(1, 32));
  EXPECT_NE(pages.Checkpoints(1, 32), pages.Checkpoints(0, 32));
  EXPECT_EQ(pages.K(5, 32), pages.K(1, 32));
}

TEST(RebuildPagesDeathTest, APageLargerThanTheRoomIsRefused) {
  const ModelConfig c = SmallShape();
  RebuildPages pages(64, c, 7);
  EXPECT_DEATH(pages.Checkpoints(0, 65), "does not fit");
  EXPECT_DEATH(pages.K(0, 0), "does not fit");
}

}  // namespace
}  // namespace kvl::calibration_internal
