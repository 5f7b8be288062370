// Internal: the CPU features each ISA kernel table needs, in one list that both sides use. The
// run-time check (RunnableIsas, OpsContext) refuses a table unless the CPU has every feature on its
// list, and the build checks that the compile flags of the table's files enable exactly that list
// (see the static_assert at the end), so a flag added to CMakeLists.txt without its run-time check
// fails to compile instead of dying on an illegal instruction on the next machine.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/ops.h"
#include "kvl/status.h"

namespace kvl::ops {

// Every feature an ISA file's flags might enable. Listed beyond what the tables need (BF16, CD,
// VBMI, IFMA) so that the compile-time check notices such a flag instead of ignoring it.
enum class CpuFeature : uint8_t {
  kAvx512f,
  kAvx512bw,
  kAvx512vl,
  kAvx512dq,
  kAvx512cd,
  kAvx512vnni,
  kAvx512bf16,
  kAvx512vbmi,
  kAvx512ifma,
  kAvx2,
  kFma,
  kF16c,
  kAmxTile,
  kAmxInt8,
  kCount,
};

// "AVX512VNNI": the name CpuFeatureString prints.
std::string_view CpuFeatureName(CpuFeature feature);

// A set of CpuFeature, as a bit mask so it can be built at compile time.
class CpuFeatureSet {
 public:
  constexpr CpuFeatureSet() = default;
  constexpr CpuFeatureSet(std::initializer_list<CpuFeature> features) {
    for (CpuFeature f : features) Add(f);
  }
  constexpr void Add(CpuFeature f) { bits_ |= Bit(f); }
  constexpr void Remove(CpuFeature f) { bits_ &= ~Bit(f); }
  constexpr bool Has(CpuFeature f) const { return (bits_ & Bit(f)) != 0; }
  constexpr bool Contains(CpuFeatureSet other) const {
    return (bits_ & other.bits_) == other.bits_;
  }
  // The features of this set that `other` lacks.
  constexpr CpuFeatureSet Without(CpuFeatureSet other) const {
    CpuFeatureSet s;
    s.bits_ = bits_ & ~other.bits_;
    return s;
  }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool operator==(const CpuFeatureSet&) const = default;

 private:
  static constexpr uint32_t Bit(CpuFeature f) { return uint32_t{1} << static_cast<int>(f); }
  uint32_t bits_ = 0;
};

// The features a table needs: the one list per ISA. The AVX-512 table uses F/BW/VL/DQ for
// shuffles and byte ops, VNNI for vpdpbusd, and the AVX2 set for its 256-bit tails. No kernel uses
// AVX512-BF16 (bf16 is narrowed with integer ops to keep subnormals), so Cascade Lake and Ice
// Lake, which have VNNI but not BF16, run the AVX-512 table.
constexpr CpuFeatureSet RequiredCpuFeatures(Isa isa) {
  using F = CpuFeature;
  switch (isa) {
    case Isa::kScalar:
      return {};
    case Isa::kAvx2:
      return {F::kAvx2, F::kFma, F::kF16c};
    case Isa::kAvx512:
      return {F::kAvx2,     F::kFma,      F::kF16c,     F::kAvx512f,
              F::kAvx512bw, F::kAvx512vl, F::kAvx512dq, F::kAvx512vnni};
  }
  return {};
}

// The AMX tiles (gemm_amx.cc) speed up the AVX-512 table's packed int8 GEMM where the CPU has
// AMX and the kernel grants this process the tile state (amx.h); their file is built for the
// AVX-512 table's features and these two.
constexpr CpuFeatureSet AmxCpuFeatures() {
  CpuFeatureSet s = RequiredCpuFeatures(Isa::kAvx512);
  s.Add(CpuFeature::kAmxTile);
  s.Add(CpuFeature::kAmxInt8);
  return s;
}

// Every Isa, in increasing order of preference.
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

// "AVX512F AVX512VNNI": the names of a set, space-separated, in CpuFeature order.
std::string CpuFeatureNames(CpuFeatureSet features);

// The features this CPU reports (cpuid, through __builtin_cpu_supports).
CpuFeatureSet DetectCpuFeatures();

// The tables a CPU with `present` can run, in kAllIsas order; RunnableIsas() passes the real CPU.
// Tests pass made-up sets to check the refusals.
std::vector<Isa> RunnableIsas(CpuFeatureSet present);

// OK when a CPU with `present` has every feature `isa` needs; otherwise UNIMPLEMENTED naming the
// missing ones.
Status CheckIsaRunnable(Isa isa, CpuFeatureSet present);

// The features the compiler may use in the translation unit that calls this, from its predefined
// macros (-mavx512f defines __AVX512F__, and so on).
constexpr CpuFeatureSet CompiledCpuFeatures() {
  CpuFeatureSet s;
#ifdef __AVX512F__
  s.Add(CpuFeature::kAvx512f);
#endif
#ifdef __AVX512BW__
  s.Add(CpuFeature::kAvx512bw);
#endif
#ifdef __AVX512VL__
  s.Add(CpuFeature::kAvx512vl);
#endif
#ifdef __AVX512DQ__
  s.Add(CpuFeature::kAvx512dq);
#endif
#ifdef __AVX512CD__
  s.Add(CpuFeature::kAvx512cd);
#endif
#ifdef __AVX512VNNI__
  s.Add(CpuFeature::kAvx512vnni);
#endif
#ifdef __AVX512BF16__
  s.Add(CpuFeature::kAvx512bf16);
#endif
#ifdef __AVX512VBMI__
  s.Add(CpuFeature::kAvx512vbmi);
#endif
#ifdef __AVX512IFMA__
  s.Add(CpuFeature::kAvx512ifma);
#endif
#ifdef __AVX2__
  s.Add(CpuFeature::kAvx2);
#endif
#ifdef __FMA__
  s.Add(CpuFeature::kFma);
#endif
#ifdef __F16C__
  s.Add(CpuFeature::kF16c);
#endif
#ifdef __AMX_TILE__
  s.Add(CpuFeature::kAmxTile);
#endif
#ifdef __AMX_INT8__
  s.Add(CpuFeature::kAmxInt8);
#endif
  return s;
}

// CMakeLists.txt defines KVL_ISA_FILE=<Isa value> for each ISA-specific file, beside its flags.
// Those flags must enable exactly the table's list: a feature the flags add but the list lacks
// could be used by the compiler on a CPU that does not have it, and one the list adds but the
// flags lack refuses CPUs for nothing.
#ifdef KVL_ISA_FILE
static_assert(CompiledCpuFeatures() == RequiredCpuFeatures(static_cast<Isa>(KVL_ISA_FILE)),
              "the compile flags of this ISA file (CMakeLists.txt) and its feature list "
              "(RequiredCpuFeatures in src/ops/isa_features.h) disagree; change both together");
#endif
#ifdef KVL_AMX_FILE
static_assert(CompiledCpuFeatures() == AmxCpuFeatures(),
              "the compile flags of the AMX file (CMakeLists.txt) and AmxCpuFeatures() disagree");
#endif

}  // namespace kvl::ops
