// Non-IID split of a labelled data set across sites: for every class, the
// share each site receives is drawn from a symmetric Dirichlet(alpha). Small
// alpha gives each site a few dominant classes; large alpha tends to an IID
// split. Pure planning code: no torch, no I/O, thread safe (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fedwan::workload {

// Returns one list of sample indices (into `labels`) per site, each sorted
// ascending. Every index in [0, labels.size()) appears in exactly one list.
//
// Algorithm, for each class c in 0..num_classes-1 in order:
//   1. draw g_k ~ Gamma(alpha, 1) for every site k and set p_k = g_k / sum g;
//      if every draw underflowed to 0 (tiny alpha), one site chosen uniformly
//      takes the whole class;
//   2. shuffle the indices of class c (ascending order first) with the same RNG;
//   3. site k takes the next floor(n_c * (p_0+..+p_k)) - floor(n_c * (p_0+..+p_{k-1}))
//      of them, the last site the remainder.
// Rebalancing so that every site holds at least `min_per_site` samples: while
// some site is short, the site with the lowest id among the short ones takes
// one sample, chosen uniformly with the same RNG, from the site that holds the
// most samples (lowest id on ties). The donor always stays at or above the
// minimum, because a short site exists only while some site is above it.
//
// Deterministic for a given seed and standard library: the RNG is
// std::mt19937_64 (fully specified) and the shuffle and index draws are done
// here, but std::gamma_distribution is implementation-defined, so libstdc++
// and libc++ give different (equally valid) splits for the same seed.
//
// Throws fedwan::ConfigError if alpha is not finite and > 0, num_sites or
// num_classes is 0, a label is >= num_classes, there are more than 2^32
// samples, or labels.size() < num_sites * min_per_site.
std::vector<std::vector<uint32_t>> dirichlet_partition(const std::vector<int64_t>& labels,
                                                       size_t num_classes, size_t num_sites,
                                                       double alpha, uint64_t seed,
                                                       size_t min_per_site = 10);

// Same, for labels stored as bytes (IDX files).
std::vector<std::vector<uint32_t>> dirichlet_partition(const std::vector<uint8_t>& labels,
                                                       size_t num_classes, size_t num_sites,
                                                       double alpha, uint64_t seed,
                                                       size_t min_per_site = 10);

}  // namespace fedwan::workload
