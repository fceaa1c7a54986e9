#include "fedwan/synthetic.hpp"

namespace fedwan::synthetic {
namespace {

// SplitMix64: a tiny, well-mixed, portable generator (std distributions are
// not reproducible across standard libraries).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from 24 random bits: exact in float.
float unit(uint64_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits >> 40) - (1 << 23)) / float(1 << 23);
}

}  // namespace

std::vector<float> initial_model(size_t n, uint64_t seed) {
  std::vector<float> p(n);
  for (size_t k = 0; k < n; ++k) p[k] = 0.1f * unit(mix(seed ^ mix(k)));
  return p;
}

float target(uint32_t site, size_t k, uint64_t seed) {
  return unit(mix(seed + 0x1234 + mix(uint64_t{site} << 40 ^ k)));
}

void local_steps(float* params, size_t n, uint32_t site, uint64_t steps, uint64_t seed, float lr) {
  for (size_t k = 0; k < n; ++k) {
    const float t = target(site, k, seed);
    float p = params[k];
    for (uint64_t s = 0; s < steps; ++s) p = p - lr * (p - t);
    params[k] = p;
  }
}

}  // namespace fedwan::synthetic
