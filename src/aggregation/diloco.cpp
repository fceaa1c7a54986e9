#include "aggregation/diloco.hpp"

#include <memory>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan::aggregation {

const OuterOptimizerDef& DiLoCoOptimizer::definition() {
  static const OuterOptimizerDef def{
      "diloco",
      {{"lr", 0.7, ParamRange::kLearningRate, "outer learning rate"},
       {"momentum", 0.9, ParamRange::kUnitInterval, "Nesterov momentum"},
       {"lr_warmup_rounds", 0, ParamRange::kRoundCount,
        "rounds over which lr ramps up linearly from lr / lr_warmup_rounds; 0: none"}},
      [](const OuterParamValues& v, size_t total) -> std::unique_ptr<OuterOptimizer> {
        Options o;
        o.lr = v.f32("lr");
        o.momentum = v.f32("momentum");
        o.lr_warmup_rounds = v.rounds("lr_warmup_rounds");
        return std::make_unique<DiLoCoOptimizer>(o, total);
      }};
  return def;
}

DiLoCoOptimizer::DiLoCoOptimizer(const Options& options, size_t total_elements)
    : options_(options), round_lr_(options.lr), momentum_(total_elements, 0.0f) {}

void DiLoCoOptimizer::begin_round(uint64_t round) {
  const uint64_t warmup = options_.lr_warmup_rounds;
  round_lr_ = options_.lr;
  if (warmup > 0 && round + 1 < warmup) {
    round_lr_ = static_cast<float>(static_cast<double>(options_.lr) *
                                   static_cast<double>(round + 1) / static_cast<double>(warmup));
  }
}

void DiLoCoOptimizer::step(float* params, const float* pseudo_grad, size_t offset, size_t n) {
  const size_t total = momentum_.size();
  if (offset > total || n > total - offset) {
    FEDWAN_THROW(Error, "diloco step: range [" + std::to_string(offset) + ", +" +
                            std::to_string(n) + ") exceeds the model's " + std::to_string(total) +
                            " elements");
  }
  const float lr = round_lr_;
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

}  // namespace fedwan::aggregation
