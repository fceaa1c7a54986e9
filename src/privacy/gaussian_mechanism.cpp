#include "privacy/gaussian_mechanism.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "fedwan/error.hpp"
#include "privacy/discrete_gaussian.hpp"

namespace fedwan::privacy {

LatticeNoise plan_lattice_noise(double noise_multiplier, double sensitivity, uint64_t dims) {
  if (!(noise_multiplier > 0) || !std::isfinite(noise_multiplier) || !(sensitivity > 0) ||
      !std::isfinite(sensitivity) || dims == 0) {
    throw ConfigError("privacy: noise needs a finite multiplier > 0, a finite sensitivity > 0 "
                      "and at least one coordinate");
  }
  const double root_d = std::sqrt(static_cast<double>(dims));
  // Lattice points per sensitivity/sqrt(d): kSteps, more when the noise
  // would span fewer than kMinSigma points (a small multiplier), fewer when
  // it would pass the sampler's range. The noise is z x the charged
  // sensitivity (sensitivity + one step per coordinate), so the accountant
  // composes z itself.
  const double max_sigma = static_cast<double>(DiscreteGaussian::kMaxSigma);
  const double z_root_d = noise_multiplier * root_d;
  double points = std::max(kSteps, kMinSigma / z_root_d);
  points = std::min(points, kMaxPoints / root_d);
  if (z_root_d * (points + 1) > max_sigma) points = max_sigma / z_root_d - 1;
  if (points < 1) {
    throw ConfigError("privacy: noise multiplier " + std::to_string(noise_multiplier) + " over " +
                      std::to_string(dims) + " coordinates is beyond the noise sampler's range");
  }
  LatticeNoise p;
  p.step = sensitivity / (points * root_d);
  p.sensitivity = sensitivity + p.step * root_d;
  const double sigma = z_root_d * (points + 1);
  p.sigma2 = static_cast<uint64_t>(std::ceil(sigma * sigma));
  if (p.sigma2 == 0) p.sigma2 = 1;
  p.noise_std = p.step * std::sqrt(static_cast<double>(p.sigma2));
  return p;
}

void noise_mean(float* mean, size_t n, double weight, const LatticeNoise& plan, RandomSource& rng) {
  if (!(weight > 0) || !(plan.step > 0)) {
    throw Error("privacy: noise on a mean needs a weight > 0 and a planned lattice");
  }
  const DiscreteGaussian noise(plan.sigma2);
  constexpr double kLimit = 4.0e18;  // |lattice point| kept inside int64
  for (size_t i = 0; i < n; ++i) {
    const double q = std::nearbyint(static_cast<double>(mean[i]) * weight / plan.step);
    if (!(std::fabs(q) < kLimit)) {
      // A clipped sum never comes near (kMaxPoints bounds it); a NaN or a
      // sum of unclipped values might: refused, never clamped.
      throw Error("privacy: a sum of " + std::to_string(mean[i] * weight) +
                  " is beyond the noise lattice's range (a value that was not clipped?)");
    }
    const int64_t point = static_cast<int64_t>(q) + noise.sample(rng);
    mean[i] = static_cast<float>(static_cast<double>(point) * plan.step / weight);
  }
}

double clip_l2(float* v, size_t n, double bound) {
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(v[i]) * v[i];
  const double norm = std::sqrt(sq);
  if (!(norm > bound)) return 1.0;
  const double scale = bound / norm;
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(v[i] * scale);
  // Float rounding may leave the norm a hair above: shave it.
  double after = 0;
  for (size_t i = 0; i < n; ++i) after += static_cast<double>(v[i]) * v[i];
  if (std::sqrt(after) > bound) {
    const double shave = bound / std::sqrt(after) * (1 - 1e-7);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(v[i] * shave);
    return scale * shave;
  }
  return scale;
}

double chunk_share(double bound, uint64_t chunk, uint64_t total) {
  if (total == 0) return 0;
  return bound * std::sqrt(static_cast<double>(chunk) / static_cast<double>(total));
}

}  // namespace fedwan::privacy
