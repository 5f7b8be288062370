// Binds a GGUF file's tensors to typed views for Model::BindWeights: each tensor's presence, shape
// and type checked against the config, and the names bound kept, so that the model can refuse a
// tensor its forward pass would not read.
//
// Thread-safety: used by one thread, during Model::Load.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/model.h"
#include "kvl/status.h"

namespace kvl {

class WeightBinder {
 public:
  // `converted` keeps the weights that cannot be read in place (Q5_0 rewritten as Q8_0); the
  // views point into its buffers, so it must outlive them (the Model owns it).
  WeightBinder(const GgufFile& file, std::vector<std::vector<uint8_t>>* converted)
      : file_(file), converted_(converted) {}

  // A matrix of `rows` outputs by `cols` inputs: GGUF dims {cols, rows}.
  Status Matrix(const std::string& name, int64_t rows, int64_t cols, MatrixView* out);
  // `num_experts` such matrices stacked: GGUF dims {cols, rows, num_experts}.
  Status Experts(const std::string& name, int64_t num_experts, int64_t rows, int64_t cols,
                 ExpertMatrices* out);
  // An f32 vector of n values (a norm, a bias, RoPE factors).
  Status Vector(const std::string& name, int64_t n, const float** out);

  bool IsBound(const std::string& name) const { return bound_.count(name) > 0; }
  int64_t num_parameters() const { return num_parameters_; }
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  // `count` matrices of [rows][cols] in one tensor of dims `dims`, as one view of count * rows
  // rows.
  Status Stacked(const std::string& name, const std::vector<int64_t>& dims, int64_t count,
                 int64_t rows, int64_t cols, MatrixView* out);

  const GgufFile& file_;
  std::vector<std::vector<uint8_t>>* converted_;
  std::set<std::string> bound_;
  int64_t num_parameters_ = 0;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvl
