// Differential privacy's arithmetic (docs/security.md, "Differential
// privacy"): what a federation's Gaussian noise costs in (epsilon, delta).
//
// The accountant composes Renyi differential privacy (Mironov, CSF 2017)
// over rounds: a round whose noise has standard deviation z x the L2
// sensitivity (z: the noise multiplier) is (alpha, alpha / (2 z^2))-RDP at
// every order alpha, and rounds add. It converts to (epsilon, delta) with the
// bound of Canonne, Kamath and Steinke (2020, proposition 12 of
// arXiv:2004.00010) at the best of the orders Google's dp-accounting uses
// (RdpAccountant's defaults), so the two agree on the same mechanism.
// Every site takes part in every round here: no subsampling is claimed.
#pragma once

#include <cstdint>
#include <vector>

#include "fedwan/export.hpp"

namespace fedwan {

struct FEDWAN_API PrivacyLoss {
  double epsilon = 0;  // +inf: no finite bound (no noise)
  double delta = 0;
  double order = 0;  // the Renyi order the bound was taken at
};

class FEDWAN_API PrivacyAccountant {
 public:
  // The default orders: dp-accounting's DEFAULT_RDP_ORDERS.
  PrivacyAccountant();
  explicit PrivacyAccountant(std::vector<double> orders);

  // `count` rounds of the Gaussian mechanism with noise multiplier z > 0.
  // Throws ConfigError for z <= 0 or not finite.
  void compose_gaussian(double noise_multiplier, uint64_t count = 1);
  // The tightest epsilon for `delta` (0 < delta < 1) over the orders.
  PrivacyLoss loss(double delta) const;
  uint64_t rounds() const { return rounds_; }
  const std::vector<double>& orders() const { return orders_; }

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
  uint64_t rounds_ = 0;
};

// Epsilon after `rounds` rounds of noise multiplier z, at `delta`.
FEDWAN_API double gaussian_epsilon(double noise_multiplier, uint64_t rounds, double delta);
// The smallest noise multiplier (to 1e-6 relative) whose `rounds` rounds
// stay within `epsilon` at `delta`. Throws ConfigError for bad arguments.
FEDWAN_API double noise_multiplier_for(double epsilon, double delta, uint64_t rounds);
// How many rounds of multiplier z stay within `epsilon` at `delta` (0: not
// even one).
FEDWAN_API uint64_t rounds_within(double epsilon, double delta, double noise_multiplier);

}  // namespace fedwan
