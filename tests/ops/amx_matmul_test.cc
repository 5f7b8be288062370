// The AMX tiles (src/ops/amx.h) against the VNNI tiles and the scalar kernel: the same bits for
// every type they take, token count, partial panel and thread count. On a CPU without AMX (or
// where Linux refuses the tile state) the tests skip: nothing there runs the tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvl/ops.h"
#include "ops/amx.h"
#include "ops/kernel_table.h"
#include "ops/matmul_test_util.h"

namespace kvl::ops {
namespace {

// The count of elements whose bits differ (-0 vs +0 or a NaN would count).
int64_t BitsDiffering(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// Restores the AMX switch when a test ends, whatever it asserted.
class AmxSwitch {
 public:
  ~AmxSwitch() { SetAmxEnabled(was_on_); }

 private:
  const bool was_on_ = AmxEnabled();
};

constexpr DType kAmxTypes[] = {DType::kQ8_0, DType::kQ4_0};

TEST(AmxMatMulTest, TilesMatchVnniAndScalarBitExact) {
  if (!AmxAvailable()) GTEST_SKIP() << "no AMX on this CPU (or the kernel refused the tile state)";
  AmxSwitch restore;
  uint32_t seed = 900;
  int amx_cases = 0;
  for (DType type : kAmxTypes) {
    // A partial last panel (45 rows), an odd count of blocks, activations with widely varied
    // block scales.
    const int64_t rows = 45, cols = 352;
    const Weights w = MakeWeights(type, rows, cols, ++seed, true);
    const PackedMatrix packed = PackMatrix(Isa::kAvx512, w.view());
    ASSERT_EQ(packed.view().layout, MatrixLayout::kPacked);
    const int64_t max_tokens = 40;
    std::vector<float> x = RandomVec(max_tokens * cols, ++seed);
    x[7] = 500.0f;  // one saturating block
    const std::vector<float> ref = RunPackedMatMul(Isa::kScalar, 1, w.view(), x.data(), max_tokens);
    for (int64_t tokens : {7, 8, 9, 15, 16, 17, 33, 40}) {
      if (!AmxTakes(type, tokens)) continue;
      const std::vector<float> want(ref.begin(), ref.begin() + tokens * rows);
      for (int threads : {1, 2}) {
        const std::string what = std::string(DTypeName(type)) + " tokens " +
                                 std::to_string(tokens) + " threads " + std::to_string(threads);
        SetAmxEnabled(true);
        ASSERT_TRUE(AmxEnabled());
        const std::vector<float> amx = RunPackedMatMul(Isa::kAvx512, threads, packed.view(), x.data(), tokens);
        SetAmxEnabled(false);
        ASSERT_FALSE(AmxEnabled());
        const std::vector<float> vnni = RunPackedMatMul(Isa::kAvx512, threads, packed.view(), x.data(), tokens);
        EXPECT_EQ(BitsDiffering(amx, want), 0) << what << " (AMX against scalar)";
        EXPECT_EQ(BitsDiffering(vnni, want), 0) << what << " (VNNI against scalar)";
        ++amx_cases;
      }
    }
  }
  // Q8_0 / Q4_0 at 8, 9, 15 and 16 tokens, 1 and 2 threads.
  EXPECT_EQ(amx_cases, 16);
}

TEST(AmxMatMulTest, TakesBatchedDecodeOfBlockTypesOnly) {
  // A single token streams the weights whatever multiplies them; prefill tasks (up to 64 tokens)
  // and K-quants stay on the VNNI tiles.
  for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_FALSE(AmxTakes(type, 1)) << DTypeName(type);
    EXPECT_FALSE(AmxTakes(type, 64)) << DTypeName(type);
  }
  EXPECT_TRUE(AmxTakes(DType::kQ8_0, 9));
  EXPECT_TRUE(AmxTakes(DType::kQ4_0, 16));
  EXPECT_FALSE(AmxTakes(DType::kQ8_0, 17));
  EXPECT_FALSE(AmxTakes(DType::kQ4_K, 9));
  EXPECT_FALSE(AmxTakes(DType::kF32, 9));
}

}  // namespace
}  // namespace kvl::ops
