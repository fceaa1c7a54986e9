// DiLoCo's outer optimizer: SGD with Nesterov momentum on the pseudo-gradient,
//   buf = m * buf + g;  params -= lr_r * (g + m * buf),
// where lr_r ramps linearly over the first `lr_warmup_rounds` rounds
// (lr * (r + 1) / lr_warmup_rounds, then lr; 0: lr from the start). The
// ramp depends on the round alone, so a resumed root needs no extra state.
// The momentum buffer lives across rounds; it is the only state and must be
// checkpointed with the global model. Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "aggregation/outer_registry.hpp"
#include "common/zeroed_array.hpp"
#include "fedwan/outer_optimizer.hpp"

namespace fedwan::aggregation {

class DiLoCoOptimizer final : public OuterOptimizer {
 public:
  // Its name, hyper-parameters and factory (outer_registry.hpp).
  static const OuterOptimizerDef& definition();

  // Trusted as given: make_outer_optimizer validates user input and
  // fills in the defaults of definition().
  struct Options {
    float lr = 0;
    float momentum = 0;
    uint64_t lr_warmup_rounds = 0;
  };

  // A momentum buffer of total_elements zeros, its pages taken as steps
  // first write them.
  DiLoCoOptimizer(const Options& options, size_t total_elements);

  std::string_view name() const override { return "diloco"; }
  void begin_round(uint64_t round) override;
  void step(float* params, const float* pseudo_grad, size_t offset, size_t n) override;
  // One buffer, "momentum".
  std::vector<StateBuffer> state() override;
  void warm_state() override { momentum_.warm(); }

 private:
  Options options_;
  float round_lr_ = 0;  // lr_r of the round begin_round() opened
  ZeroedArray<float> momentum_;
};

}  // namespace fedwan::aggregation
