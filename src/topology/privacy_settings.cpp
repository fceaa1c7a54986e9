#include "topology/privacy_settings.hpp"

#include <algorithm>
#include <cmath>

#include "fedwan/error.hpp"
#include "fedwan/privacy.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan::topology {
namespace {

std::string number(double d) { return topology_detail::format_double(d); }

bool positive_finite(double d) { return std::isfinite(d) && d > 0; }

std::optional<std::string> mode_problem(const FederationSpec& f, bool regions) {
  const PrivacySpec& p = f.privacy;
  if (p.mode == "central") {
    if (f.aggregation.rule != "weighted_mean") {
      return "central mode needs the weighted_mean rule: the rule '" + f.aggregation.rule +
             "' changes the sum's sensitivity the noise is calibrated to";
    }
    if (regions && f.codec != "fp32") {
      return "central mode over regions needs codec fp32: a region re-encodes its sum of "
             "clipped updates, and a lossy codec there changes the sensitivity the root's "
             "noise is calibrated to (use local mode, or no regions, to compress)";
    }
  }
  return std::nullopt;
}

// Adaptive clipping's settings (docs/security.md, "Adaptive clipping").
std::optional<std::string> adaptive_problem(const PrivacySpec& p) {
  if (!(std::isfinite(p.clip_learning_rate) && p.clip_learning_rate > 0 &&
        p.clip_learning_rate <= 10)) {
    return "clip_learning_rate " + number(p.clip_learning_rate) + " must be in (0, 10]";
  }
  if (!(p.clip_count_budget > 0 && p.clip_count_budget < 1)) {
    return "clip_count_budget " + number(p.clip_count_budget) +
           " must be in (0, 1): the share of each round's privacy the clipped count spends";
  }
  if (p.target_quantile == 0) return std::nullopt;
  if (!(p.target_quantile > 0 && p.target_quantile < 1)) {
    return "target_quantile " + number(p.target_quantile) + " must be in (0, 1) (0: a fixed clip)";
  }
  if (p.mode != "central") {
    return "target_quantile (adaptive clipping) needs central mode: in local mode every site "
           "would noise its own clipped-or-not bit, and the share's noise (z / sqrt(clip_count_"
           "budget x sites): 1.6 at 16 sites for epsilon 8 over 10 rounds) would drown the "
           "count; choose the clip on public or earlier data";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> privacy_problem(const FederationSpec& f, bool regions) {
  const PrivacySpec& p = f.privacy;
  if (p.mode == "off") return std::nullopt;
  if (p.mode != "central" && p.mode != "local") {
    return "mode '" + p.mode + "': use off, central or local";
  }
  if (!positive_finite(p.clip)) return "clip " + number(p.clip) + " must be finite and > 0";
  if (!(p.delta > 0 && p.delta < 1)) return "delta " + number(p.delta) + " must be in (0, 1)";
  const bool z = p.noise_multiplier != 0;
  const bool target = p.target_epsilon != 0;
  if (z == target) return "give exactly one of noise_multiplier and target_epsilon";
  if (z && !positive_finite(p.noise_multiplier)) {
    return "noise_multiplier " + number(p.noise_multiplier) + " must be finite and > 0";
  }
  if (target && !positive_finite(p.target_epsilon)) {
    return "target_epsilon " + number(p.target_epsilon) + " must be finite and > 0";
  }
  if (!(std::isfinite(p.epsilon_budget) && p.epsilon_budget >= 0)) {
    return "epsilon_budget " + number(p.epsilon_budget) + " must be finite and >= 0 (0: none)";
  }
  if (auto why = mode_problem(f, regions)) return why;
  if (auto why = adaptive_problem(p)) return why;
  double zv = 0;
  try {
    zv = privacy_noise_multiplier(f);
  } catch (const ConfigError& e) {
    return e.what();
  }
  if (p.epsilon_budget > 0 && rounds_within(p.epsilon_budget, p.delta, zv) == 0) {
    return "epsilon_budget " + number(p.epsilon_budget) + " does not cover one round: one round " +
           "with noise multiplier " + number(zv) + " spends epsilon " +
           number(gaussian_epsilon(zv, 1, p.delta));
  }
  return std::nullopt;
}

double update_noise_multiplier(const FederationSpec& f) {
  const double z = privacy_noise_multiplier(f);
  if (f.privacy.target_quantile == 0) return z;
  return z / std::sqrt(1 - f.privacy.clip_count_budget);
}

double count_noise_multiplier(const FederationSpec& f) {
  if (f.privacy.target_quantile == 0) return 0;
  return privacy_noise_multiplier(f) / std::sqrt(f.privacy.clip_count_budget);
}

double privacy_noise_multiplier(const FederationSpec& f) {
  const PrivacySpec& p = f.privacy;
  if (p.mode == "off") return 0;
  if (p.noise_multiplier > 0) return p.noise_multiplier;
  return noise_multiplier_for(p.target_epsilon, p.delta, std::max<uint64_t>(f.rounds, 1));
}

uint64_t rounds_run(const FederationSpec& f) {
  const PrivacySpec& p = f.privacy;
  if (p.mode == "off" || p.epsilon_budget <= 0) return f.rounds;
  return std::min(f.rounds, rounds_within(p.epsilon_budget, p.delta, privacy_noise_multiplier(f)));
}

}  // namespace fedwan::topology
