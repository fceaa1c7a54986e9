// Exact samplers of the discrete Gaussian on the integers (Canonne, Kamath
// and Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS
// 2020, algorithms 1 to 3): integer arithmetic on exact rationals over a
// cryptographic random source, so the noise has no floating-point artefacts
// (Mironov, CCS 2012) through which the value it hides could be read.
//
// The variance is an integer (sigma^2, in lattice units); a caller rounds
// its variance up, so the noise is never weaker than asked. Intermediate
// values are 128-bit: sigma is at most kMaxSigma and a draw beyond 2^12
// sigma is drawn again (a truncation at probability below e^-8e6).
#pragma once

#include <cstdint>

#include "privacy/random_source.hpp"

namespace fedwan::privacy {

// 1 with probability exp(-num/den), exactly (den > 0).
bool bernoulli_exp(RandomSource& rng, u128 num, u128 den);

// The discrete Laplace distribution with scale t >= 1:
// P(x) proportional to exp(-|x| / t).
int64_t discrete_laplace(RandomSource& rng, uint64_t t);

class DiscreteGaussian {
 public:
  static constexpr uint64_t kMaxSigma = uint64_t{1} << 25;
  // sigma2: the variance parameter, 1..kMaxSigma^2 (throws ConfigError
  // otherwise).
  explicit DiscreteGaussian(uint64_t sigma2);
  // P(x) proportional to exp(-x^2 / (2 sigma2)).
  int64_t sample(RandomSource& rng) const;
  uint64_t sigma2() const { return sigma2_; }

 private:
  uint64_t sigma2_;
  uint64_t t_;        // floor(sigma) + 1
  uint64_t max_abs_;  // draws beyond are drawn again
};

}  // namespace fedwan::privacy
