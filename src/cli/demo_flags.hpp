// The flags of `fedwan demo`, registered on its subcommand.
#pragma once

#include <string>

#include "cli/commands.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::cli {

// --aggregation: KEY=VALUE pairs, comma separated, over `base` (default:
// the defaults of federation.aggregation; keys as the topology names them:
// rule, params.NAME, finite_check, max_abs, replay_window, norm_bound.mode,
// norm_bound.factor, norm_bound.window, norm_bound.bound,
// norm_bound.action; a new rule drops the base's params). Throws
// ConfigError naming `flag` and the bad key or value; the result passes
// the topology's own checks. Also --root-aggregation and
// --region-aggregation, over the --aggregation result.
AggregationSpec aggregation_settings(const std::string& text, const AggregationSpec& base = {},
                                     const char* flag = "--aggregation");
// --privacy: KEY=VALUE pairs over the defaults of federation.privacy (mode,
// clip, noise_multiplier, target_epsilon, delta, epsilon_budget); checked
// as the topology checks them, but for the tree's own rules.
PrivacySpec privacy_settings(const std::string& text);

// Every flag of the demo, the workload's included, each bound to its field
// of `a` (which must outlive `cmd`'s parsing and callback).
void add_demo_flags(CLI::App& cmd, DemoArgs& a);

}  // namespace fedwan::cli
