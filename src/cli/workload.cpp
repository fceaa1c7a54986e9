#include "cli/workload.hpp"

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <CLI/CLI.hpp>

#include "cli/validators.hpp"
#include "fedwan/error.hpp"
#include "fedwan/flat_parameters.hpp"
#include "fedwan/synthetic.hpp"
#include "workload/fashion_mnist.hpp"
#include "workload/fashion_model.hpp"
#include "workload/partition.hpp"

namespace fedwan::cli {

using workload::FashionMnistData;
using workload::FashionMnistSet;
using workload::load_fashion_mnist;
using workload::FashionCnn;
using workload::make_fashion_cnn;

std::vector<float> initial_model(const WorkloadSettings& s) {
  if (s.trainer == "synthetic") return synthetic::initial_model(s.synthetic_size, s.seed);
  FashionCnn model = make_fashion_cnn(s.seed);
  FlatParameters flat(*model);
  const float* p = flat.data();
  return std::vector<float>(p, p + flat.numel());
}

uint64_t model_parameters(const WorkloadSettings& s) {
  if (s.trainer == "synthetic") return s.synthetic_size;
  FashionCnn model = make_fashion_cnn(s.seed);
  uint64_t n = 0;
  for (const torch::Tensor& t : model->parameters()) n += static_cast<uint64_t>(t.numel());
  return n;
}

std::unique_ptr<torch::optim::Optimizer> make_inner_optimizer(torch::nn::Module& module,
                                                              const WorkloadSettings& s) {
  if (s.inner_optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(module.parameters(),
                                                torch::optim::AdamOptions(s.lr));
  }
  return std::make_unique<torch::optim::SGD>(module.parameters(),
                                             torch::optim::SGDOptions(s.lr).momentum(0.9));
}

std::vector<std::vector<uint32_t>> fashion_shards(const WorkloadSettings& s, size_t num_sites) {
  const FashionMnistData train = load_fashion_mnist(FashionMnistSet::kTrain, s.data_dir);
  return workload::dirichlet_partition(train.label_bytes, workload::kFashionMnistClasses, num_sites,
                                       s.alpha, s.seed);
}

}  // namespace fedwan::cli
