#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "fedwan/error.hpp"
#include "privacy/discrete_gaussian.hpp"
#include "privacy/random_source.hpp"

namespace fedwan::privacy {
namespace {

// Within `sigmas` binomial standard deviations of p over n trials.
void expect_rate(uint64_t hits, uint64_t n, double p, double sigmas = 5) {
  const double sd = std::sqrt(p * (1 - p) / static_cast<double>(n));
  EXPECT_NEAR(static_cast<double>(hits) / static_cast<double>(n), p, sigmas * sd + 1e-12);
}

TEST(RandomSource, BelowIsUniformAndInRange) {
  SeededRandom rng(1);
  std::vector<uint64_t> counts(7, 0);
  const uint64_t n = 70000;
  for (uint64_t i = 0; i < n; ++i) counts.at(rng.below(uint64_t{7}))++;
  for (uint64_t c : counts) expect_rate(c, n, 1.0 / 7);
  EXPECT_EQ(rng.below(uint64_t{1}), 0u);
  const u128 big = (static_cast<u128>(1) << 100) + 3;
  for (int i = 0; i < 1000; ++i) EXPECT_LT(rng.below(big), big);
}

TEST(RandomSource, CryptoRandomDrawsDiffer) {
  CryptoRandom rng;
  uint8_t a[32] = {};
  uint8_t b[32] = {};
  rng.fill(a, sizeof a);
  rng.fill(b, sizeof b);
  EXPECT_NE(std::vector<uint8_t>(a, a + 32), std::vector<uint8_t>(b, b + 32));
  // Across the buffer's refill.
  std::vector<uint8_t> big(10000);
  rng.fill(big.data(), big.size());
  uint64_t ones = 0;
  for (uint8_t v : big) ones += static_cast<uint64_t>(__builtin_popcount(v));
  expect_rate(ones, 8 * big.size(), 0.5);
}

TEST(DiscreteGaussian, BernoulliExpHasTheRightRate) {
  SeededRandom rng(2);
  const uint64_t n = 100000;
  struct Case {
    uint64_t num, den;
  };
  for (Case c : {Case{1, 2}, Case{1, 1}, Case{23, 10}, Case{0, 5}, Case{7, 3}}) {
    uint64_t hits = 0;
    for (uint64_t i = 0; i < n; ++i) hits += bernoulli_exp(rng, c.num, c.den) ? 1 : 0;
    expect_rate(hits, n, std::exp(-static_cast<double>(c.num) / static_cast<double>(c.den)));
  }
  EXPECT_THROW(bernoulli_exp(rng, 1, 0), Error);
}

TEST(DiscreteGaussian, DiscreteLaplaceHasItsMassAtZero) {
  SeededRandom rng(3);
  const uint64_t t = 3;
  const uint64_t n = 100000;
  uint64_t zeros = 0;
  double sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t x = discrete_laplace(rng, t);
    zeros += x == 0 ? 1 : 0;
    sum += static_cast<double>(x);
  }
  const double q = std::exp(-1.0 / static_cast<double>(t));
  expect_rate(zeros, n, (1 - q) / (1 + q));
  EXPECT_NEAR(sum / n, 0, 0.05);
}

TEST(DiscreteGaussian, SmallVarianceMatchesTheExactMass) {
  SeededRandom rng(4);
  for (uint64_t s2 : {1u, 2u, 10u}) {
    const DiscreteGaussian g(s2);
    double norm = 0;
    std::map<int64_t, double> pmf;
    for (int64_t x = -60; x <= 60; ++x) {
      pmf[x] = std::exp(-static_cast<double>(x * x) / (2.0 * static_cast<double>(s2)));
      norm += pmf[x];
    }
    const uint64_t n = 200000;
    std::map<int64_t, uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen[g.sample(rng)]++;
    for (int64_t x = -3; x <= 3; ++x) expect_rate(seen[x], n, pmf[x] / norm);
  }
}

TEST(DiscreteGaussian, LargeVarianceHasItsVarianceAndNoBias) {
  SeededRandom rng(5);
  const uint64_t s2 = 1000000;  // sigma 1000
  const DiscreteGaussian g(s2);
  const uint64_t n = 100000;
  double sum = 0;
  double sq = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(g.sample(rng));
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0, 5 * 1000 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(sq / n / static_cast<double>(s2), 1.0, 0.02);
}

TEST(DiscreteGaussian, LargestSigmaStaysInRange) {
  SeededRandom rng(6);
  const uint64_t max = DiscreteGaussian::kMaxSigma;
  const DiscreteGaussian g(max * max);
  for (int i = 0; i < 2000; ++i) {
    const int64_t x = g.sample(rng);
    EXPECT_LT(std::abs(static_cast<double>(x)), 8.0 * static_cast<double>(max));
  }
  EXPECT_THROW(DiscreteGaussian(0), ConfigError);
  EXPECT_THROW(DiscreteGaussian(max * max + 1), ConfigError);
}

}  // namespace
}  // namespace fedwan::privacy
