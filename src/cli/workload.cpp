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

void add_workload_flags(CLI::App& app, WorkloadSettings& s) {
  app.add_option("--trainer", s.trainer, "what to train: fashion-cnn or synthetic")
      ->check(CLI::IsMember({"fashion-cnn", "synthetic"}))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "seed of the model, the data split and the shuffling")
      ->check(number_in(0, 9007199254740991.0))
      ->capture_default_str();
  app.add_option("--data", s.data_dir, "Fashion-MNIST directory")->capture_default_str();
  app.add_option("--alpha", s.alpha, "Dirichlet concentration of the non-IID split")
      ->check(number_in(1e-3, 1e6, /*integer=*/false))
      ->capture_default_str();
  app.add_option("--batch-size", s.batch_size, "minibatch size")
      ->check(number_in(1, 65536))
      ->capture_default_str();
  app.add_option("--inner-optimizer", s.inner_optimizer, "site optimizer: adam or sgd")
      ->check(CLI::IsMember({"adam", "sgd"}))
      ->capture_default_str();
  app.add_option("--lr", s.lr, "site learning rate")
      ->check(number_in(1e-12, 100, /*integer=*/false))
      ->capture_default_str();
  app.add_option("--synthetic-size", s.synthetic_size, "parameters of the synthetic model")
      ->check(number_in(1, 1 << 30))
      ->capture_default_str();
}

std::vector<std::string> workload_args(const WorkloadSettings& s) {
  return {"--trainer",
          s.trainer,
          "--seed",
          std::to_string(s.seed),
          "--data",
          s.data_dir,
          "--alpha",
          std::to_string(s.alpha),
          "--batch-size",
          std::to_string(s.batch_size),
          "--inner-optimizer",
          s.inner_optimizer,
          "--lr",
          std::to_string(s.lr),
          "--synthetic-size",
          std::to_string(s.synthetic_size)};
}

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
