// Tensor element types, numbered as GGUF/ggml numbers them so the values read from a file can be
// used directly. Shared by the GGUF reader, the weight formats and (later) the KV codec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvl {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  // KV cache types only, numbered outside ggml's range (no GGUF file holds them): the bytes of
  // q8_0 / q4_0 holding rows rotated per head by the orthonormal Walsh-Hadamard transform
  // (-ctk / -ctv q8_0r, q4_0r). The rotation spreads a head's outlier channels over all of its
  // channels, so one scale per 32 values fits them better; q.k is unchanged by it.
  kQ8_0R = 0x1008,
  kQ4_0R = 0x1002,
};

struct DTypeTraits {
  std::string_view name;     // "q8_0"
  int64_t block_elements;    // elements per block (1 for plain types)
  int64_t block_bytes;       // bytes per block
  bool supported;            // whether kvlattice can compute with it
};

// Traits of a known type, or nullopt for a number no ggml version has used (an unknown type).
std::optional<DTypeTraits> LookupDType(uint32_t raw_type);
// Traits of a valid DType value (checked).
const DTypeTraits& Traits(DType type);
std::string_view DTypeName(DType type);
// Parses a type name: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", ... (case-insensitive).
std::optional<DType> ParseDType(std::string_view name);

// How a MatrixView's bytes are laid out. kRows: the stored (GGUF) format, row r at
// data + r * row_bytes. kPacked: repacked at load time by ops::PackMatrix into the layout one ISA's
// matmul kernel streams best; only ops/ reads it.
enum class MatrixLayout : uint8_t { kRows, kPacked };

// A matrix W[rows][cols] (rows = outputs) in its stored format, usually inside the mmap of a
// model file, or repacked (layout kPacked).
struct MatrixView {
  DType type = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;  // RowBytes(type, cols), whatever the layout
  MatrixLayout layout = MatrixLayout::kRows;
};

// Whether `type` is a rotated KV cache type (q8_0r, q4_0r), and the format its bytes are in
// (q8_0, q4_0; any other type is its own).
inline constexpr bool IsRotatedKvType(DType type) {
  return type == DType::kQ8_0R || type == DType::kQ4_0R;
}
inline constexpr DType StorageFormat(DType type) {
  if (type == DType::kQ8_0R) return DType::kQ8_0;
  if (type == DType::kQ4_0R) return DType::kQ4_0;
  return type;
}

// Bytes of a row of n elements; n must be a multiple of the block size (checked).
int64_t RowBytes(DType type, int64_t n);

}  // namespace kvl
