// One contiguous fp32 buffer for all of a model's parameters. Construction
// copies every parameter into the buffer and re-points the parameter at its
// slice (Tensor::set_data), so the module, its optimizer and fedwan all see
// the same memory: no copy per step, no message per tensor. Parameters keep
// their identity, so an optimizer built before or after keeps its state.
// The buffer lives where the parameters do: on the CPU, or on the one CUDA
// device they all share (then data() is a device pointer).
// Thread safety: none; the training loop owns it.
#pragma once

#include "fedwan/export.hpp"

#include <cstddef>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace fedwan {

class FEDWAN_API FlatParameters {
 public:
  // Every parameter of `module` (frozen ones too; buffers stay local).
  // Throws ConfigError unless all are fp32, on one device (the CPU or one
  // CUDA device), and there is one.
  explicit FlatParameters(torch::nn::Module& module);
  explicit FlatParameters(std::vector<torch::Tensor> tensors);

  torch::Tensor flat() const { return flat_; }       // fp32 [numel], contiguous
  float* data() { return flat_.data_ptr<float>(); }  // on device()
  torch::Device device() const { return flat_.device(); }
  size_t numel() const { return static_cast<size_t>(flat_.numel()); }
  size_t num_tensors() const { return tensors_.size(); }
  const std::vector<torch::Tensor>& tensors() const { return tensors_; }
  // "name: shape" lines, for error messages and logs.
  std::string describe() const;

 private:
  void adopt(std::vector<torch::Tensor> tensors, std::vector<std::string> names);

  torch::Tensor flat_;
  std::vector<torch::Tensor> tensors_;
  std::vector<std::string> names_;
};

}  // namespace fedwan
