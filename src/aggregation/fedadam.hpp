// FedAdam (Reddi et al. 2021): Adam on the pseudo-gradient without bias
// correction, so the update depends only on the moments, not on the round:
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g;
//   params -= lr * m / (sqrt(v) + eps).
// Both moments live across rounds and must be checkpointed with the global
// model. Not thread safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "aggregation/outer_registry.hpp"
#include "common/zeroed_array.hpp"
#include "fedwan/outer_optimizer.hpp"

namespace fedwan::aggregation {

class FedAdamOptimizer final : public OuterOptimizer {
 public:
  // Its name, hyper-parameters and factory (outer_registry.hpp).
  static const OuterOptimizerDef& definition();

  // Trusted as given: make_outer_optimizer validates user input and
  // fills in the defaults of definition().
  struct Options {
    float lr = 0;
    float beta1 = 0;
    float beta2 = 0;
    float eps = 0;
  };

  // Two moment buffers of total_elements zeros each, their pages taken as
  // steps first write them.
  FedAdamOptimizer(const Options& options, size_t total_elements);

  std::string_view name() const override { return "fedadam"; }
  void begin_round(uint64_t round) override;
  void step(float* params, const float* pseudo_grad, size_t offset, size_t n) override;
  // Two buffers, "first_moment" (m) and "second_moment" (v).
  std::vector<StateBuffer> state() override;
  void warm_state() override {
    first_moment_.warm();
    second_moment_.warm();
  }

 private:
  Options options_;
  ZeroedArray<float> first_moment_;
  ZeroedArray<float> second_moment_;
};

}  // namespace fedwan::aggregation
