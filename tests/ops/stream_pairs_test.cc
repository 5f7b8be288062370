// MatMulGroup's stream pairs (ops/stream_pairs.h): a decode matrix's weight stream beside the
// arithmetic of many tokens over small weights runs as pairs that only reorder the work, so every
// matrix still gets, bit for bit, what MatMul gives it alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvl/ops.h"
#include "ops/kernel_table.h"
#include "ops/matmul_test_util.h"
#include "ops/stream_pairs.h"

namespace kvl::ops {
namespace {

// The args MatMulGroup would build, enough for PairsStreamWithArithmetic to judge.
std::vector<MatMulArgs> ArgsOf(std::span<const MatrixView> ws) {
  std::vector<MatMulArgs> args(ws.size());
  for (size_t m = 0; m < ws.size(); ++m) args[m].w = ws[m];
  return args;
}

TEST(StreamPairsTest, PairsADecodeStreamWithManyTokensOverSmallWeights) {
  if (BestIsa() != Isa::kAvx512) GTEST_SKIP() << "stream pairs run on the AVX-512 kernels only";
  const Isa isa = Isa::kAvx512;
  const int64_t cols = 256;
  // The stream: 1100 rows of Q8_0 (299 KB, above kMinStreamBytes); a Q4_K one of 2000 rows.
  const Weights wq = MakeWeights(DType::kQ8_0, 1100, cols, 31, /*varied_scales=*/true);
  const Weights wq4k = MakeWeights(DType::kQ4_K, 2000, cols, 32);
  const Weights wk = MakeWeights(DType::kQ8_0, 70, cols, 33, /*varied_scales=*/true);
  const Weights wv = MakeWeights(DType::kQ4_0, 70, cols, 34);
  const PackedMatrix pq = PackMatrix(isa, wq.view()), pq4k = PackMatrix(isa, wq4k.view()),
                     pk = PackMatrix(isa, wk.view()), pv = PackMatrix(isa, wv.view());
  const int64_t max_tokens = 130;
  const std::vector<float> x = RandomVec(max_tokens * cols, 35);
  struct Case {
    MatrixView stream;
    int64_t counts[3];
    bool paired;  // what PairsStreamWithArithmetic must say
  };
  const Case cases[] = {
      {pq.view(), {1, 65, 65}, true},    // a decode step's Q beside a rebuilt page's K and V
      {pq.view(), {2, 16, 130}, true},   // two decode rows; arithmetic of 16 and 130 tokens
      {pq4k.view(), {1, 64, 64}, true},  // a K-quant stream: its kernel needs no hint
      {pq.view(), {1, 8, 65}, false},    // 8 tokens: neither stream nor arithmetic
      {pq.view(), {3, 65, 65}, false},   // 3 tokens: not a stream
      {pk.view(), {1, 65, 65}, false},   // a stream of 19 KB is in cache already
  };
  for (const Case& c : cases) {
    const MatrixView ws[] = {c.stream, pk.view(), pv.view()};
    const std::string name = std::string(DTypeName(c.stream.type)) + " " +
                             std::to_string(c.stream.rows) + " rows, counts " +
                             std::to_string(c.counts[0]) + "/" + std::to_string(c.counts[1]) +
                             "/" + std::to_string(c.counts[2]);
    EXPECT_EQ(PairsStreamWithArithmetic(isa, ArgsOf(ws), c.counts), c.paired) << name;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      OpsContext ctx(isa, &pool);
      ctx.Reserve(max_tokens, cols);
      std::vector<std::vector<float>> ys;
      float* outs[3];
      for (size_t m = 0; m < 3; ++m) {
        ys.emplace_back(static_cast<size_t>(c.counts[m] * ws[m].rows), NAN);
        outs[m] = ys.back().data();
      }
      MatMulGroup(ctx, ws, x.data(), std::span<const int64_t>(c.counts, 3), outs);
      for (size_t m = 0; m < 3; ++m) {
        ExpectBitIdentical(ys[m], RunPackedMatMul(isa, 1, ws[m], x.data(), c.counts[m]),
                           name + ": matrix " + std::to_string(m) + ", threads " +
                               std::to_string(threads));
      }
    }
  }
}

// The hint pulls exactly its range, at the pace asked, and stops at its end.
TEST(StreamPairsTest, StreamAheadIssuesItsLinesAcrossABlockAndStopsAtTheEnd) {
  std::vector<char> bytes(64 * 20);
  StreamAhead ahead{bytes.data(), bytes.data() + bytes.size(), /*lines_per_block=*/12};
  for (int g = 0; g < 8; ++g) ahead.IssueAt(g);
  EXPECT_EQ(ahead.next - bytes.data(), 12 * 64) << "one block's steps issue lines_per_block";
  for (int g = 0; g < 8; ++g) ahead.IssueAt(g);
  EXPECT_EQ(ahead.next, bytes.data() + bytes.size()) << "the second block stops at the end";
}

}  // namespace
}  // namespace kvl::ops
