// What a node trains, as settings: the Fashion-MNIST CNN (the demo) or the
// synthetic quadratic (tests and benchmarks, no data needed), and the flags
// that set them. Free of LibTorch, so a program without it (the
// torch-free fedwan-aggregator) parses the same flags; what needs LibTorch
// is in cli/workload.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace fedwan::cli
