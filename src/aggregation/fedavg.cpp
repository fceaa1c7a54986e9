#include "aggregation/fedavg.hpp"

#include <memory>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan::aggregation {

const OuterOptimizerDef& FedAvgOptimizer::definition() {
  static const OuterOptimizerDef def{
      "fedavg",
      {{"lr", 1.0, ParamRange::kLearningRate, "outer learning rate: params -= lr * mean delta"}},
      [](const OuterParamValues& v, size_t total) -> std::unique_ptr<OuterOptimizer> {
        Options o;
        o.lr = v.f32("lr");
        return std::make_unique<FedAvgOptimizer>(o, total);
      }};
  return def;
}

FedAvgOptimizer::FedAvgOptimizer(const Options& options, size_t total_elements)
    : options_(options), total_elements_(total_elements) {}

void FedAvgOptimizer::begin_round(uint64_t /*round*/) {}

void FedAvgOptimizer::step(float* params, const float* pseudo_grad, size_t offset, size_t n) {
  if (offset > total_elements_ || n > total_elements_ - offset) {
    FEDWAN_THROW(Error, "fedavg step: range [" + std::to_string(offset) + ", +" +
                            std::to_string(n) + ") exceeds the model's " +
                            std::to_string(total_elements_) + " elements");
  }
  const float lr = options_.lr;
  for (size_t i = 0; i < n; ++i) params[i] -= lr * pseudo_grad[i];
}

}  // namespace fedwan::aggregation
