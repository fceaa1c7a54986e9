// The checks on a topology's federation.privacy settings and what they come
// to (docs/security.md, "Differential privacy"): the noise multiplier every
// round uses and the rounds the budget allows, the same on every node. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fedwan/topology.hpp"

namespace fedwan::topology {

// Why the settings are not usable, or nullopt. `regions`: whether any
// aggregator stands between sites and the root.
std::optional<std::string> privacy_problem(const FederationSpec& f, bool regions);

// The noise multiplier of every round (z as given, or the smallest whose
// `rounds` rounds spend target_epsilon); 0 when privacy is off.
double privacy_noise_multiplier(const FederationSpec& f);
// With adaptive clipping (target_quantile > 0) each round's privacy is
// shared: 1/z^2 = 1/z_update^2 + 1/z_count^2, the count taking
// clip_count_budget of it. The update's multiplier (z itself with a fixed
// clip) and the clipped count's (its sensitivity is one site; 0 with a
// fixed clip).
double update_noise_multiplier(const FederationSpec& f);
double count_noise_multiplier(const FederationSpec& f);

// The rounds the federation runs: `rounds`, or fewer when the budget ends it
// sooner.
uint64_t rounds_run(const FederationSpec& f);

}  // namespace fedwan::topology
