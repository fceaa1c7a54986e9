// What a node trains: the Fashion-MNIST CNN (the demo) or the synthetic
// quadratic (tests and benchmarks, no data needed). Shared by the site,
// aggregator and demo commands so that every process derives the same model,
// shards and weights from the same settings.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace CLI {
class App;
}

namespace fedwan::cli {

struct WorkloadSettings {
  std::string trainer = "fashion-cnn";  // fashion-cnn | synthetic
  uint64_t seed = 1;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  double alpha = 2.0;  // Dirichlet concentration of the label split
  int64_t batch_size = 64;
  std::string inner_optimizer = "adam";  // adam | sgd
  double lr = 1e-3;
  uint64_t synthetic_size = 100000;  // parameters of the synthetic model
};

// Registers the workload flags on a subcommand.
void add_workload_flags(CLI::App& app, WorkloadSettings& s);

// The flags that reproduce `s` in a child process.
std::vector<std::string> workload_args(const WorkloadSettings& s);

// The initial model, flat (every node derives the same from the settings).
std::vector<float> initial_model(const WorkloadSettings& s);
// The model's parameter count, without building the model's values.
uint64_t model_parameters(const WorkloadSettings& s);

// The site (and baseline) optimizer the settings name, over `module`.
std::unique_ptr<torch::optim::Optimizer> make_inner_optimizer(torch::nn::Module& module,
                                                              const WorkloadSettings& s);

// Sample indices of each of `num_sites` sites (fashion-cnn only).
std::vector<std::vector<uint32_t>> fashion_shards(const WorkloadSettings& s, size_t num_sites);

}  // namespace fedwan::cli
