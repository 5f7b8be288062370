// GGUF v2/v3 parser. The file is untrusted: every count is checked against the bytes left before
// anything is reserved, every offset before it is used, and errors name the key, tensor and byte
// offset at fault.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "byte_reader.h"
#include "kvl/gguf.h"
#include "kvl/user_file.h"

namespace kvl {
namespace {

using gguf_internal::ByteReader;

constexpr uint32_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
// The fewest bytes a record can take, used to bound counts before reserving memory for them.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;          // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, 1 dim, type, offset
constexpr uint64_t kMinNestedArrayBytes = 4 + 8;             // element type and count
// Parsed records are larger than their smallest encoding, so vectors grow as records really parse
// instead of being sized from a count up front; this caps the up-front reservation.
constexpr uint64_t kMaxReserve = 1 << 16;

size_t ReserveFor(uint64_t count) { return static_cast<size_t>(std::min(count, kMaxReserve)); }

Status Annotate(const Status& s, const std::string& where) {
  return Status(s.code(), where + ": " + s.message());
}

std::string Offset(size_t offset) { return "offset " + std::to_string(offset); }

// Size of one packed element, or 0 for strings and arrays (variable size).
uint64_t FixedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

Status ReadValueType(ByteReader& r, std::string_view what, GgufValueType* out) {
  const size_t at = r.offset();
  uint32_t raw = 0;
  KVL_RETURN_IF_ERROR(r.Read(&raw, what));
  if (raw > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return DataLossError("unknown " + std::string(what) + " " + std::to_string(raw) + " at " +
                         Offset(at));
  }
  *out = static_cast<GgufValueType>(raw);
  return Status::Ok();
}

Status ParseArray(ByteReader& r, int depth, GgufValue* out);

// Reads one value of `type` into `out` (out->type is set by the caller).
Status ParseValue(ByteReader& r, GgufValueType type, int depth, GgufValue* out) {
  out->type = type;
  const size_t at = r.offset();
  switch (type) {
    case GgufValueType::kUint8: {
      uint8_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "uint8 value"));
      out->u = v;
      out->i = v;
      return Status::Ok();
    }
    case GgufValueType::kInt8: {
      int8_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "int8 value"));
      out->i = v;
      out->u = v >= 0 ? static_cast<uint64_t>(v) : 0;
      return Status::Ok();
    }
    case GgufValueType::kUint16: {
      uint16_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "uint16 value"));
      out->u = v;
      out->i = v;
      return Status::Ok();
    }
    case GgufValueType::kInt16: {
      int16_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "int16 value"));
      out->i = v;
      out->u = v >= 0 ? static_cast<uint64_t>(v) : 0;
      return Status::Ok();
    }
    case GgufValueType::kUint32: {
      uint32_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "uint32 value"));
      out->u = v;
      out->i = v;
      return Status::Ok();
    }
    case GgufValueType::kInt32: {
      int32_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "int32 value"));
      out->i = v;
      out->u = v >= 0 ? static_cast<uint64_t>(v) : 0;
      return Status::Ok();
    }
    case GgufValueType::kUint64: {
      uint64_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "uint64 value"));
      out->u = v;
      out->i = v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                   ? static_cast<int64_t>(v)
                   : 0;
      return Status::Ok();
    }
    case GgufValueType::kInt64: {
      int64_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "int64 value"));
      out->i = v;
      out->u = v >= 0 ? static_cast<uint64_t>(v) : 0;
      return Status::Ok();
    }
    case GgufValueType::kFloat32: {
      float v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "float32 value"));
      out->f = v;
      return Status::Ok();
    }
    case GgufValueType::kFloat64: {
      double v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "float64 value"));
      out->f = v;
      return Status::Ok();
    }
    case GgufValueType::kBool: {
      uint8_t v = 0;
      KVL_RETURN_IF_ERROR(r.Read(&v, "bool value"));
      // Writers emit 0 or 1; anything else means the bytes are not what the type says.
      if (v > 1) {
        return DataLossError("bool value " + std::to_string(v) + " at " + Offset(at) +
                             " is neither 0 nor 1");
      }
      out->u = v;
      out->i = v;
      return Status::Ok();
    }
    case GgufValueType::kString:
      return r.ReadString(&out->str, "string value");
    case GgufValueType::kArray:
      return ParseArray(r, depth + 1, out);
  }
  return InternalError("unhandled value type");
}

