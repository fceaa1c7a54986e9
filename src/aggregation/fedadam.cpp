#include "aggregation/fedadam.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan::aggregation {

const OuterOptimizerDef& FedAdamOptimizer::definition() {
  static const OuterOptimizerDef def{
      "fedadam",
      {{"lr", 0.01, ParamRange::kLearningRate, "outer learning rate"},
       {"beta1", 0.9, ParamRange::kUnitInterval, "first-moment decay"},
       {"beta2", 0.99, ParamRange::kUnitInterval, "second-moment decay"},
       {"eps", 1e-3, ParamRange::kPositive, "the denominator's epsilon"}},
      [](const OuterParamValues& v, size_t total) -> std::unique_ptr<OuterOptimizer> {
        Options o;
        o.lr = v.f32("lr");
        o.beta1 = v.f32("beta1");
        o.beta2 = v.f32("beta2");
        o.eps = v.f32("eps");
        return std::make_unique<FedAdamOptimizer>(o, total);
      }};
  return def;
}

FedAdamOptimizer::FedAdamOptimizer(const Options& options, size_t total_elements)
    : options_(options), first_moment_(total_elements), second_moment_(total_elements) {}

void FedAdamOptimizer::begin_round(uint64_t /*round*/) {}

void FedAdamOptimizer::step(float* params, const float* pseudo_grad, size_t offset, size_t n) {
  const size_t total = first_moment_.size();
  if (offset > total || n > total - offset) {
    FEDWAN_THROW(Error, "fedadam step: range [" + std::to_string(offset) + ", +" +
                            std::to_string(n) + ") exceeds the model's " + std::to_string(total) +
                            " elements");
  }
  const float lr = options_.lr;
  const float b1 = options_.beta1;
  const float b2 = options_.beta2;
  const float one_minus_b1 = 1.0f - b1;
  const float one_minus_b2 = 1.0f - b2;
  const float eps = options_.eps;
  float* m = first_moment_.data() + offset;
  float* v = second_moment_.data() + offset;
  for (size_t i = 0; i < n; ++i) {
    const float g = pseudo_grad[i];
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] -= lr * mi / (std::sqrt(vi) + eps);
  }
}

std::vector<OuterOptimizer::StateBuffer> FedAdamOptimizer::state() {
  return {{"first_moment", first_moment_.data(), first_moment_.size()},
          {"second_moment", second_moment_.data(), second_moment_.size()}};
}

}  // namespace fedwan::aggregation
