#include "aggregation/diloco.hpp"

#include <memory>
#include <string>

#include "common/cpu_features.hpp"
#include "fedwan/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fedwan::aggregation {
namespace {

// b = m * buf + g; buf = b; params -= lr * (g + m * b): each product and sum
// rounded on its own (no FMA), so every path gives the same bits.
void step_scalar(float* params, const float* g, float* buf, size_t n, float lr, float m) {
  for (size_t i = 0; i < n; ++i) {
    const float b = m * buf[i] + g[i];
    buf[i] = b;
    params[i] -= lr * (g[i] + m * b);
  }
}

#if defined(__x86_64__)
// "avx2" only, not "fma": nothing for the compiler to contract.
__attribute__((target("avx2"))) void step_avx2(float* params, const float* g, float* buf, size_t n,
                                               float lr, float m) {
  const __m256 vm = _mm256_set1_ps(m), vlr = _mm256_set1_ps(lr);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 b = _mm256_add_ps(_mm256_mul_ps(vm, _mm256_loadu_ps(buf + i)), gi);
    _mm256_storeu_ps(buf + i, b);
    const __m256 s = _mm256_mul_ps(vlr, _mm256_add_ps(gi, _mm256_mul_ps(vm, b)));
    _mm256_storeu_ps(params + i, _mm256_sub_ps(_mm256_loadu_ps(params + i), s));
  }
  step_scalar(params + i, g + i, buf + i, n - i, lr, m);
}
#endif

using StepFn = void (*)(float*, const float*, float*, size_t, float, float);

StepFn pick_step() {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return step_avx2;
#endif
  return step_scalar;
}

}  // namespace

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
    : options_(options), round_lr_(options.lr), momentum_(total_elements) {}

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
  static const StepFn fn = pick_step();
  fn(params, pseudo_grad, momentum_.data() + offset, n, round_lr_, options_.momentum);
}

std::vector<OuterOptimizer::StateBuffer> DiLoCoOptimizer::state() {
  return {{"momentum", momentum_.data(), momentum_.size()}};
}

}  // namespace fedwan::aggregation
