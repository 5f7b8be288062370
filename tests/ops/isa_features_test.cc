// The per-ISA feature lists against the real CPU and against made-up ones: dispatch must refuse a
// table whose features a CPU lacks, and must not refuse one for a feature no kernel uses.
#include "ops/isa_features.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kvl/ops.h"

namespace kvl::ops {
namespace {

bool Contains(const std::vector<Isa>& isas, Isa isa) {
  return std::find(isas.begin(), isas.end(), isa) != isas.end();
}

// Every feature the AVX-512 table needs, and nothing else.
CpuFeatureSet Avx512Cpu() { return RequiredCpuFeatures(Isa::kAvx512); }

TEST(IsaFeaturesTest, ListsMatchRunnableIsasOnThisCpu) {
  const CpuFeatureSet present = DetectCpuFeatures();
  const std::vector<Isa> runnable = RunnableIsas();
  for (Isa isa : kAllIsas) {
    const bool has_all = present.Contains(RequiredCpuFeatures(isa));
    EXPECT_EQ(Contains(runnable, isa), has_all) << IsaName(isa);
    EXPECT_EQ(CheckIsaRunnable(isa).ok(), has_all) << IsaName(isa);
  }
  EXPECT_TRUE(Contains(runnable, Isa::kScalar));
  EXPECT_EQ(BestIsa(), runnable.back());  // KVL_ISA unset in tests
}

TEST(IsaFeaturesTest, DetectionAgreesWithCpuFeatureString) {
  const CpuFeatureSet present = DetectCpuFeatures();
  const std::string names = " " + CpuFeatureString() + " ";
  for (int i = 0; i < static_cast<int>(CpuFeature::kCount); ++i) {
    const auto f = static_cast<CpuFeature>(i);
    const std::string name = fmt::format(" {} ", CpuFeatureName(f));
    EXPECT_EQ(names.find(name) != std::string::npos, present.Has(f)) << name;
  }
}

TEST(IsaFeaturesTest, VnniWithoutBf16RunsAvx512) {
  // Cascade Lake and Ice Lake: VNNI, no BF16. No kernel uses BF16, so avx512 must stay runnable.
  CpuFeatureSet cpu = Avx512Cpu();
  cpu.Remove(CpuFeature::kAvx512bf16);
  ASSERT_TRUE(cpu.Has(CpuFeature::kAvx512vnni));
  const std::vector<Isa> runnable = RunnableIsas(cpu);
  EXPECT_EQ(runnable, (std::vector<Isa>{Isa::kScalar, Isa::kAvx2, Isa::kAvx512}));
  EXPECT_TRUE(CheckIsaRunnable(Isa::kAvx512, cpu).ok());
  EXPECT_FALSE(RequiredCpuFeatures(Isa::kAvx512).Has(CpuFeature::kAvx512bf16));
}

TEST(IsaFeaturesTest, MissingVnniRefusesAvx512) {
  // Skylake-X: AVX-512 F/BW/VL/DQ but no VNNI.
  CpuFeatureSet cpu = Avx512Cpu();
  cpu.Remove(CpuFeature::kAvx512vnni);
  const std::vector<Isa> runnable = RunnableIsas(cpu);
  EXPECT_FALSE(Contains(runnable, Isa::kAvx512));
  EXPECT_TRUE(Contains(runnable, Isa::kAvx2));
  const Status s = CheckIsaRunnable(Isa::kAvx512, cpu);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("AVX512VNNI"), std::string::npos) << s.message();
}

TEST(IsaFeaturesTest, EveryListedFeatureIsNeeded) {
  // Taking away any one listed feature refuses the table, and the error names that feature.
  for (Isa isa : kAllIsas) {
    const CpuFeatureSet required = RequiredCpuFeatures(isa);
    for (int i = 0; i < static_cast<int>(CpuFeature::kCount); ++i) {
      const auto f = static_cast<CpuFeature>(i);
      if (!required.Has(f)) continue;
      CpuFeatureSet cpu = required;
      cpu.Remove(f);
      EXPECT_FALSE(Contains(RunnableIsas(cpu), isa)) << IsaName(isa) << " " << CpuFeatureName(f);
      const Status s = CheckIsaRunnable(isa, cpu);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find(CpuFeatureName(f)), std::string::npos) << s.message();
    }
  }
}

TEST(IsaFeaturesTest, BareCpuRunsOnlyScalar) {
  EXPECT_EQ(RunnableIsas(CpuFeatureSet{}), std::vector<Isa>{Isa::kScalar});
  // AVX2 without FMA (some early VIA / emulated CPUs) must not get the AVX2 table.
  EXPECT_EQ(RunnableIsas(CpuFeatureSet{CpuFeature::kAvx2, CpuFeature::kF16c}),
            std::vector<Isa>{Isa::kScalar});
}

TEST(IsaFeaturesDeathTest, OpsContextRefusesAnIsaThisCpuLacks) {
  Isa missing = Isa::kScalar;
  for (Isa isa : kAllIsas) {
    if (!CheckIsaRunnable(isa).ok()) missing = isa;
  }
  if (missing == Isa::kScalar) GTEST_SKIP() << "this CPU runs every compiled ISA";
  ThreadPool pool(1);
  EXPECT_DEATH(OpsContext(missing, &pool), "lacks");
}

}  // namespace
}  // namespace kvl::ops
