// FedAvg as an outer optimizer: plain SGD on the pseudo-gradient,
// params -= lr * g. With lr 1 the new global model is exactly the weighted
// mean of the sites' models. Keeps no state. Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "aggregation/outer_registry.hpp"
#include "fedwan/outer_optimizer.hpp"

namespace fedwan::aggregation {

class FedAvgOptimizer final : public OuterOptimizer {
 public:
  // Its name, hyper-parameters and factory (outer_registry.hpp).
  static const OuterOptimizerDef& definition();

  // Trusted as given: make_outer_optimizer validates user input and
  // fills in the defaults of definition().
  struct Options {
    float lr = 0;
  };

  FedAvgOptimizer(const Options& options, size_t total_elements);

  std::string_view name() const override { return "fedavg"; }
  void begin_round(uint64_t round) override;
  void step(float* params, const float* pseudo_grad, size_t offset, size_t n) override;
  std::vector<StateBuffer> state() override { return {}; }

 private:
  Options options_;
  size_t total_elements_;
};

}  // namespace fedwan::aggregation
