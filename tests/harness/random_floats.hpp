// Reproducible test vectors: n normal values (mean 0, standard deviation
// sigma) from a fixed seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace fedwan::testing {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace fedwan::testing
