// GGUF v3 writer. The header (metadata and tensor directory) is built in memory; tensor data is
// produced one tensor at a time by its filler into one reusable buffer and streamed out, so a
// multi-GB synthetic model needs only its largest tensor in memory.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_set>

#include "kvl/gguf.h"

namespace kvl {

// `value` holds the encoded value type and value, ready to follow the key.
struct GgufWriter::Entry {
  std::string key;
  std::vector<uint8_t> value;
};

struct GgufWriter::Tensor {
  std::string name;
  DType type;
  std::vector<int64_t> dims;
  TensorFiller fill;
};

namespace {

constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr uint32_t kVersion = 3;

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void PutBytes(std::vector<uint8_t>& out, std::string_view s) {
  const size_t at = out.size();
  out.resize(at + s.size());
  if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
}

void PutString(std::vector<uint8_t>& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  PutBytes(out, s);
}

void PutType(std::vector<uint8_t>& out, GgufValueType t) { Put<uint32_t>(out, static_cast<uint32_t>(t)); }

template <typename T>
std::vector<uint8_t> EncodeScalar(GgufValueType type, T v) {
  std::vector<uint8_t> out;
  PutType(out, type);
  Put<T>(out, v);
  return out;
}

template <typename T>
std::vector<uint8_t> EncodeArray(GgufValueType elem, const std::vector<T>& values) {
  std::vector<uint8_t> out;
  PutType(out, GgufValueType::kArray);
  PutType(out, elem);
  Put<uint64_t>(out, values.size());
  for (const T& v : values) Put<T>(out, v);
  return out;
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Receives the file's bytes in order: an in-memory vector or a FILE*.
using Sink = std::function<Status(const uint8_t* data, size_t size)>;

}  // namespace

void GgufWriter::AddString(std::string key, std::string value) {
  std::vector<uint8_t> v;
  PutType(v, GgufValueType::kString);
  PutString(v, value);
  PutEntry(std::move(key), std::move(v));
}

void GgufWriter::AddUint32(std::string key, uint32_t value) {
  if (key == kAlignmentKey) {
    SetAlignment(value);
    return;
  }
  PutEntry(std::move(key), EncodeScalar(GgufValueType::kUint32, value));
}

void GgufWriter::AddInt32(std::string key, int32_t value) {
  PutEntry(std::move(key), EncodeScalar(GgufValueType::kInt32, value));
}

void GgufWriter::AddFloat32(std::string key, float value) {
  PutEntry(std::move(key), EncodeScalar(GgufValueType::kFloat32, value));
}

void GgufWriter::AddBool(std::string key, bool value) {
  PutEntry(std::move(key), EncodeScalar<uint8_t>(GgufValueType::kBool, value ? 1 : 0));
}

void GgufWriter::AddStringArray(std::string key, std::vector<std::string> values) {
  std::vector<uint8_t> v;
  PutType(v, GgufValueType::kArray);
  PutType(v, GgufValueType::kString);
  Put<uint64_t>(v, values.size());
  for (const std::string& s : values) PutString(v, s);
  PutEntry(std::move(key), std::move(v));
}

void GgufWriter::AddFloat32Array(std::string key, std::vector<float> values) {
  PutEntry(std::move(key), EncodeArray(GgufValueType::kFloat32, values));
}

void GgufWriter::AddInt32Array(std::string key, std::vector<int32_t> values) {
  PutEntry(std::move(key), EncodeArray(GgufValueType::kInt32, values));
}

void GgufWriter::AddRaw(std::string key, GgufValueType type, std::vector<uint8_t> payload) {
  std::vector<uint8_t> v;
  PutType(v, type);
  v.insert(v.end(), payload.begin(), payload.end());
  PutEntry(std::move(key), std::move(v));
}

void GgufWriter::SetAlignment(uint32_t alignment) {
  KVL_CHECK_MSG(alignment != 0 && (alignment & (alignment - 1)) == 0,
                "GGUF alignment must be a nonzero power of two");
  alignment_ = alignment;
  PutEntry(std::string(kAlignmentKey), EncodeScalar(GgufValueType::kUint32, alignment));
}

void GgufWriter::PutEntry(std::string key, std::vector<uint8_t> value) {
  // A key set twice keeps its first position and its last value: GGUF forbids duplicate keys.
  for (auto& e : entries_) {
    if (e->key == key) {
      e->value = std::move(value);
      return;
    }
  }
  entries_.push_back(std::make_shared<Entry>(Entry{std::move(key), std::move(value)}));
}

void GgufWriter::AddTensor(std::string name, DType type, std::vector<int64_t> dims,
                           TensorFiller fill) {
  tensors_.push_back(
      std::make_shared<Tensor>(Tensor{std::move(name), type, std::move(dims), std::move(fill)}));
}

StatusOr<std::vector<int64_t>> GgufWriter::TensorSizes() const {
  std::vector<int64_t> sizes;
  std::unordered_set<std::string_view> names;
  for (const auto& t : tensors_) {
    const std::string where = "tensor '" + t->name + "'";
    if (t->name.empty()) return InvalidArgumentError("a tensor has an empty name");
    if (!names.insert(t->name).second) return InvalidArgumentError(where + " added twice");
    if (t->dims.empty() || t->dims.size() > 4) {
      return InvalidArgumentError(where + ": " + std::to_string(t->dims.size()) +
                                  " dims, GGUF allows 1 to 4");
    }
    const DTypeTraits& traits = Traits(t->type);
    int64_t elements = 1;
    for (int64_t d : t->dims) {
      if (d <= 0 || __builtin_mul_overflow(elements, d, &elements)) {
        return InvalidArgumentError(where + ": bad dims (each must be positive, product < 2^63)");
      }
    }
    if (t->dims[0] % traits.block_elements != 0) {
      return InvalidArgumentError(where + ": innermost dim " + std::to_string(t->dims[0]) +
                                  " is not a multiple of the " + std::string(traits.name) +
                                  " block size " + std::to_string(traits.block_elements));
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(elements / traits.block_elements, traits.block_bytes, &bytes)) {
      return InvalidArgumentError(where + ": size overflows int64");
    }
    sizes.push_back(bytes);
  }
  return sizes;
}

std::vector<uint8_t> GgufWriter::BuildHeader(const std::vector<int64_t>& sizes) const {
  std::vector<uint8_t> out;
  out.reserve(4096);
  PutBytes(out, "GGUF");
  Put<uint32_t>(out, kVersion);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, entries_.size());
  for (const auto& e : entries_) {
    PutString(out, e->key);
    out.insert(out.end(), e->value.begin(), e->value.end());
  }
  uint64_t offset = 0;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const Tensor& t = *tensors_[k];
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(out, static_cast<uint64_t>(d));
    Put<uint32_t>(out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(out, offset);
    offset = AlignUp(offset + static_cast<uint64_t>(sizes[k]), alignment_);
  }
  out.resize(AlignUp(out.size(), alignment_), 0);
  return out;
}

// Header, then each tensor's bytes from its filler, each padded to the alignment (the last one
// too, as llama.cpp writes it).
static Status Emit(const std::vector<uint8_t>& header, const std::vector<int64_t>& sizes,
                   const std::vector<GgufWriter::TensorFiller*>& fillers,
                   uint32_t alignment, const Sink& sink) {
  KVL_RETURN_IF_ERROR(sink(header.data(), header.size()));
  int64_t largest = 0;
  for (int64_t s : sizes) largest = std::max(largest, s);
  std::vector<uint8_t> buffer(static_cast<size_t>(largest) + alignment);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t bytes = static_cast<size_t>(sizes[k]);
    const size_t padded = AlignUp(bytes, alignment);
    // Zeroed first so a filler that writes less still gives deterministic files.
    std::memset(buffer.data(), 0, padded);
    if (*fillers[k]) (*fillers[k])(buffer.data(), bytes);
    std::memset(buffer.data() + bytes, 0, padded - bytes);
    KVL_RETURN_IF_ERROR(sink(buffer.data(), padded));
  }
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path) const {
  KVL_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, TensorSizes());
  const std::vector<uint8_t> header = BuildHeader(sizes);
  std::vector<TensorFiller*> fillers;
  for (const auto& t : tensors_) fillers.push_back(&t->fill);

  // Written beside the target and renamed, so a failed write never leaves a half file there.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return IoError(tmp + ": cannot create: " + std::strerror(errno));
  Status s = Emit(header, sizes, fillers, alignment_, [&](const uint8_t* data, size_t size) {
    if (size != 0 && std::fwrite(data, 1, size, f) != size) {
      return IoError(tmp + ": write failed: " + std::strerror(errno));
    }
    return Status::Ok();
  });
  if (std::fclose(f) != 0 && s.ok()) s = IoError(tmp + ": close failed: " + std::strerror(errno));
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = IoError(path + ": rename from " + tmp + " failed: " + std::strerror(errno));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

std::vector<uint8_t> GgufWriter::WriteToBuffer() const {
  StatusOr<std::vector<int64_t>> sizes = TensorSizes();
  KVL_CHECK_MSG(sizes.ok(), sizes.status().message().c_str());
  const std::vector<uint8_t> header = BuildHeader(*sizes);
  std::vector<TensorFiller*> fillers;
  for (const auto& t : tensors_) fillers.push_back(&t->fill);
  std::vector<uint8_t> out;
  Status s = Emit(header, *sizes, fillers, alignment_, [&](const uint8_t* data, size_t size) {
    out.insert(out.end(), data, data + size);
    return Status::Ok();
  });
  KVL_CHECK_MSG(s.ok(), s.message().c_str());
  return out;
}

}  // namespace kvl
