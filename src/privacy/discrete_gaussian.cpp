#include "privacy/discrete_gaussian.hpp"

#include <cmath>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan::privacy {
namespace {

// exp(-num/den) for num <= den (algorithm 1, first part): the parity of the
// first K whose Bernoulli(gamma / K) fails. K grows past 64 with probability
// below 1/64!; it stops there.
bool bernoulli_exp_at_most_one(RandomSource& rng, u128 num, u128 den) {
  uint64_t k = 1;
  for (; k < 64; ++k) {
    if (!rng.bernoulli(num, den * k)) break;
  }
  return (k % 2) == 1;
}

uint64_t isqrt(uint64_t v) {
  auto r = static_cast<uint64_t>(std::sqrt(static_cast<double>(v)));
  while (r * r > v) --r;
  while ((r + 1) * (r + 1) <= v) ++r;
  return r;
}

}  // namespace

bool bernoulli_exp(RandomSource& rng, u128 num, u128 den) {
  if (den == 0) throw Error("bernoulli_exp: a zero denominator");
  // exp(-x) = exp(-1)^floor(x) * exp(-(x - floor(x))): each factor a
  // Bernoulli trial of its own, stopping at the first that fails.
  const u128 whole = num / den;
  for (u128 i = 0; i < whole; ++i) {
    if (!bernoulli_exp_at_most_one(rng, 1, 1)) return false;
  }
  return bernoulli_exp_at_most_one(rng, num % den, den);
}

int64_t discrete_laplace(RandomSource& rng, uint64_t t) {
  if (t == 0) throw Error("discrete_laplace: a zero scale");
  for (;;) {
    const uint64_t u = rng.below(t);
    if (!bernoulli_exp(rng, u, t)) continue;
    uint64_t v = 0;
    while (bernoulli_exp(rng, 1, 1)) ++v;
    const u128 x = u + static_cast<u128>(t) * v;
    const bool negative = rng.below(uint64_t{2}) == 1;
    if (negative && x == 0) continue;
    if (x > static_cast<u128>(INT64_MAX)) continue;
    return negative ? -static_cast<int64_t>(x) : static_cast<int64_t>(x);
  }
}

DiscreteGaussian::DiscreteGaussian(uint64_t sigma2) : sigma2_(sigma2) {
  if (sigma2 == 0 || sigma2 > kMaxSigma * kMaxSigma) {
    throw ConfigError("discrete Gaussian: variance " + std::to_string(sigma2) +
                      " in lattice units is outside 1.." + std::to_string(kMaxSigma * kMaxSigma));
  }
  t_ = isqrt(sigma2) + 1;
  max_abs_ = (isqrt(sigma2) + 1) << 12;
}

int64_t DiscreteGaussian::sample(RandomSource& rng) const {
  // Algorithm 3: a discrete Laplace draw Y with scale t, kept with
  // probability exp(-(|Y| - sigma2/t)^2 / (2 sigma2)); over the common
  // denominator t: (|Y| t - sigma2)^2 / (2 sigma2 t^2).
  const u128 t = t_;
  const u128 s2 = sigma2_;
  for (;;) {
    const int64_t y = discrete_laplace(rng, t_);
    const uint64_t mag = y < 0 ? static_cast<uint64_t>(-(y + 1)) + 1 : static_cast<uint64_t>(y);
    if (mag > max_abs_) continue;
    const u128 yt = mag * t;
    const u128 diff = yt > s2 ? yt - s2 : s2 - yt;
    if (bernoulli_exp(rng, diff * diff, 2 * s2 * t * t)) return y;
  }
}

}  // namespace fedwan::privacy
