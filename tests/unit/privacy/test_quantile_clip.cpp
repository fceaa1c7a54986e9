// Adaptive clipping's update (privacy/quantile_clip.hpp): the clip moves
// geometrically toward the target quantile from a noised count, stays in
// its range, resumes where it was, and the count's noise has its scale.
#include <gtest/gtest.h>

#include <cmath>

#include "fedwan/error.hpp"
#include "privacy/quantile_clip.hpp"
#include "privacy/random_source.hpp"

namespace fedwan::privacy {
namespace {

TEST(QuantileClip, MovesTowardTheTargetQuantile) {
  SeededRandom rng(5);
  // A count noise of a thousandth of a site: the step is all but exact.
  QuantileClip q(2.0, 0.5, 0.2, 0.001);
  QuantileClip::Step s = q.step(8, 8, rng);  // nobody clipped: the clip shrinks
  EXPECT_NEAR(s.noised_share, 1.0, 1e-3);
  EXPECT_NEAR(s.next_clip, 2.0 * std::exp(-0.2 * 0.5), 1e-3);
  EXPECT_EQ(q.clip(), s.next_clip);
  s = q.step(0, 8, rng);  // everybody clipped: it grows back
  EXPECT_NEAR(s.next_clip, 2.0, 1e-3);
  s = q.step(4, 8, rng);  // at the quantile: it stays
  EXPECT_NEAR(s.next_clip, 2.0, 1e-3);
}

TEST(QuantileClip, StaysInItsRangeAndResumes) {
  SeededRandom rng(6);
  QuantileClip q(1.0, 0.5, 10, 0.001);
  for (int i = 0; i < 100; ++i) q.step(10, 10, rng);
  EXPECT_DOUBLE_EQ(q.clip(), 1.0 / QuantileClip::kRange);
  for (int i = 0; i < 100; ++i) q.step(0, 10, rng);
  EXPECT_DOUBLE_EQ(q.clip(), QuantileClip::kRange);
  q.restore(0.25);
  EXPECT_EQ(q.clip(), 0.25);
  q.restore(1e300);
  EXPECT_EQ(q.clip(), QuantileClip::kRange);
  EXPECT_THROW(q.restore(std::nan("")), ConfigError);
  EXPECT_THROW(q.step(3, 2, rng), Error);
  EXPECT_THROW(q.step(0, 0, rng), Error);
}

TEST(QuantileClip, RefusesSettingsItCannotFollow) {
  EXPECT_THROW(QuantileClip(0, 0.5, 0.2, 1), ConfigError);
  EXPECT_THROW(QuantileClip(1, 1, 0.2, 1), ConfigError);
  EXPECT_THROW(QuantileClip(1, 0.5, 0, 1), ConfigError);
  EXPECT_THROW(QuantileClip(1, 0.5, 0.2, 0), ConfigError);
  EXPECT_THROW(QuantileClip(1, 0.5, 0.2, 1e9), ConfigError);
}

TEST(QuantileClip, TheCountsNoiseHasItsScale) {
  SeededRandom rng(7);
  const double z = 2.0;
  QuantileClip q(1.0, 0.5, 1e-9, z);  // a learning rate too small to move it
  const int n = 20000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    const double noise = q.step(3, 10, rng).noised_share * 10 - 3;  // in sites
    sum += noise;
    sq += noise * noise;
  }
  const double mean = sum / n;
  const double sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0, 0.05);
  EXPECT_NEAR(sd, z, 0.05 * z);
}

}  // namespace
}  // namespace fedwan::privacy
