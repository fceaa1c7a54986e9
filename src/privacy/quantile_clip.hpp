// Adaptive clipping: the clip follows a quantile of the sites' update norms
// instead of being fixed (Andrew, Thakkar, McMahan and Ramaswamy,
// "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021).
// After each round the share b of sites whose update was not clipped, from a
// count with discrete Gaussian noise, moves the clip geometrically toward the
// target quantile q: clip x exp(-lr x (b - q)). The count's sensitivity is
// one site; its noise multiplier is the share of the round's privacy it
// spends (topology::count_noise_multiplier). Pure: the caller says who was
// clipped.
#pragma once

#include <cstdint>

#include "privacy/random_source.hpp"

namespace fedwan::privacy {

class QuantileClip {
 public:
  // The clip stays within [initial / kRange, initial x kRange].
  static constexpr double kRange = 1e6;
  // count_noise_multiplier > 0; target in (0, 1); learning_rate > 0.
  // Throws ConfigError otherwise.
  QuantileClip(double initial, double target, double learning_rate, double count_noise_multiplier);

  double clip() const { return clip_; }
  // A resumed node's clip (from its checkpoint), within the range.
  void restore(double clip);

  struct Step {
    double noised_share = 0;  // (unclipped + noise) / members: what the clip followed
    double next_clip = 0;
  };
  // One round: `unclipped` of `members` sites (the topology's, a public
  // count) were not clipped. members > 0, unclipped <= members.
  Step step(uint64_t unclipped, uint64_t members, RandomSource& rng);

 private:
  double initial_;
  double clip_;
  double target_;
  double learning_rate_;
  double count_noise_multiplier_;
};

}  // namespace fedwan::privacy
