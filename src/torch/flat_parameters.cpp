#include "fedwan/flat_parameters.hpp"

#include <sstream>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include "fedwan/error.hpp"

namespace fedwan {

FlatParameters::FlatParameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> tensors;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    tensors.push_back(item.value());
  }
  adopt(std::move(tensors), std::move(names));
}

FlatParameters::FlatParameters(std::vector<torch::Tensor> tensors) {
  std::vector<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) names.push_back("tensor[" + std::to_string(i) + "]");
  adopt(std::move(tensors), std::move(names));
}

void FlatParameters::adopt(std::vector<torch::Tensor> tensors, std::vector<std::string> names) {
  if (tensors.empty()) throw ConfigError("the model has no parameters to federate");
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!t.defined()) throw ConfigError("parameter '" + names[i] + "' is undefined");
    if (t.scalar_type() != torch::kFloat32) {
      throw ConfigError("parameter '" + names[i] + "' is " +
                        std::string(c10::toString(t.scalar_type())) +
                        "; fedwan federates fp32 parameters "
                        "(call module->to(torch::kFloat32))");
    }
    if (!t.device().is_cpu() && !t.device().is_cuda()) {
      throw ConfigError("parameter '" + names[i] + "' is on " + t.device().str() +
                        "; fedwan federates parameters on the CPU or a CUDA device");
    }
    if (t.device() != tensors[0].device()) {
      throw ConfigError("parameter '" + names[i] + "' is on " + t.device().str() + " but '" +
                        names[0] + "' on " + tensors[0].device().str() +
                        "; fedwan federates a model whose parameters share one device "
                        "(call module->to(device))");
    }
    total += t.numel();
  }
  flat_ = torch::empty({total},
                       torch::TensorOptions().dtype(torch::kFloat32).device(tensors[0].device()));
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (torch::Tensor& t : tensors) {
    torch::Tensor slice = flat_.narrow(0, offset, t.numel()).view(t.sizes());
    slice.copy_(t);
    t.set_data(slice);  // same Variable, storage now inside flat_
    offset += t.numel();
  }
  tensors_ = std::move(tensors);
  names_ = std::move(names);
}

std::string FlatParameters::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    os << names_[i] << ": " << tensors_[i].sizes() << "\n";
  }
  return os.str();
}

}  // namespace fedwan
