#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fedwan/error.hpp"
#include "privacy/gaussian_mechanism.hpp"
#include "privacy/random_source.hpp"

namespace fedwan::privacy {
namespace {

double norm_of(const std::vector<float>& v) {
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  return std::sqrt(sq);
}

TEST(GaussianMechanism, LatticeChargesItsRoundingAndNeverWeakensTheNoise) {
  const LatticeNoise p = plan_lattice_noise(1.5, 2.0, 10000);
  EXPECT_NEAR(p.sensitivity, 2.0 * (1 + 1 / kSteps), 1e-12);
  EXPECT_GE(p.noise_std, 1.5 * p.sensitivity);
  EXPECT_LT(p.noise_std, 1.5 * p.sensitivity * (1 + 1e-6));
  EXPECT_GE(p.effective_multiplier(), 1.5);
  EXPECT_LT(p.effective_multiplier(), 1.5 * (1 + 1e-6));
}

TEST(GaussianMechanism, LargeModelsGetACoarserLatticeAndPayForIt) {
  const LatticeNoise p = plan_lattice_noise(10.0, 1.0, 1'000'000'000);
  EXPECT_LE(std::sqrt(static_cast<double>(p.sigma2)), 1.0001 * (1u << 25));
  EXPECT_GE(p.effective_multiplier(), 10.0);
  // A coarser lattice: a larger charge, paid for in noise.
  EXPECT_GT(p.sensitivity, 1.0 * (1 + 1 / kSteps));
  EXPECT_LT(p.noise_std, 10.0 * 1.02);
  EXPECT_THROW(plan_lattice_noise(1e6, 1.0, 1'000'000'000), ConfigError);
  EXPECT_THROW(plan_lattice_noise(0, 1.0, 10), ConfigError);
  EXPECT_THROW(plan_lattice_noise(1, 0, 10), ConfigError);
  EXPECT_THROW(plan_lattice_noise(1, 1, 0), ConfigError);
  EXPECT_THROW(plan_lattice_noise(NAN, 1, 10), ConfigError);
}

TEST(GaussianMechanism, NoiseOnAMeanHasTheSumsStdOverTheWeight) {
  SeededRandom rng(7);
  const size_t n = 100000;
  const double weight = 4;
  const LatticeNoise p = plan_lattice_noise(1.0, 0.5, n);
  std::vector<float> mean(n);
  for (size_t i = 0; i < n; ++i)
    mean[i] = static_cast<float>(std::sin(static_cast<double>(i)) * 1e-3);
  std::vector<float> noisy = mean;
  noise_mean(noisy.data(), n, weight, p, rng);
  double sum = 0;
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(noisy[i]) - mean[i];
    sum += d;
    sq += d * d;
    // Every released sum is a lattice point.
    const double points = static_cast<double>(noisy[i]) * weight / p.step;
    EXPECT_NEAR(points, std::nearbyint(points), 1e-3 * std::abs(points) + 1e-6);
  }
  const double want = p.noise_std / weight;
  EXPECT_NEAR(std::sqrt(sq / n) / want, 1.0, 0.02);
  EXPECT_NEAR(sum / n, 0, 5 * want / std::sqrt(static_cast<double>(n)));
  EXPECT_THROW(noise_mean(noisy.data(), n, 0, p, rng), Error);
}

TEST(GaussianMechanism, ClipBoundsTheNormAndLeavesSmallUpdatesAlone) {
  std::vector<float> v = {3, 4};
  EXPECT_DOUBLE_EQ(clip_l2(v.data(), v.size(), 10), 1.0);
  EXPECT_EQ(v, (std::vector<float>{3, 4}));
  const double s = clip_l2(v.data(), v.size(), 1);
  EXPECT_NEAR(s, 0.2, 1e-6);
  EXPECT_LE(norm_of(v), 1.0);
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(1.0 + i % 7);
  clip_l2(big.data(), big.size(), 0.3);
  EXPECT_LE(norm_of(big), 0.3);
  EXPECT_GT(norm_of(big), 0.3 * (1 - 1e-5));
}

TEST(GaussianMechanism, ChunkSharesAddUpToTheWholeBound) {
  const uint64_t total = 1000;
  double sq = 0;
  for (uint64_t chunk : {300u, 300u, 400u}) {
    const double b = chunk_share(2.0, chunk, total);
    sq += b * b;
  }
  EXPECT_NEAR(std::sqrt(sq), 2.0, 1e-12);
  EXPECT_EQ(chunk_share(2.0, 1, 0), 0.0);
}

}  // namespace
}  // namespace fedwan::privacy
