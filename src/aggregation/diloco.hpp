// DiLoCo's outer optimizer: SGD with Nesterov momentum on the pseudo-gradient,
//   buf = m * buf + g;  params -= lr * (g + m * buf).
// The momentum buffer lives across rounds; it is the only state and must be
// checkpointed with the global model. Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "aggregation/outer_registry.hpp"
#include "fedwan/outer_optimizer.hpp"

namespace fedwan {

class DiLoCoOptimizer final : public OuterOptimizer {
 public:
  // Its name, hyper-parameters and factory (outer_registry.hpp).
  static const OuterOptimizerDef& definition();

  // Trusted as given: make_outer_optimizer validates user input and
  // fills in the defaults of definition().
  struct Options {
    float lr = 0;
    float momentum = 0;
  };

  // Allocates a zeroed momentum buffer of total_elements floats.
  DiLoCoOptimizer(const Options& options, size_t total_elements);

  std::string_view name() const override { return "diloco"; }
  void begin_round(uint64_t round) override;
  void step(float* params, const float* pseudo_grad, size_t offset, size_t n) override;
  // One buffer, "momentum".
  std::vector<StateBuffer> state() override;

 private:
  Options options_;
  std::vector<float> momentum_;
};

}  // namespace fedwan
