// Local differential privacy at a site (docs/security.md, "Differential
// privacy"): before its update is encoded, the site clips the whole delta
// to `clip` (L2) and puts discrete Gaussian noise of z x 2 clip on it (one
// site's data replaced changes a clipped delta by at most 2 clip). Error
// feedback and the codec come after: they only see the noised delta, so
// they are post-processing and cost no privacy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "node/node_config.hpp"
#include "privacy/gaussian_mechanism.hpp"
#include "privacy/random_source.hpp"

namespace fedwan::site {

class LocalPrivacy {
 public:
  LocalPrivacy(const node::NodeConfig::Privacy& p, uint64_t model_elements);
  // Starts one release: the scale that brings the delta `anchor - work`
  // (`n` values) within the clip.
  void begin(const float* anchor, const float* work, size_t n);
  // Clips and noises one chunk of the delta in place.
  void apply(float* delta, size_t n);
  double norm() const { return norm_; }    // the delta's L2 norm as trained
  double scale() const { return scale_; }  // what it was multiplied by (<= 1)
  double noise_std() const { return plan_.noise_std; }

 private:
  double clip_;
  privacy::LatticeNoise plan_;
  privacy::CryptoRandom rng_;
  double norm_ = 0;
  double scale_ = 1;
};

}  // namespace fedwan::site
