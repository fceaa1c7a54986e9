#include "aggregation/diloco.hpp"

#include <memory>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan {

const OuterOptimizerDef& DiLoCoOptimizer::definition() {
  static const OuterOptimizerDef def{
      "diloco",
      {{"lr", 0.7, ParamRange::kLearningRate, "outer learning rate"},
      {"momentum", 0.9, ParamRange::kUnitInterval, "Nesterov momentum"}},
      [](const OuterParamValues& v, size_t total) -> std::unique_ptr<OuterOptimizer> {
        Options o;
        o.lr = v.f32("lr");
        o.momentum = v.f32("momentum");
        return std::make_unique<DiLoCoOptimizer>(o, total);
      }};
  return def;
}

DiLoCoOptimizer::DiLoCoOptimizer(const Options& options, size_t total_elements)
    : options_(options), momentum_(total_elements, 0.0f) {}

void DiLoCoOptimizer::begin_round(uint64_t /*round*/) {}

void DiLoCoOptimizer::step(float* params, const float* pseudo_grad, size_t offset, size_t n) {
  const size_t total = momentum_.size();
  if (offset > total || n > total - offset) {
    FEDWAN_THROW(Error, "diloco step: range [" + std::to_string(offset) + ", +" +
                            std::to_string(n) + ") exceeds the model's " + std::to_string(total) +
                            " elements");
  }
  const float lr = options_.lr;
  const float m = options_.momentum;
  float* buf = momentum_.data() + offset;
  for (size_t i = 0; i < n; ++i) {
    const float g = pseudo_grad[i];
    const float b = m * buf[i] + g;
    buf[i] = b;
    params[i] -= lr * (g + m * b);
  }
}

std::vector<OuterOptimizer::StateBuffer> DiLoCoOptimizer::state() {
  return {{"momentum", &momentum_}};
}

}  // namespace fedwan
