#include "privacy/quantile_clip.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "fedwan/error.hpp"
#include "privacy/discrete_gaussian.hpp"

namespace fedwan::privacy {
namespace {

// The count is drawn on a lattice this much finer than one site, so the
// noise's variance (an integer in lattice units, rounded up) is within
// 1e-6 of what the multiplier asks even when it is small.
constexpr double kUnits = 1000;

}  // namespace

QuantileClip::QuantileClip(double initial, double target, double learning_rate,
                           double count_noise_multiplier)
    : initial_(initial),
      clip_(initial),
      target_(target),
      learning_rate_(learning_rate),
      count_noise_multiplier_(count_noise_multiplier) {
  if (!(std::isfinite(initial) && initial > 0)) {
    throw ConfigError("adaptive clipping: the initial clip must be finite and > 0");
  }
  if (!(target > 0 && target < 1)) {
    throw ConfigError("adaptive clipping: the target quantile must be in (0, 1)");
  }
  if (!(std::isfinite(learning_rate) && learning_rate > 0)) {
    throw ConfigError("adaptive clipping: the learning rate must be finite and > 0");
  }
  const double sigma = count_noise_multiplier * kUnits;
  if (!(std::isfinite(sigma) && sigma >= 1 &&
        sigma <= static_cast<double>(DiscreteGaussian::kMaxSigma))) {
    throw ConfigError("adaptive clipping: the clipped count's noise multiplier " +
                      std::to_string(count_noise_multiplier) +
                      " is outside what the sampler draws");
  }
}

void QuantileClip::restore(double clip) {
  if (!(std::isfinite(clip) && clip > 0)) {
    throw ConfigError("adaptive clipping: a resumed clip must be finite and > 0");
  }
  clip_ = std::clamp(clip, initial_ / kRange, initial_ * kRange);
}

QuantileClip::Step QuantileClip::step(uint64_t unclipped, uint64_t members, RandomSource& rng) {
  if (members == 0 || unclipped > members) {
    throw Error("adaptive clipping: " + std::to_string(unclipped) + " unclipped of " +
                std::to_string(members) + " sites");
  }
  const double sigma = count_noise_multiplier_ * kUnits;
  const DiscreteGaussian noise(static_cast<uint64_t>(std::ceil(sigma * sigma)));
  const double noised =
      (static_cast<double>(unclipped) * kUnits + static_cast<double>(noise.sample(rng))) / kUnits;
  Step s;
  s.noised_share = noised / static_cast<double>(members);
  clip_ = std::clamp(clip_ * std::exp(-learning_rate_ * (s.noised_share - target_)),
                     initial_ / kRange, initial_ * kRange);
  s.next_clip = clip_;
  return s;
}

}  // namespace fedwan::privacy
