#include "workload/partition.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fedwan/error.hpp"

namespace fedwan::workload {
namespace {

// `per_class` samples of each of `classes` labels, interleaved.
std::vector<int64_t> balanced_labels(size_t classes, size_t per_class) {
  std::vector<int64_t> labels;
  labels.reserve(classes * per_class);
  for (size_t i = 0; i < per_class; ++i) {
    for (size_t c = 0; c < classes; ++c) labels.push_back(static_cast<int64_t>(c));
  }
  return labels;
}

// Mean over sites of the total variation distance between the site's label
// histogram and the uniform one: 0 for an IID split, near 1 when every site
// holds a single class.
double mean_label_skew(const std::vector<std::vector<uint32_t>>& sites,
                       const std::vector<int64_t>& labels, size_t classes) {
  double skew = 0.0;
  for (const auto& site : sites) {
    std::vector<double> hist(classes, 0.0);
    for (uint32_t i : site) hist[static_cast<size_t>(labels[i])] += 1.0;
    double tv = 0.0;
    for (double h : hist) {
      tv += std::abs(h / static_cast<double>(site.size()) - 1.0 / static_cast<double>(classes));
    }
    skew += 0.5 * tv;
  }
  return skew / static_cast<double>(sites.size());
}

TEST(DirichletPartition, EveryIndexExactlyOnce) {
  const auto labels = balanced_labels(10, 500);
  for (double alpha : {0.05, 0.5, 100.0}) {
    const auto sites = dirichlet_partition(labels, 10, 7, alpha, 42);
    ASSERT_EQ(sites.size(), 7u);
    std::vector<int> seen(labels.size(), 0);
    for (const auto& site : sites) {
      for (uint32_t i : site) {
        ASSERT_LT(i, labels.size());
        ++seen[i];
      }
    }
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "index " << i;
  }
}

TEST(DirichletPartition, SitesAreSortedAscending) {
  const auto sites = dirichlet_partition(balanced_labels(10, 100), 10, 4, 0.5, 3);
  for (const auto& site : sites) {
    for (size_t i = 1; i < site.size(); ++i) EXPECT_LT(site[i - 1], site[i]);
  }
}

TEST(DirichletPartition, SameSeedSameSplit) {
  const auto labels = balanced_labels(10, 300);
  EXPECT_EQ(dirichlet_partition(labels, 10, 4, 0.5, 7), dirichlet_partition(labels, 10, 4, 0.5, 7));
}

TEST(DirichletPartition, DifferentSeedsDiffer) {
  const auto labels = balanced_labels(10, 300);
  const auto a = dirichlet_partition(labels, 10, 4, 0.5, 1);
  const auto b = dirichlet_partition(labels, 10, 4, 0.5, 2);
  EXPECT_NE(a, b);
  std::vector<size_t> sizes_a, sizes_b;
  for (const auto& s : a) sizes_a.push_back(s.size());
  for (const auto& s : b) sizes_b.push_back(s.size());
  EXPECT_NE(sizes_a, sizes_b) << "the per-site sample counts should follow the seed too";
}

TEST(DirichletPartition, ByteAndInt64LabelsAgree) {
  const auto labels = balanced_labels(10, 200);
  const std::vector<uint8_t> bytes(labels.begin(), labels.end());
  EXPECT_EQ(dirichlet_partition(labels, 10, 5, 0.3, 11),
            dirichlet_partition(bytes, 10, 5, 0.3, 11));
}

TEST(DirichletPartition, SmallAlphaSkewsLargeAlphaIsNearUniform) {
  const size_t classes = 10;
  const auto labels = balanced_labels(classes, 1000);
  double skew_small = 0.0, skew_large = 0.0;
  const int seeds = 5;
  for (int seed = 0; seed < seeds; ++seed) {
    skew_small +=
        mean_label_skew(dirichlet_partition(labels, classes, 4, 0.1, seed), labels, classes) /
        seeds;
    skew_large +=
        mean_label_skew(dirichlet_partition(labels, classes, 4, 1000.0, seed), labels, classes) /
        seeds;
  }
  // Dirichlet(0.1) over 4 sites gives each class mostly to one site, so a
  // site's histogram is far from uniform; Dirichlet(1000) gives every site
  // about a quarter of every class.
  EXPECT_GT(skew_small, 0.4) << "alpha 0.1 skew " << skew_small;
  EXPECT_LT(skew_large, 0.03) << "alpha 1000 skew " << skew_large;
}

TEST(DirichletPartition, MinPerSiteHonoured) {
  // Tiny alpha over many sites leaves most sites empty before rebalancing.
  const auto labels = balanced_labels(10, 100);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto sites = dirichlet_partition(labels, 10, 20, 0.01, seed, 25);
    size_t total = 0;
    for (const auto& site : sites) {
      EXPECT_GE(site.size(), 25u);
      total += site.size();
    }
    EXPECT_EQ(total, labels.size());
  }
}

TEST(DirichletPartition, MinPerSiteExactlyFeasible) {
  const auto labels = balanced_labels(10, 10);  // 100 samples, 4 sites x 25
  const auto sites = dirichlet_partition(labels, 10, 4, 0.05, 5, 25);
  for (const auto& site : sites) EXPECT_EQ(site.size(), 25u);
}

TEST(DirichletPartition, SingleSiteTakesEverything) {
  const auto labels = balanced_labels(3, 10);
  const auto sites = dirichlet_partition(labels, 3, 1, 0.5, 0);
  ASSERT_EQ(sites.size(), 1u);
  EXPECT_EQ(sites[0].size(), labels.size());
}

TEST(DirichletPartition, InvalidArgumentsThrowConfigError) {
  const auto labels = balanced_labels(10, 10);
  EXPECT_THROW(dirichlet_partition(labels, 10, 4, 0.0, 1), ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 10, 4, -1.0, 1), ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 10, 4, std::nan(""), 1), ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 10, 4, std::numeric_limits<double>::infinity(), 1),
               ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 10, 0, 0.5, 1), ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 0, 4, 0.5, 1), ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 9, 4, 0.5, 1), ConfigError);  // label 9 too large
  EXPECT_THROW(dirichlet_partition(std::vector<int64_t>{0, 1, -1}, 2, 1, 0.5, 1, 0), ConfigError);
  EXPECT_THROW(dirichlet_partition(std::vector<uint8_t>{0, 1, 200}, 10, 1, 0.5, 1, 0), ConfigError);
  EXPECT_THROW(dirichlet_partition(labels, 10, 4, 0.5, 1, 26), ConfigError);  // 100 < 4 x 26
}

TEST(DirichletPartition, EmptyLabelsGiveEmptySites) {
  const auto sites = dirichlet_partition(std::vector<int64_t>{}, 10, 3, 0.5, 1, 0);
  ASSERT_EQ(sites.size(), 3u);
  for (const auto& site : sites) EXPECT_TRUE(site.empty());
}

}  // namespace
}  // namespace fedwan::workload
