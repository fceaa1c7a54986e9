#include "site/local_privacy.hpp"

#include <cmath>

namespace fedwan::site {

LocalPrivacy::LocalPrivacy(const node::NodeConfig::Privacy& p, uint64_t model_elements)
    : clip_(p.clip),
      plan_(privacy::plan_lattice_noise(p.noise_multiplier, 2 * p.clip, model_elements)) {}

void LocalPrivacy::begin(const float* anchor, const float* work, size_t n) {
  double sq = 0;
  for (size_t k = 0; k < n; ++k) {
    const double d = static_cast<double>(anchor[k] - work[k]);
    sq += d * d;
  }
  norm_ = std::sqrt(sq);
  // A non-finite delta is clipped to nothing: the noise alone goes up.
  scale_ = !std::isfinite(norm_) ? 0.0 : norm_ > clip_ ? clip_ / norm_ * (1 - 1e-6) : 1.0;
}

void LocalPrivacy::apply(float* delta, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    const double v = static_cast<double>(delta[k]) * scale_;
    delta[k] = std::isfinite(v) ? static_cast<float>(v) : 0.0f;
  }
  privacy::noise_mean(delta, n, 1.0, plan_, rng_);
}

}  // namespace fedwan::site