// Parses an array header and its elements; `depth` is 1 for an array directly under a key.
Status ParseArray(ByteReader& r, int depth, GgufValue* out) {
  const size_t at = r.offset();
  if (depth > GgufFile::kMaxArrayDepth) {
    return DataLossError("array at " + Offset(at) + " is nested deeper than " +
                         std::to_string(GgufFile::kMaxArrayDepth) + " levels");
  }
  out->type = GgufValueType::kArray;
  KVL_RETURN_IF_ERROR(ReadValueType(r, "array element type", &out->array_type));
  uint64_t count = 0;
  KVL_RETURN_IF_ERROR(r.Read(&count, "array count"));
  const GgufValueType elem = out->array_type;
  const uint64_t fixed = FixedSize(elem);
  const uint64_t min_elem_bytes =
      fixed != 0 ? fixed : (elem == GgufValueType::kString ? 8 : kMinNestedArrayBytes);
  // Checked before anything is reserved, so a count of 2^60 costs nothing.
  if (count > r.remaining() / min_elem_bytes) {
    return DataLossError("array at " + Offset(at) + " of " + std::to_string(count) + " " +
                         std::string(GgufValueTypeName(elem)) + " elements needs at least " +
                         (count > std::numeric_limits<uint64_t>::max() / min_elem_bytes
                              ? std::string("2^64")
                              : std::to_string(count * min_elem_bytes)) +
                         " bytes, only " + std::to_string(r.remaining()) + " left");
  }
  out->array_count = count;
  if (fixed != 0) {
    out->array_data = r.current();
    if (elem == GgufValueType::kBool) {
      for (uint64_t k = 0; k < count; ++k) {
        if (out->array_data[k] > 1) {
          return DataLossError("bool element " + std::to_string(k) + " of the array at " +
                               Offset(at) + " is " + std::to_string(out->array_data[k]) +
                               ", neither 0 nor 1");
        }
      }
    }
    return r.Skip(count * fixed, "array elements");
  }
  if (elem == GgufValueType::kString) {
    out->strings.reserve(ReserveFor(count));
    for (uint64_t k = 0; k < count; ++k) {
      std::string_view str;
      // The element's number is named only on failure: building it for each of a vocabulary's
      // 150k strings cost a tenth of its load time.
      Status s = r.ReadString(&str, "string element");
      if (!s.ok()) return Annotate(s, "element " + std::to_string(k) + " of the array at " + Offset(at));
      out->strings.push_back(str);
    }
    return Status::Ok();
  }
  out->elements.reserve(ReserveFor(count));
  for (uint64_t k = 0; k < count; ++k) {
    Status s = ParseArray(r, depth + 1, &out->elements.emplace_back());
    if (!s.ok()) return Annotate(s, "element " + std::to_string(k) + " of the array at " + Offset(at));
  }
  return Status::Ok();
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "{";
  for (size_t d = 0; d < dims.size(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(dims[d]);
  }
  return s + "}";
}

}  // namespace

StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->base_ = data;
  file->size_ = data == nullptr ? 0 : size;
  KVL_RETURN_IF_ERROR(file->Parse());
  return file;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  // Never blocks: a FIFO or a device given as the model is refused before any read.
  KVL_ASSIGN_OR_RETURN(const int fd, OpenUserFile(path, "model"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(path + ": cannot stat: " + std::strerror(err));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return DataLossError(path + ": file is empty, not a GGUF file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapped == MAP_FAILED) return IoError(path + ": mmap failed: " + std::strerror(err));

  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->base_ = static_cast<const uint8_t*>(mapped);
  file->size_ = size;
  file->owns_mapping_ = true;  // from here the destructor unmaps, on error too
  Status s = file->Parse();
  if (!s.ok()) return Annotate(s, path);
  return file;
}

void GgufFile::DropPages(const void* data, size_t bytes) const {
  if (!owns_mapping_) return;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  // Weights the model converted at load (Q5_0 as Q8_0) live outside the mapping: nothing to drop.
  if (begin < reinterpret_cast<uintptr_t>(base_) ||
      begin + bytes > reinterpret_cast<uintptr_t>(base_) + size_) {
    return;
  }
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
  // Advice only: a failure leaves the pages resident, which is what happens without it.
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

GgufFile::~GgufFile() {
  if (owns_mapping_ && base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

Status GgufFile::Parse() {
  ByteReader r(base_, size_);

  // Header: magic, version, counts.
  if (size_ < 4) {
    return DataLossError("file is " + std::to_string(size_) +
                         " bytes, too short for the GGUF magic");
  }
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    char hex[48];
    std::snprintf(hex, sizeof(hex), "%02x %02x %02x %02x", base_[0], base_[1], base_[2], base_[3]);
    return DataLossError(std::string("bad magic ") + hex +
                         " at offset 0 (expected 'GGUF'): not a GGUF file");
  }
  KVL_RETURN_IF_ERROR(r.Skip(4, "magic"));
  KVL_RETURN_IF_ERROR(r.Read(&version_, "version"));
  if (version_ == 1) {
    return UnimplementedError(
        "GGUF version 1 is not supported (it predates 64-bit counts); re-convert the model");
  }
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) {
      return UnimplementedError("GGUF file is big-endian (version " + std::to_string(swapped) +
                                "), only little-endian files are supported");
    }
    return UnimplementedError("GGUF version " + std::to_string(version_) +
                              " is not supported (this reader handles versions 2 and 3)");
  }
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  KVL_RETURN_IF_ERROR(r.Read(&tensor_count, "tensor count"));
  KVL_RETURN_IF_ERROR(r.Read(&kv_count, "metadata count"));
  if (kv_count > r.remaining() / kMinKeyValueBytes) {
    return DataLossError("metadata count " + std::to_string(kv_count) +
                         " at offset 16 cannot fit in the " + std::to_string(r.remaining()) +
                         " bytes left");
  }
  if (tensor_count > r.remaining() / kMinTensorInfoBytes) {
    return DataLossError("tensor count " + std::to_string(tensor_count) +
                         " at offset 8 cannot fit in the " + std::to_string(r.remaining()) +
                         " bytes left");
  }

  // Metadata.
  metadata_.reserve(ReserveFor(kv_count));
  key_index_.reserve(ReserveFor(kv_count));
  for (size_t k = 0; k < kv_count; ++k) {
    GgufKeyValue& kv = metadata_.emplace_back();
    const size_t at = r.offset();
    const std::string index_where = "metadata key #" + std::to_string(k) + " at " + Offset(at);
    Status s = r.ReadString(&kv.key, "key name");
    if (!s.ok()) return Annotate(s, index_where);
    if (kv.key.empty()) return DataLossError(index_where + ": key name is empty");
    const std::string where =
        "metadata key '" + std::string(kv.key) + "' (#" + std::to_string(k) + " at " + Offset(at) + ")";
    GgufValueType type;
    s = ReadValueType(r, "value type", &type);
    if (!s.ok()) return Annotate(s, where);
    s = ParseValue(r, type, 0, &kv.value);
    if (!s.ok()) return Annotate(s, where);
    auto [it, inserted] = key_index_.emplace(kv.key, k);
    if (!inserted) {
      return DataLossError(where + ": duplicates metadata key #" + std::to_string(it->second));
    }
  }

  // Alignment comes from the metadata and governs both the tensor offsets and the data start.
  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = Find(kAlignmentKey)) {
    if (a->type != GgufValueType::kUint32) {
      return DataLossError("metadata key 'general.alignment' has type " +
                           std::string(GgufValueTypeName(a->type)) + ", expected uint32");
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return DataLossError("metadata key 'general.alignment' is " + std::to_string(a->u) +
                           ", not a nonzero power of two");
    }
    alignment_ = a->u;
  }

  // Tensor directory.
  if (tensor_count > r.remaining() / kMinTensorInfoBytes) {
    return DataLossError("tensor count " + std::to_string(tensor_count) +
                         " cannot fit in the " + std::to_string(r.remaining()) +
                         " bytes left after the metadata (at " + Offset(r.offset()) + ")");
  }
  tensors_.reserve(ReserveFor(tensor_count));
  tensor_index_.reserve(ReserveFor(tensor_count));
  for (size_t t = 0; t < tensor_count; ++t) {
    GgufTensorInfo& info = tensors_.emplace_back();
    const size_t at = r.offset();
    const std::string index_where = "tensor #" + std::to_string(t) + " at " + Offset(at);
    Status s = r.ReadString(&info.name, "tensor name");
    if (!s.ok()) return Annotate(s, index_where);
    if (info.name.empty()) return DataLossError(index_where + ": tensor name is empty");
    const std::string where =
        "tensor '" + std::string(info.name) + "' (#" + std::to_string(t) + " at " + Offset(at) + ")";
    uint32_t n_dims = 0;
    const size_t n_dims_at = r.offset();
    s = r.Read(&n_dims, "n_dims");
    if (!s.ok()) return Annotate(s, where);
    if (n_dims == 0 || n_dims > 4) {
      return DataLossError(where + ": n_dims " + std::to_string(n_dims) + " at " +
                           Offset(n_dims_at) + " is not in 1..4");
    }
    info.dims.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t dim_at = r.offset();
      uint64_t dim = 0;
      s = r.Read(&dim, "dimension");
      if (!s.ok()) return Annotate(s, where);
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLossError(where + ": dimension " + std::to_string(d) + " at " + Offset(dim_at) +
                             " is " + std::to_string(dim) + ", not in 1..2^63-1");
      }
      info.dims[d] = static_cast<int64_t>(dim);
    }
    const size_t type_at = r.offset();
    uint32_t raw_type = 0;
    s = r.Read(&raw_type, "tensor type");
    if (!s.ok()) return Annotate(s, where);
    s = r.Read(&info.offset, "tensor data offset");
    if (!s.ok()) return Annotate(s, where);

    const std::optional<DTypeTraits> traits = LookupDType(raw_type);
    if (!traits) {
      return DataLossError(where + ": unknown ggml tensor type " + std::to_string(raw_type) +
                           " at " + Offset(type_at));
    }
    info.type = static_cast<DType>(raw_type);
    int64_t elements = 1;
    for (int64_t dim : info.dims) {
      if (__builtin_mul_overflow(elements, dim, &elements)) {
        return DataLossError(where + ": dims " + DimsString(info.dims) +
                             " hold more elements than int64 can count");
      }
    }
    info.num_elements = elements;
    if (info.dims[0] % traits->block_elements != 0) {
      return DataLossError(where + ": innermost dimension " + std::to_string(info.dims[0]) +
                           " is not a multiple of the " + std::string(traits->name) +
                           " block size " + std::to_string(traits->block_elements));
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(elements / traits->block_elements, traits->block_bytes, &bytes)) {
      return DataLossError(where + ": " + std::string(traits->name) + " dims " +
                           DimsString(info.dims) + " take more bytes than int64 can count");
    }
    info.num_bytes = bytes;
    auto [it, inserted] = tensor_index_.emplace(info.name, t);
    if (!inserted) {
      return DataLossError(where + ": duplicates the name of tensor #" + std::to_string(it->second));
    }
  }

  // The data section starts at the next multiple of the alignment after the directory.
  const uint64_t directory_end = r.offset();
  const uint64_t data_start = (directory_end + alignment_ - 1) / alignment_ * alignment_;
  return ParseTensorData(data_start);
}

