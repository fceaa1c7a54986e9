#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fedwan/error.hpp"
#include "fedwan/privacy.hpp"

namespace fedwan {
namespace {

// Epsilons printed by Google's dp-accounting 0.6.0 for the same mechanism:
//   acc = rdp.RdpAccountant(); acc.compose(GaussianDpEvent(z), rounds);
//   acc.get_epsilon(delta)
// (bindings/python/tests/test_privacy.py runs both where dp-accounting is
// installed.)
struct Reference {
  double z;
  uint64_t rounds;
  double delta;
  double epsilon;
};
constexpr Reference kReferences[] = {
    {1.0, 1, 1e-5, 4.728507067217623},    {1.0, 10, 1e-5, 19.05359753163139},
    {0.5, 100, 1e-5, 294.8612600716533},  {2.0, 50, 1e-6, 23.70389051398901},
    {5.0, 1000, 1e-5, 48.80169282486775}, {0.8, 3, 1e-3, 9.328394580439985},
    {10.0, 1, 1e-5, 0.3752912223662765},  {1.1, 200, 1e-5, 142.39084944122013},
};

TEST(PrivacyAccountant, AgreesWithDpAccounting) {
  for (const Reference& r : kReferences) {
    const double eps = gaussian_epsilon(r.z, r.rounds, r.delta);
    EXPECT_NEAR(eps, r.epsilon, 1e-9 * r.epsilon) << "z " << r.z << " rounds " << r.rounds;
  }
}

TEST(PrivacyAccountant, ComposesRoundByRoundAsAtOnce) {
  PrivacyAccountant one_by_one;
  for (int i = 0; i < 10; ++i) one_by_one.compose_gaussian(1.0);
  EXPECT_EQ(one_by_one.rounds(), 10u);
  EXPECT_NEAR(one_by_one.loss(1e-5).epsilon, 19.05359753163139, 1e-9);
  // Mixed multipliers add their Renyi divergences.
  PrivacyAccountant mixed;
  mixed.compose_gaussian(1.0, 5);
  mixed.compose_gaussian(2.0, 5);
  const double e = mixed.loss(1e-5).epsilon;
  EXPECT_GT(e, gaussian_epsilon(2.0, 10, 1e-5));
  EXPECT_LT(e, gaussian_epsilon(1.0, 10, 1e-5));
}

TEST(PrivacyAccountant, NothingSpentBeforeTheFirstRound) {
  PrivacyAccountant a;
  EXPECT_EQ(a.loss(1e-5).epsilon, 0.0);
  EXPECT_EQ(gaussian_epsilon(1.0, 0, 1e-5), 0.0);
}

TEST(PrivacyAccountant, RefusesWhatIsNotAMechanism) {
  PrivacyAccountant a;
  EXPECT_THROW(a.compose_gaussian(0), ConfigError);
  EXPECT_THROW(a.compose_gaussian(-1), ConfigError);
  EXPECT_THROW(a.compose_gaussian(std::numeric_limits<double>::quiet_NaN()), ConfigError);
  EXPECT_THROW(a.compose_gaussian(std::numeric_limits<double>::infinity()), ConfigError);
  EXPECT_THROW(a.loss(0), ConfigError);
  EXPECT_THROW(a.loss(1), ConfigError);
  EXPECT_THROW(PrivacyAccountant({1.0, 2.0}), ConfigError);
}

TEST(PrivacyAccountant, NoiseMultiplierForATargetIsTheSmallestThatMeetsIt) {
  for (double target : {1.0, 3.0, 8.0}) {
    for (uint64_t rounds : {1u, 10u, 40u}) {
      const double z = noise_multiplier_for(target, 1e-5, rounds);
      EXPECT_LE(gaussian_epsilon(z, rounds, 1e-5), target);
      EXPECT_GT(gaussian_epsilon(z * (1 - 1e-5), rounds, 1e-5), target);
    }
  }
  EXPECT_THROW(noise_multiplier_for(0, 1e-5, 10), ConfigError);
  EXPECT_THROW(noise_multiplier_for(1, 1e-5, 0), ConfigError);
  EXPECT_THROW(noise_multiplier_for(1, 2, 10), ConfigError);
}

TEST(PrivacyAccountant, RoundsWithinABudgetStopBeforeIt) {
  const double z = 1.0;
  const uint64_t n = rounds_within(19.06, 1e-5, z);
  EXPECT_EQ(n, 10u);  // 10 rounds: 19.0536; 11 rounds: more
  EXPECT_LE(gaussian_epsilon(z, n, 1e-5), 19.06);
  EXPECT_GT(gaussian_epsilon(z, n + 1, 1e-5), 19.06);
  EXPECT_EQ(rounds_within(1.0, 1e-5, 1.0), 0u);  // one round already costs 4.7
  const uint64_t many = rounds_within(8.0, 1e-5, 5.0);
  EXPECT_LE(gaussian_epsilon(5.0, many, 1e-5), 8.0);
  EXPECT_GT(gaussian_epsilon(5.0, many + 1, 1e-5), 8.0);
}

}  // namespace
}  // namespace fedwan
