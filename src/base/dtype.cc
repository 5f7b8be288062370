#include "kvl/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "kvl/status.h"

namespace kvl {
namespace {

struct Entry {
  uint32_t raw;
  DTypeTraits traits;
};

// Block geometry of every ggml type we can name, so that files holding types we cannot compute
// with still parse and report sizes (kvl inspect), and only loading them for compute fails.
constexpr std::array<Entry, 34> kTable = {{
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, false}},
    {6, {"q5_0", 32, 22, false}},
    {7, {"q5_1", 32, 24, false}},
    {8, {"q8_0", 32, 34, true}},
    {9, {"q8_1", 32, 36, false}},
    {10, {"q2_k", 256, 84, false}},
    {11, {"q3_k", 256, 110, false}},
    {12, {"q4_k", 256, 144, true}},
    {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}},
    {15, {"q8_k", 256, 292, false}},
    {16, {"iq2_xxs", 256, 66, false}},
    {17, {"iq2_xs", 256, 74, false}},
    {18, {"iq3_xxs", 256, 98, false}},
    {19, {"iq1_s", 256, 50, false}},
    {20, {"iq4_nl", 32, 18, false}},
    {21, {"iq3_s", 256, 110, false}},
    {22, {"iq2_s", 256, 82, false}},
    {23, {"iq4_xs", 256, 136, false}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {29, {"iq1_m", 256, 56, false}},
    {30, {"bf16", 1, 2, true}},
    {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},
    {39, {"mxfp4", 32, 17, false}},
    // The rotated KV cache types: q8_0 / q4_0 blocks; never a tensor type (LookupDType).
    {0x1008, {"q8_0r", 32, 34, false}},
    {0x1002, {"q4_0r", 32, 18, false}},
}};

}  // namespace

std::optional<DTypeTraits> LookupDType(uint32_t raw_type) {
  // A file's tensor type is a ggml number: the KV-only types are unknown there.
  if (IsRotatedKvType(static_cast<DType>(raw_type))) return std::nullopt;
  for (const Entry& e : kTable) {
    if (e.raw == raw_type) return e.traits;
  }
  return std::nullopt;
}

const DTypeTraits& Traits(DType type) {
  for (const Entry& e : kTable) {
    if (e.raw == static_cast<uint32_t>(type)) return e.traits;
  }
  CheckFailed(__FILE__, __LINE__, "Traits(type)", "DType value outside the table");
}

std::string_view DTypeName(DType type) { return Traits(type).name; }

std::optional<DType> ParseDType(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Entry& e : kTable) {
    if (e.traits.name == lower) return static_cast<DType>(e.raw);
  }
  return std::nullopt;
}

int64_t RowBytes(DType type, int64_t n) {
  const DTypeTraits& t = Traits(type);
  KVL_CHECK_MSG(n % t.block_elements == 0, "row length not a multiple of the block size");
  return n / t.block_elements * t.block_bytes;
}

}  // namespace kvl
