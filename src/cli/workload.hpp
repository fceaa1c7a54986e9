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

#include "cli/workload_settings.hpp"

namespace fedwan::cli {

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
