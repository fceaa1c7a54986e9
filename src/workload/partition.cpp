#include "workload/partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

#include "fedwan/error.hpp"

namespace fedwan::workload {
namespace {

// Uniform integer in [0, bound) without modulo bias. Written out rather than
// using std::uniform_int_distribution, whose algorithm is unspecified.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Fisher-Yates with uniform_below, identical on every standard library
// (std::shuffle's sequence of draws is unspecified).
void shuffle(std::vector<uint32_t>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(uniform_below(rng, i));
    std::swap(v[i - 1], v[j]);
  }
}

void check_arguments(size_t num_labels, size_t num_classes, size_t num_sites, double alpha,
                     size_t min_per_site) {
  if (!std::isfinite(alpha) || !(alpha > 0.0)) {
    throw ConfigError("dirichlet_partition: alpha must be finite and > 0, got " +
                      std::to_string(alpha));
  }
  if (num_sites == 0) throw ConfigError("dirichlet_partition: num_sites must be >= 1");
  if (num_classes == 0) throw ConfigError("dirichlet_partition: num_classes must be >= 1");
  if (num_labels > std::numeric_limits<uint32_t>::max()) {
    throw ConfigError("dirichlet_partition: at most 2^32-1 samples are supported, got " +
                      std::to_string(num_labels));
  }
  if (min_per_site > num_labels / num_sites) {
    throw ConfigError("dirichlet_partition: " + std::to_string(num_labels) +
                      " samples cannot give " + std::to_string(num_sites) + " sites at least " +
                      std::to_string(min_per_site) +
                      " each; lower min_per_site or the number of sites");
  }
}

// The sample indices of each class, ascending.
template <typename Label>
std::vector<std::vector<uint32_t>> indices_by_class(const std::vector<Label>& labels,
                                                    size_t num_classes) {
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (size_t i = 0; i < labels.size(); ++i) {
    const Label label = labels[i];
    bool negative = false;
    if constexpr (std::is_signed_v<Label>) negative = label < 0;
    if (negative || static_cast<uint64_t>(label) >= num_classes) {
      throw ConfigError("dirichlet_partition: label " + std::to_string(label) + " at index " +
                        std::to_string(i) + " is outside [0, " + std::to_string(num_classes) + ")");
    }
    by_class[static_cast<size_t>(label)].push_back(static_cast<uint32_t>(i));
  }
  return by_class;
}

// Deals one class's shuffled members out to the sites in consecutive runs
// proportional to `share` (summing to `total` > 0); the last site takes the
// rounding remainder.
void deal_by_share(const std::vector<uint32_t>& members, const std::vector<double>& share,
                   double total, std::vector<std::vector<uint32_t>>& sites) {
  const size_t num_sites = sites.size();
  const size_t n = members.size();
  size_t begin = 0;
  double cumulative = 0.0;
  for (size_t k = 0; k < num_sites; ++k) {
    size_t end = n;
    if (k + 1 < num_sites) {
      cumulative += share[k] / total;
      end = std::min(n, static_cast<size_t>(std::floor(cumulative * static_cast<double>(n))));
      end = std::max(end, begin);
    }
    sites[k].insert(sites[k].end(), members.begin() + static_cast<std::ptrdiff_t>(begin),
                    members.begin() + static_cast<std::ptrdiff_t>(end));
    begin = end;
  }
}

// Tops every site up to `min_per_site` with random samples of the largest
// site at the time; check_arguments made sure there are enough.
void top_up(std::vector<std::vector<uint32_t>>& sites, size_t min_per_site, std::mt19937_64& rng) {
  const size_t num_sites = sites.size();
  for (size_t short_site = 0; short_site < num_sites; ++short_site) {
    while (sites[short_site].size() < min_per_site) {
      size_t donor = 0;
      for (size_t k = 1; k < num_sites; ++k) {
        if (sites[k].size() > sites[donor].size()) donor = k;
      }
      auto& from = sites[donor];
      const size_t pick = static_cast<size_t>(uniform_below(rng, from.size()));
      std::swap(from[pick], from.back());
      sites[short_site].push_back(from.back());
      from.pop_back();
    }
  }
}

template <typename Label>
std::vector<std::vector<uint32_t>> partition_impl(const std::vector<Label>& labels,
                                                  size_t num_classes, size_t num_sites,
                                                  double alpha, uint64_t seed,
                                                  size_t min_per_site) {
  check_arguments(labels.size(), num_classes, num_sites, alpha, min_per_site);
  std::vector<std::vector<uint32_t>> by_class = indices_by_class(labels, num_classes);

  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gamma(alpha, 1.0);
  std::vector<std::vector<uint32_t>> sites(num_sites);
  std::vector<double> share(num_sites);

  for (auto& members : by_class) {
    double total = 0.0;
    for (double& s : share) {
      s = gamma(rng);
      total += s;
    }
    shuffle(members, rng);
    if (!(total > 0.0)) {
      const size_t k = static_cast<size_t>(uniform_below(rng, num_sites));
      sites[k].insert(sites[k].end(), members.begin(), members.end());
      continue;
    }
    deal_by_share(members, share, total, sites);
  }

  top_up(sites, min_per_site, rng);
  for (auto& s : sites) std::sort(s.begin(), s.end());
  return sites;
}

}  // namespace

std::vector<std::vector<uint32_t>> dirichlet_partition(const std::vector<int64_t>& labels,
                                                       size_t num_classes, size_t num_sites,
                                                       double alpha, uint64_t seed,
                                                       size_t min_per_site) {
  return partition_impl(labels, num_classes, num_sites, alpha, seed, min_per_site);
}

std::vector<std::vector<uint32_t>> dirichlet_partition(const std::vector<uint8_t>& labels,
                                                       size_t num_classes, size_t num_sites,
                                                       double alpha, uint64_t seed,
                                                       size_t min_per_site) {
  return partition_impl(labels, num_classes, num_sites, alpha, seed, min_per_site);
}

}  // namespace fedwan::workload
