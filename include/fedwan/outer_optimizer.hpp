// Outer optimizers run at the root on the global model, once per round, fed
// the weighted mean pseudo-gradient of all sites (anchor - local: a descent
// direction, like a gradient). They are elementwise, so the root steps each
// chunk as soon as every child's chunk arrived. Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fedwan {

// The outer optimizer a federation uses (the topology's
// federation.outer_optimizer) and its hyper-parameters.
struct OuterOptimizerSpec {
  std::string name = "fedavg";  // fedavg | diloco | fedadam
  std::optional<double> lr;      // default per optimizer
  std::optional<double> momentum;
  std::optional<double> beta1, beta2, eps;
};

class OuterOptimizer {
 public:
  virtual ~OuterOptimizer() = default;
  virtual std::string_view name() const = 0;

  // Called once per round before any step() of that round (round counts from 0).
  virtual void begin_round(uint64_t round) = 0;

  // params[offset, offset+n) -= update(pseudo_grad[0, n)); state for the same
  // range is advanced. `params` and `pseudo_grad` point at element `offset`.
  virtual void step(float* params, const float* pseudo_grad, size_t offset, size_t n) = 0;

  // Named state buffers (momentum, moments) for checkpoints and tests.
  struct StateBuffer {
    std::string name;
    std::vector<float>* data;
  };
  virtual std::vector<StateBuffer> state() = 0;
};

// fedavg:  SGD, lr default 1.0 (params -= lr * g)
// diloco:  SGD with Nesterov momentum, lr 0.7, momentum 0.9
//          (buf = m*buf + g; params -= lr * (g + m*buf))
// fedadam: Adam without bias correction (Reddi et al. 2021), lr 0.01,
//          beta1 0.9, beta2 0.99, eps 1e-3
// Throws ConfigError for an unknown name or out-of-range hyper-parameters.
std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptimizerSpec& spec,
                                                     size_t total_elements);
std::vector<std::string> outer_optimizer_names();

}  // namespace fedwan
