// KvWindowRelease without a model: the ring's rows as runs claim them (the rows a window still
// reads come back as written, older ones are released), the receptive field of a rebuild from
// tokens, and the rebuild the prices choose.
#include "kvl/kv_window_release.h"

#include <gtest/gtest.h>

namespace kvl {
namespace {

// Layers local, local, global, local; a window of 6; runs of up to 4 tokens: rings of 9 rows.
KvWindowShape Shape() {
  KvWindowShape s;
  s.window = 6;
  s.layer_is_local = {true, true, false, true};
  s.max_run_tokens = 4;
  return s;
}

KvBlockLayout Layout() {
  KvBlockLayout l;
  l.block_tokens = 4;
  l.num_layers = 4;
  l.kv_dim = 8;
  l.SetWindowedLayers(Shape().layer_is_local);
  return l;
}

TEST(KvWindowReleaseTest, LayoutKeepsOnlyTheGlobalLayersInBlocks) {
  const KvBlockLayout l = Layout();
  EXPECT_EQ(l.block_layers(), 1);
  EXPECT_FALSE(l.in_block(0));
  EXPECT_TRUE(l.in_block(2));
  EXPECT_EQ(l.kv_bytes(), 4 * 8 * 4 * 2);  // one layer of 4 tokens x 8 floats, K and V
  EXPECT_EQ(WindowRingBytes(Shape(), l, 3), 3 * 9 * 3 * 8 * 4 * 2);
}

TEST(KvWindowReleaseTest, RowsTheWindowReadsComeBackAndOlderOnesAreReleased) {
  auto w = KvWindowRelease::Create(Shape(), Layout(), 2).value();
  EXPECT_EQ(w->ring_tokens(), 9);
  w->StartSequence(1);
  // Three runs write positions 0..11 of every local layer: value = 1000 * layer + position.
  for (int64_t from = 0; from < 12; from += 4) {
    w->ClaimRun(1, from, from + 4);
    for (int64_t layer : {0, 1, 3}) {
      for (int64_t pos = from; pos < from + 4; ++pos) {
        const KvCache::Rows rows = w->RowsAt(1, layer, pos);
        ASSERT_EQ(rows.kind, KvCache::Rows::Kind::kDense);
        for (int64_t i = 0; i < 8; ++i) {
          rows.k[i] = static_cast<float>(1000 * layer + pos);
          rows.v[i] = -static_cast<float>(1000 * layer + pos);
        }
      }
    }
  }
  // The ring holds the last 9 positions, 3..11; 0..2 are released (no weight in attention).
  const KvCache::Rows dropped = w->RowsAt(1, 3, 0);
  EXPECT_EQ(dropped.kind, KvCache::Rows::Kind::kDropped);
  EXPECT_EQ(dropped.count, 3);
  for (int64_t layer : {0, 1, 3}) {
    for (int64_t pos = 3; pos < 12; ++pos) {
      const KvCache::Rows rows = w->RowsAt(1, layer, pos);
      ASSERT_EQ(rows.kind, KvCache::Rows::Kind::kDense);
      EXPECT_GE(rows.count, 1);
      EXPECT_LE(pos + rows.count, 12);
      EXPECT_EQ(rows.k[0], static_cast<float>(1000 * layer + pos)) << layer << " " << pos;
      EXPECT_EQ(rows.v[7], -static_cast<float>(1000 * layer + pos)) << layer << " " << pos;
    }
  }
  // The next token (position 12) reads 7..11: held. A new occupant holds nothing.
  EXPECT_TRUE(w->HoldsWindow(1, 12));
  EXPECT_FALSE(w->HoldsWindow(0, 12));
  EXPECT_TRUE(w->HoldsWindow(0, 0));
  w->StartSequence(1);
  EXPECT_FALSE(w->HoldsWindow(1, 12));
}

TEST(KvWindowReleaseTest, RebuildFromTokensStartsAtTheReceptiveField) {
  auto w = KvWindowRelease::Create(Shape(), Layout(), 1).value();
  // Three local layers, five positions of look-back each.
  EXPECT_EQ(w->RebuildStart(100), 85);
  EXPECT_EQ(w->RebuildStart(10), 0);
  // A run starting past what is held holds nothing before it.
  w->StartSequence(0);
  w->ClaimRun(0, 85, 89);
  EXPECT_EQ(w->RowsAt(0, 0, 80).kind, KvCache::Rows::Kind::kDropped);
  EXPECT_EQ(w->RowsAt(0, 0, 84).count, 1);
  EXPECT_EQ(w->RowsAt(0, 0, 85).kind, KvCache::Rows::Kind::kDense);
}

TEST(KvWindowReleaseTest, PricesChooseTheRebuild) {
  auto w = KvWindowRelease::Create(Shape(), Layout(), 1).value();
  KvWindowRebuildPrices p;
  p.block_tokens = 4;
  p.num_layers = 4;
  p.residual_page_ms = 1;
  p.tokens_page_ms = 2;
  EXPECT_EQ(w->ChooseWindowRebuild(0, true, p), KvWindowRebuild::kNone);
  EXPECT_EQ(w->ChooseWindowRebuild(100, false, p), KvWindowRebuild::kFromTokens);
  // Checkpoints: 5 tokens x 3/4 of the layers at 1 ms a page; tokens: 15 tokens at 2 ms a page.
  EXPECT_EQ(w->ChooseWindowRebuild(100, true, p), KvWindowRebuild::kFromResiduals);
  p.residual_page_ms = 100;
  EXPECT_EQ(w->ChooseWindowRebuild(100, true, p), KvWindowRebuild::kFromTokens);
}

TEST(KvWindowReleaseTest, ShapesThatCannotReleaseAreRefused) {
  KvWindowShape s = Shape();
  s.window = 0;
  EXPECT_FALSE(KvWindowRelease::Create(s, Layout(), 1).ok());
  s = Shape();
  s.layer_is_local = {false, false, false, false};
  EXPECT_FALSE(KvWindowRelease::Create(s, Layout(), 1).ok());
}

}  // namespace
}  // namespace kvl
