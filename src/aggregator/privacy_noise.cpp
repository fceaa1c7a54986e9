#include "aggregator/privacy_noise.hpp"

#include <algorithm>

#include "fedwan/privacy.hpp"

namespace fedwan::aggregator {

double max_site_weight(const Topology& t) {
  double w = 0;
  for (const NodeSpec& s : t.nodes()) {
    if (s.role == Role::kSite && !s.removed) w = std::max(w, s.weight);
  }
  return w;
}

CentralNoise::CentralNoise(const node::NodeConfig::Privacy& p, uint64_t model_elements)
    : p_(p), elements_(model_elements) {}

void CentralNoise::apply(float* mean, size_t n, double weight, double max_weight, double clip) {
  // A site that joins with a larger weight raises the sensitivity: the
  // lattice follows it (the weight never down within a run), and the clip.
  max_weight_ = std::max(max_weight_, max_weight);
  const double sensitivity = clip * max_weight_;
  if (sensitivity != planned_for_) {
    plan_ = privacy::plan_lattice_noise(p_.update_noise_multiplier, sensitivity, elements_);
    planned_for_ = sensitivity;
  }
  privacy::noise_mean(mean, n, weight, plan_, rng_);
}

nlohmann::json privacy_spent(const node::NodeConfig& cfg, uint64_t rounds, double clip) {
  const node::NodeConfig::Privacy& p = cfg.privacy;
  if (!p.on()) return nullptr;
  const uint64_t noised = std::min(rounds, cfg.rounds);
  nlohmann::json j = {
      {"mode", p.mode == node::NodeConfig::Privacy::Mode::kCentral ? "central" : "local"},
      {"noise_multiplier", p.noise_multiplier},
      {"clip", clip},
      {"delta", p.delta},
      {"rounds", noised},
      {"epsilon", gaussian_epsilon(p.noise_multiplier, noised, p.delta)},
      {"epsilon_round", gaussian_epsilon(p.noise_multiplier, 1, p.delta)},
      {"epsilon_at_end", gaussian_epsilon(p.noise_multiplier, cfg.rounds, p.delta)},
      {"rounds_run", cfg.rounds},
      {"rounds_asked", p.topology_rounds}};
  if (p.epsilon_budget > 0) j["epsilon_budget"] = p.epsilon_budget;
  if (p.target_quantile > 0) {
    j["adaptive_clip"] = {{"initial_clip", p.clip},
                          {"target_quantile", p.target_quantile},
                          {"learning_rate", p.clip_learning_rate},
                          {"update_noise_multiplier", p.update_noise_multiplier},
                          {"count_noise_multiplier", p.count_noise_multiplier}};
  }
  return j;
}

}  // namespace fedwan::aggregator
