// GGUF v2/v3 reader (mmap, zero-copy) and writer.
//
// The reader validates everything before anything else sees the file: every length, count and
// offset is checked against the bytes that are really there, so a malformed file gives a Status
// naming the key, tensor or offset at fault and never an out-of-bounds read.
//
// Thread-safety: a GgufFile is immutable after Open and safe to read from many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/status.h"

namespace kvl {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars are widened into one of the three number fields; strings point into
// the mapped file. Arrays of numbers keep a pointer to their packed little-endian elements in the
// file (read them with the typed accessors); arrays of strings are split into string_views; arrays
// of arrays are parsed into `elements`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  uint64_t u = 0;   // every unsigned integer type and bool (and signed values >= 0)
  int64_t i = 0;    // every signed integer type (and unsigned values that fit)
  double f = 0.0;   // float32 / float64
  std::string_view str;

  // Arrays only.
  GgufValueType array_type = GgufValueType::kUint8;
  uint64_t array_count = 0;                 // for every element type
  const uint8_t* array_data = nullptr;      // numeric and bool arrays: packed elements
  std::vector<std::string_view> strings;    // string arrays
  std::vector<GgufValue> elements;          // arrays of arrays

  bool is_integer() const;
  bool is_float() const;
  // Element k of a numeric or bool array, converted (k < array_count, checked). ArrayInt
  // truncates float elements, saturating out-of-range ones and giving 0 for NaN.
  double ArrayNumber(uint64_t k) const;
  int64_t ArrayInt(uint64_t k) const;
  float ArrayFloat(uint64_t k) const;
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string_view name;
  DType type = DType::kF32;
  // ggml order: dims[0] is the innermost (contiguous) dimension. A matrix W[out][in] has
  // dims = {in, out}.
  std::vector<int64_t> dims;
  uint64_t offset = 0;     // relative to the start of the tensor data section
  int64_t num_elements = 0;
  int64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives
};

class GgufFile {
 public:
  // Maps and validates a file. The error names the path and the problem.
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes the caller owns and keeps alive (tests, the fuzzer).
  static StatusOr<std::unique_ptr<GgufFile>> FromBuffer(const uint8_t* data, size_t size);

  // Limits that keep a hostile file from driving recursion or allocation.
  static constexpr int kMaxArrayDepth = 8;  // an array of arrays of ... at most this deep

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  // The whole file (mapped, or the caller's buffer); tensor data pointers lie inside it.
  const uint8_t* data() const { return base_; }
  // Tells the kernel that [data, data + bytes) of a mapped file will not be read for a while (its
  // content was copied elsewhere, e.g. weights repacked at load): the whole pages inside the range
  // leave this process's resident set. Reading them again later is still correct (they come back
  // from the file). No-op for a caller's buffer.
  void DropPages(const void* data, size_t bytes) const;
  const std::string& path() const { return path_; }

  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;

  // Typed getters: NOT_FOUND when missing, INVALID_ARGUMENT (naming the key and both types) when
  // the stored type does not convert. Integer getters accept any integer type whose value fits.
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<int64_t> GetInt(std::string_view key) const;
  StatusOr<float> GetFloat(std::string_view key) const;  // accepts integers too
  StatusOr<bool> GetBool(std::string_view key) const;
  // An array value with elements of `elem_type` (kString, kFloat32, kInt32...).
  StatusOr<const GgufValue*> GetArray(std::string_view key, GgufValueType elem_type) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status Parse();
  Status ParseTensorData(uint64_t data_start);
  Status CheckTensorOverlap() const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool owns_mapping_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<GgufKeyValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  // Views into the buffer, so lookups are O(1) and duplicates are caught while parsing.
  std::unordered_map<std::string_view, size_t> key_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Streams a GGUF v3 file. Tensor data is produced by a callback when Write runs, so multi-GB
// synthetic models never sit in memory whole.
class GgufWriter {
 public:
  using TensorFiller = std::function<void(uint8_t* out, size_t num_bytes)>;

  void AddString(std::string key, std::string value);
  void AddUint32(std::string key, uint32_t value);
  void AddInt32(std::string key, int32_t value);
  void AddFloat32(std::string key, float value);
  void AddBool(std::string key, bool value);
  void AddStringArray(std::string key, std::vector<std::string> values);
  void AddFloat32Array(std::string key, std::vector<float> values);
  void AddInt32Array(std::string key, std::vector<int32_t> values);
  void SetAlignment(uint32_t alignment);  // also written as general.alignment
  // Any value type, encoded by the caller: `payload` is exactly the bytes that follow the value
  // type in the file (for kArray: element type, count, elements). For the types without an Add
  // method above (uint8, uint64, float64, nested arrays...), mostly in tests and tools.
  void AddRaw(std::string key, GgufValueType type, std::vector<uint8_t> payload);

  // dims in ggml order (innermost first).
  void AddTensor(std::string name, DType type, std::vector<int64_t> dims, TensorFiller fill);

  // INVALID_ARGUMENT for a tensor with a bad name or dims, IO_ERROR when the disk says no. The file
  // is written to `path`.tmp and renamed, so `path` never holds half a file.
  Status Write(const std::string& path) const;
  // The same bytes in memory (tests build malformed files by editing these). Bad tensor names or
  // dims are a programmer error here (checked).
  std::vector<uint8_t> WriteToBuffer() const;

 private:
  struct Entry;
  struct Tensor;
  // Adding a key that is already there replaces its value: GGUF forbids duplicate keys.
  void PutEntry(std::string key, std::vector<uint8_t> value);
  // Bytes of every tensor's data, after checking names and dims (INVALID_ARGUMENT otherwise).
  StatusOr<std::vector<int64_t>> TensorSizes() const;
  // Magic, counts, metadata and tensor directory, padded to the alignment.
  std::vector<uint8_t> BuildHeader(const std::vector<int64_t>& sizes) const;
  std::vector<std::shared_ptr<Entry>> entries_;
  std::vector<std::shared_ptr<Tensor>> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace kvl
