// GgufValue accessors and GgufFile's typed metadata getters.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kvl/gguf.h"

namespace kvl {
namespace {

template <typename T>
T LoadAt(const uint8_t* p, uint64_t k) {
  T v;
  std::memcpy(&v, p + k * sizeof(T), sizeof(T));  // elements may be unaligned in the file
  return v;
}

// Float-to-int that is defined for every input: NaN gives 0, out-of-range values saturate. A file
// can hold any float bits, and a plain cast of NaN or 1e30 to int64 is undefined behaviour.
int64_t SaturatingInt(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (v < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsUnsignedType(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 ||
         t == GgufValueType::kUint32 || t == GgufValueType::kUint64;
}

bool IsFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

// "uint32" for scalars, "array of string" for arrays, as the mismatch errors print them.
std::string DescribeType(const GgufValue& v) {
  if (v.type != GgufValueType::kArray) return std::string(GgufValueTypeName(v.type));
  return "array of " + std::string(GgufValueTypeName(v.array_type));
}

Status Mismatch(std::string_view key, const GgufValue& v, std::string_view wanted) {
  return InvalidArgumentError("metadata key '" + std::string(key) + "' holds " + DescribeType(v) +
                              ", wanted " + std::string(wanted));
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const { return IsIntegerType(type); }
bool GgufValue::is_float() const { return IsFloatType(type); }

double GgufValue::ArrayNumber(uint64_t k) const {
  KVL_CHECK_MSG(type == GgufValueType::kArray && array_data != nullptr && k < array_count,
                "ArrayNumber on a non-numeric array or past its end");
  switch (array_type) {
    case GgufValueType::kFloat32: return LoadAt<float>(array_data, k);
    case GgufValueType::kFloat64: return LoadAt<double>(array_data, k);
    case GgufValueType::kUint64: return static_cast<double>(LoadAt<uint64_t>(array_data, k));
    default: return static_cast<double>(ArrayInt(k));
  }
}

int64_t GgufValue::ArrayInt(uint64_t k) const {
  KVL_CHECK_MSG(type == GgufValueType::kArray && array_data != nullptr && k < array_count,
                "ArrayInt on a non-numeric array or past its end");
  switch (array_type) {
    case GgufValueType::kUint8: return LoadAt<uint8_t>(array_data, k);
    case GgufValueType::kInt8: return LoadAt<int8_t>(array_data, k);
    case GgufValueType::kUint16: return LoadAt<uint16_t>(array_data, k);
    case GgufValueType::kInt16: return LoadAt<int16_t>(array_data, k);
    case GgufValueType::kUint32: return LoadAt<uint32_t>(array_data, k);
    case GgufValueType::kInt32: return LoadAt<int32_t>(array_data, k);
    case GgufValueType::kBool: return LoadAt<uint8_t>(array_data, k);
    // Values above INT64_MAX wrap, as a cast would; callers that care use ArrayNumber.
    case GgufValueType::kUint64: return static_cast<int64_t>(LoadAt<uint64_t>(array_data, k));
    case GgufValueType::kInt64: return LoadAt<int64_t>(array_data, k);
    case GgufValueType::kFloat32: return SaturatingInt(LoadAt<float>(array_data, k));
    case GgufValueType::kFloat64: return SaturatingInt(LoadAt<double>(array_data, k));
    default: break;
  }
  KVL_CHECK_MSG(false, "ArrayInt on an array of strings or arrays");
  return 0;
}

float GgufValue::ArrayFloat(uint64_t k) const { return static_cast<float>(ArrayNumber(k)); }

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

static Status MissingKey(std::string_view key) {
  return NotFoundError("metadata key '" + std::string(key) + "' not found");
}

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return MissingKey(key);
  if (v->type != GgufValueType::kString) return Mismatch(key, *v, "string");
  return std::string(v->str);
}

StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return MissingKey(key);
  if (!v->is_integer()) return Mismatch(key, *v, "an integer");
  if (!IsUnsignedType(v->type)) return v->i;
  if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgumentError("metadata key '" + std::string(key) + "' holds uint64 " +
                                std::to_string(v->u) + ", which does not fit int64");
  }
  return static_cast<int64_t>(v->u);
}

StatusOr<float> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return MissingKey(key);
  if (v->is_float()) return static_cast<float>(v->f);
  if (v->is_integer()) {
    return IsUnsignedType(v->type) ? static_cast<float>(v->u) : static_cast<float>(v->i);
  }
  return Mismatch(key, *v, "a number");
}

StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return MissingKey(key);
  if (v->type != GgufValueType::kBool) return Mismatch(key, *v, "bool");
  return v->u != 0;
}

StatusOr<const GgufValue*> GgufFile::GetArray(std::string_view key,
                                              GgufValueType elem_type) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return MissingKey(key);
  if (v->type != GgufValueType::kArray || v->array_type != elem_type) {
    return Mismatch(key, *v, "array of " + std::string(GgufValueTypeName(elem_type)));
  }
  return v;
}

}  // namespace kvl
