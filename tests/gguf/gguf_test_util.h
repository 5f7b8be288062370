// Helpers for GGUF tests: a small valid file from GgufWriter, byte-level edits to make it malformed,
// and a raw byte builder for structures the writer will not produce (nested arrays, v2 headers).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/gguf.h"

namespace kvl::gguf_test {

using Bytes = std::vector<uint8_t>;

// Parses a private copy sized exactly to the bytes, so AddressSanitizer catches any read past it.
inline Status ParseStatus(const Bytes& bytes) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size()]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  auto file = GgufFile::FromBuffer(copy.get(), bytes.size());
  return file.ok() ? Status::Ok() : file.status();
}

template <typename T>
void PutAt(Bytes& b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

template <typename T>
T GetAt(const Bytes& b, size_t at) {
  T v{};
  if (at + sizeof(T) <= b.size()) std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}

// Offset of the first GGUF string equal to `s` (its u64 length field), or npos.
inline size_t FindGgufString(const Bytes& b, std::string_view s) {
  Bytes needle(8);
  const uint64_t n = s.size();
  std::memcpy(needle.data(), &n, 8);
  needle.insert(needle.end(), s.begin(), s.end());
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  return it == b.end() ? std::string::npos : static_cast<size_t>(it - b.begin());
}

// Offset of a metadata key's value type field (the value follows it).
inline size_t ValueTypeAt(const Bytes& b, std::string_view key) {
  const size_t at = FindGgufString(b, key);
  EXPECT_NE(at, std::string::npos) << key;
  return at + 8 + key.size();
}

// Offsets of the fields of a tensor's directory entry.
struct TensorFields {
  size_t n_dims;
  size_t dims;  // dims[d] is at dims + 8 * d
  size_t type;
  size_t offset;
};

inline TensorFields FindTensorFields(const Bytes& b, std::string_view name) {
  const size_t at = FindGgufString(b, name);
  EXPECT_NE(at, std::string::npos) << name;
  TensorFields f;
  f.n_dims = at + 8 + name.size();
  const uint32_t n_dims = GetAt<uint32_t>(b, f.n_dims);
  f.dims = f.n_dims + 4;
  f.type = f.dims + 8 * n_dims;
  f.offset = f.type + 4;
  return f;
}

// Bytes for a hand-built file.
class RawGguf {
 public:
  RawGguf& U32(uint32_t v) { return Put(v); }
  RawGguf& U64(uint64_t v) { return Put(v); }
  RawGguf& U8(uint8_t v) { return Put(v); }
  RawGguf& Str(std::string_view s) {
    U64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& Header(uint32_t version, uint64_t tensors, uint64_t kvs) {
    bytes_.insert(bytes_.end(), {'G', 'G', 'U', 'F'});
    return U32(version).U64(tensors).U64(kvs);
  }
  RawGguf& PadTo(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  template <typename T>
  RawGguf& Put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes bytes_;
};

// Fills tensor bytes with a pattern that differs per tensor, so a swapped offset shows.
inline GgufWriter::TensorFiller Pattern(uint8_t seed) {
  return [seed](uint8_t* out, size_t n) {
    for (size_t k = 0; k < n; ++k) out[k] = static_cast<uint8_t>(seed + k * 7);
  };
}

// A small valid file: a few metadata types and three tensors whose last one ends exactly on the
// alignment, so every proper prefix of the file is missing real bytes.
inline Bytes SmallFile() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("test.u32", 7);
  w.AddInt32("test.i32", -3);
  w.AddFloat32("test.f32", 1.5f);
  w.AddBool("test.bool", true);
  w.AddStringArray("test.strings", {"x", "yz"});
  w.AddFloat32Array("test.floats", {1.0f, 2.0f});
  w.AddInt32Array("test.ints", {1, -2, 3});
  w.AddTensor("tensor.a", DType::kF32, {8, 2}, Pattern(1));   // 64 bytes at 0
  w.AddTensor("tensor.b", DType::kQ8_0, {32}, Pattern(2));    // 34 bytes at 64
  w.AddTensor("tensor.c", DType::kF32, {8}, Pattern(3));      // 32 bytes at 128
  return w.WriteToBuffer();
}

#define EXPECT_STATUS(expr, code_, substr)                                      \
  do {                                                                          \
    const ::kvl::Status st_ = (expr);                                           \
    EXPECT_EQ(st_.code(), (code_)) << st_.ToString();                           \
    EXPECT_NE(st_.message().find(substr), std::string::npos) << st_.ToString(); \
  } while (0)

}  // namespace kvl::gguf_test
