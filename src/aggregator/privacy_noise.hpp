// Differential privacy at the aggregators (docs/security.md, "Differential
// privacy"): the root's noise on each chunk's weighted sum in central mode,
// and what any aggregator reports of the privacy spent.
#pragma once

#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fedwan/topology.hpp"
#include "node/node_config.hpp"
#include "privacy/gaussian_mechanism.hpp"
#include "privacy/random_source.hpp"

namespace fedwan::aggregator {

// The largest weight of a site in the topology: a weighted sum's
// sensitivity to one site is that weight x the clip.
double max_site_weight(const Topology& t);

// Central mode's noise on a chunk's weighted mean: discrete Gaussian with
// standard deviation z x clip x the largest site weight on the weighted
// sum, from OpenSSL's generator (z: the update's share of the round's
// multiplier, all of it with a fixed clip).
class CentralNoise {
 public:
  CentralNoise(const node::NodeConfig::Privacy& p, uint64_t model_elements);
  // `clip`: the round's (adaptive clipping moves it between rounds).
  void apply(float* mean, size_t n, double weight, double max_weight, double clip);
  // The noise's standard deviation on a sum, for the audit.
  double sum_std() const { return plan_.noise_std; }

 private:
  node::NodeConfig::Privacy p_;
  uint64_t elements_;
  double max_weight_ = 0;   // the largest site weight seen (never down within a run)
  double planned_for_ = 0;  // the sensitivity (clip x max_weight_) the lattice was planned for
  privacy::LatticeNoise plan_;
  privacy::CryptoRandom rng_;
};

// The privacy settings and what `rounds` noised rounds spent, with the
// clip now in force: the status's and the audit's "privacy" object (null
// when privacy is off).
nlohmann::json privacy_spent(const node::NodeConfig& cfg, uint64_t rounds, double clip);

}  // namespace fedwan::aggregator
