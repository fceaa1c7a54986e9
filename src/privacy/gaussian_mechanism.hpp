// The Gaussian mechanism on a model's update (docs/security.md,
// "Differential privacy"): each contribution clipped to an L2 bound, then
// discrete Gaussian noise put on their sum on a fine lattice.
//
// The lattice: the sum is rounded to a step gamma, integer noise added, and
// the result scaled back; everything after the integer noise is post-
// processing. Rounding moves a coordinate by at most half a step, so two
// neighbouring sums' lattice points differ by at most sensitivity/gamma +
// sqrt(d) in L2: the noise is calibrated to that charged sensitivity, so
// its multiplier is the one asked and the accountant composes exactly that.
// The step is chosen for a charge of at most 0.1% (at least kSteps lattice
// points per sensitivity/sqrt(d), more for a small multiplier so the noise
// spans many points) unless the lattice's sigma would pass
// DiscreteGaussian::kMaxSigma; then coarser (and a little more noise).
#pragma once

#include <cstddef>
#include <cstdint>

#include "privacy/random_source.hpp"

namespace fedwan::privacy {

struct LatticeNoise {
  double step = 0;         // gamma: real units per lattice unit
  uint64_t sigma2 = 0;     // the lattice noise's variance (rounded up)
  double noise_std = 0;    // gamma x sqrt(sigma2): never below z x `sensitivity`
  double sensitivity = 0;  // charged: the asked sensitivity + gamma x sqrt(d)
  // noise_std / sensitivity: never below the multiplier asked.
  double effective_multiplier() const { return noise_std / sensitivity; }
};

inline constexpr double kSteps = 1000;
// The lattice noise spans at least this many points (a small multiplier
// gets a finer lattice), and a sensitivity/sqrt(d) at most kMaxPoints /
// sqrt(d) of them, so a clipped sum of up to a million sites' updates stays
// far inside int64.
inline constexpr double kMinSigma = 1024;
inline constexpr double kMaxPoints = 1e12;

// The lattice for noise multiplier z on a sum of `dims` coordinates with L2
// sensitivity `sensitivity`. Throws ConfigError for z or sensitivity not
// finite and > 0, dims 0, or a model too large for a lattice of at least one
// step per sensitivity/sqrt(d).
LatticeNoise plan_lattice_noise(double noise_multiplier, double sensitivity, uint64_t dims);

// Puts the lattice's noise on a weighted mean: mean[i] x weight is the sum;
// it is rounded to the lattice, noised, and divided by `weight` again.
// Throws Error for a sum beyond the lattice's range (never clamps).
void noise_mean(float* mean, size_t n, double weight, const LatticeNoise& plan, RandomSource& rng);

// Scales v so that its L2 norm is at most `bound` (> 0); returns the scale
// (1: within). The norm is summed in double.
double clip_l2(float* v, size_t n, double bound);

// A whole update's bound shared out over one chunk of `chunk` of `total`
// elements: bound x sqrt(chunk / total). Chunks clipped so have a whole norm
// within the bound.
double chunk_share(double bound, uint64_t chunk, uint64_t total);

}  // namespace fedwan::privacy
