#include "weight_binder.h"

#include <fmt/format.h>

#include "kvl/quant.h"

namespace kvl {

Status WeightBinder::Stacked(const std::string& name, const std::vector<int64_t>& dims,
                             int64_t count, int64_t rows, int64_t cols, MatrixView* out) {
  const GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) return DataLossError(fmt::format("missing tensor '{}'", name));
  if (t->dims != dims) {
    return DataLossError(fmt::format("tensor '{}' has shape [{}], expected [{}] from metadata",
                                     name, fmt::join(t->dims, ", "), fmt::join(dims, ", ")));
  }
  num_parameters_ += t->num_elements;
  const int64_t all_rows = count * rows;
  if (t->type == DType::kQ5_0) {
    // No Q5_0 kernels: the same values as Q8_0 blocks (1.5x the bytes, the Q8_0 speed).
    std::vector<uint8_t>& q8 = converted_->emplace_back(
        static_cast<size_t>(all_rows * RowBytes(DType::kQ8_0, cols)));
    quant::Q5_0ToQ8_0(t->data, all_rows * cols / quant::kQK, q8.data());
    *out = MatrixView{DType::kQ8_0, q8.data(), all_rows, cols, RowBytes(DType::kQ8_0, cols)};
    weight_bytes_ += static_cast<int64_t>(q8.size());
    bound_.insert(name);
    return Status::Ok();
  }
  if (!Traits(t->type).supported) {
    return UnimplementedError(fmt::format("tensor '{}' has type {}, which kvlattice cannot run yet "
                                          "(supported: f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, "
                                          "q5_k, q6_k)",
                                          name, DTypeName(t->type)));
  }
  *out = MatrixView{t->type, t->data, all_rows, cols, RowBytes(t->type, cols)};
  weight_bytes_ += t->num_bytes;
  bound_.insert(name);
  return Status::Ok();
}

Status WeightBinder::Matrix(const std::string& name, int64_t rows, int64_t cols, MatrixView* out) {
  return Stacked(name, {cols, rows}, 1, rows, cols, out);
}

Status WeightBinder::Experts(const std::string& name, int64_t num_experts, int64_t rows,
                             int64_t cols, ExpertMatrices* out) {
  MatrixView all;
  KVL_RETURN_IF_ERROR(Stacked(name, {cols, rows, num_experts}, num_experts, rows, cols, &all));
  *out = ExpertMatrices{all.type, all.data, num_experts, rows, cols, all.row_bytes};
  return Status::Ok();
}

Status WeightBinder::Vector(const std::string& name, int64_t n, const float** out) {
  const GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) return DataLossError(fmt::format("missing tensor '{}'", name));
  if (t->dims.size() != 1 || t->dims[0] != n) {
    return DataLossError(fmt::format("tensor '{}' has shape [{}], expected [{}] from metadata",
                                     name, fmt::join(t->dims, ", "), n));
  }
  if (t->type != DType::kF32) {
    return UnimplementedError(fmt::format(
        "norm tensor '{}' has type {}; only f32 norms are supported", name, DTypeName(t->type)));
  }
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    return DataLossError(fmt::format("tensor '{}' data is not 4-byte aligned", name));
  }
  *out = reinterpret_cast<const float*>(t->data);
  num_parameters_ += t->num_elements;
  weight_bytes_ += t->num_bytes;
  bound_.insert(name);
  return Status::Ok();
}

}  // namespace kvl
