// Outer optimizers run at the root on the global model, once per round, fed
// the weighted mean pseudo-gradient of all sites (anchor - local: a descent
// direction, like a gradient). They are elementwise, so the root steps each
// chunk as soon as every child's chunk arrived, and splits a chunk's step
// over its helper threads: step() on disjoint ranges may run on several
// threads at once, nothing else meanwhile. Otherwise one owner.
#pragma once

#include "fedwan/export.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fedwan {

// The outer optimizer a federation uses (the topology's
// federation.outer_optimizer) and its hyper-parameters, by name: which names
// an optimizer takes, their defaults and ranges, is the optimizer's own
// business (outer_optimizer_params()); a name it does not take is refused.
struct FEDWAN_API OuterOptimizerSpec {
  std::string name = "fedavg";           // one of outer_optimizer_names()
  std::map<std::string, double> params;  // a name left out: the optimizer's default

  // The value set for `key`, if any.
  std::optional<double> param(const std::string& key) const {
    auto it = params.find(key);
    return it == params.end() ? std::nullopt : std::optional<double>(it->second);
  }
};

// One hyper-parameter an outer optimizer takes.
struct FEDWAN_API OuterOptimizerParam {
  std::string name;
  double default_value = 0;
  std::string range;  // the values it takes, e.g. "(0, 100]", "[0, 1)"
  std::string help;   // one line for the docs and --help
};

class FEDWAN_API OuterOptimizer {
 public:
  virtual ~OuterOptimizer() = default;
  virtual std::string_view name() const = 0;

  // Called once per round before any step() of that round (round counts from 0).
  virtual void begin_round(uint64_t round) = 0;

  // params[offset, offset+n) -= update(pseudo_grad[0, n)); state for the same
  // range is advanced. `params` and `pseudo_grad` point at element `offset`.
  virtual void step(float* params, const float* pseudo_grad, size_t offset, size_t n) = 0;

  // Named state buffers (momentum, moments) for checkpoints and tests: a
  // view of `size` floats (the model's element count) the optimizer owns,
  // valid until it is destroyed. A buffer is zero until the first step()
  // writes it; its memory is spent as steps touch its pages, so making an
  // optimizer for a large model is instant.
  struct StateBuffer {
    std::string name;
    float* data = nullptr;
    size_t size = 0;
  };
  virtual std::vector<StateBuffer> state() = 0;

  // Starts taking the state's memory on a helper thread, ahead of the
  // steps that first write it (a root, before its children's first
  // round); the values do not change. None by default.
  virtual void warm_state() {}
};

// fedavg:  SGD (params -= lr * g)
// diloco:  SGD with Nesterov momentum (buf = m*buf + g; params -= lr * (g + m*buf))
// fedadam: Adam without bias correction (Reddi et al. 2021)
// Their hyper-parameters, defaults and ranges: outer_optimizer_params().
// Throws ConfigError for an unknown name, a hyper-parameter the optimizer
// does not take, or a value out of its range (outer_optimizer_problem()).
FEDWAN_API std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptimizerSpec& spec,
                                                                size_t total_elements);
FEDWAN_API std::vector<std::string> outer_optimizer_names();

// The hyper-parameters `optimizer` takes, in the order its docs list them.
// Throws ConfigError for an unknown optimizer.
FEDWAN_API std::vector<OuterOptimizerParam> outer_optimizer_params(const std::string& optimizer);

// Why `spec` cannot make an optimizer, or nullopt when it can. Without the
// optimizer's name in front: "unknown optimizer", "does not use 'x'; it
// takes lr, momentum", "lr -1 must be in (0, 100]".
FEDWAN_API std::optional<std::string> outer_optimizer_problem(const OuterOptimizerSpec& spec);

}  // namespace fedwan