Status GgufFile::ParseTensorData(uint64_t data_start) {
  if (tensors_.empty()) return Status::Ok();  // a metadata-only file need not carry the padding
  if (data_start > size_) {
    return DataLossError("tensor data section would start at " + Offset(data_start) +
                         ", past the end of the file (" + std::to_string(size_) + " bytes)");
  }
  const uint64_t data_size = size_ - data_start;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    GgufTensorInfo& info = tensors_[t];
    const std::string where = "tensor '" + std::string(info.name) + "' (#" + std::to_string(t) + ")";
    if (info.offset % alignment_ != 0) {
      return DataLossError(where + ": data offset " + std::to_string(info.offset) +
                           " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    const uint64_t bytes = static_cast<uint64_t>(info.num_bytes);
    if (info.offset > data_size || bytes > data_size - info.offset) {
      return DataLossError(where + ": data [" + std::to_string(data_start + info.offset) + ", +" +
                           std::to_string(bytes) + ") runs past the end of the file (" +
                           std::to_string(size_) + " bytes)");
    }
    info.data = base_ + data_start + info.offset;
  }
  return CheckTensorOverlap();
}

Status GgufFile::CheckTensorOverlap() const {
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo& prev = *by_offset[k - 1];
    const GgufTensorInfo& next = *by_offset[k];
    // Both ends are inside the file (checked above), so the sum cannot overflow.
    if (prev.offset + static_cast<uint64_t>(prev.num_bytes) > next.offset) {
      return DataLossError("tensor '" + std::string(prev.name) + "' data [" +
                           std::to_string(prev.offset) + ", " +
                           std::to_string(prev.offset + prev.num_bytes) + ") overlaps tensor '" +
                           std::string(next.name) + "' at data offset " +
                           std::to_string(next.offset));
    }
  }
  return Status::Ok();
}

}  // namespace kvl
