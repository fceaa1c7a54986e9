// What `fedwan aggregator` uses LibTorch for (cli/commands.hpp,
// AggregatorTorch): the --trainer's initial model and the root's --eval.
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <torch/utils.h>

#include "cli/commands.hpp"
#include "cli/workload.hpp"
#include "fedwan/flat_parameters.hpp"
#include "workload/fashion_mnist.hpp"
#include "workload/fashion_model.hpp"

namespace fedwan::cli {
namespace {

// The fashion-cnn model and the test set, evaluated on each global model.
struct FashionEval {
  explicit FashionEval(const WorkloadSettings& s)
      : test(workload::load_fashion_mnist(workload::FashionMnistSet::kTest, s.data_dir)),
        model(workload::make_fashion_cnn(s.seed)),
        flat(*model) {}
  workload::FashionMnistData test;
  workload::FashionCnn model;
  FlatParameters flat;
};

}  // namespace

AggregatorTorch aggregator_torch() {
  AggregatorTorch t;
  t.initial_model = [](const WorkloadSettings& s) { return initial_model(s); };
  t.evaluator = [](const WorkloadSettings& s) -> AggregatorTorch::Evaluate {
    auto e = std::make_shared<FashionEval>(s);
    return [e](const std::vector<float>& global) {
      std::memcpy(e->flat.data(), global.data(), global.size() * sizeof(float));
      const workload::Evaluation r = workload::evaluate(e->model, e->test.images, e->test.labels);
      return std::make_pair(r.accuracy, r.loss);
    };
  };
  t.single_thread = [] { torch::set_num_threads(1); };
  return t;
}

}  // namespace fedwan::cli
