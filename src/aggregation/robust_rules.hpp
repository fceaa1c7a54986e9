// The library's robust aggregation rules, registered by name with the
// registry of aggregation_rule.hpp (robust_rules.cpp says what each does).
// Each is buffered: fan-in x chunk_bytes per chunk in flight.
#pragma once

#include <memory>

#include "aggregation/aggregation_rule.hpp"

namespace fedwan::aggregation {

inline constexpr const char* kMedian = "median";
inline constexpr const char* kTrimmedMean = "trimmed_mean";
inline constexpr const char* kMultiKrum = "multi_krum";

// Each throws ConfigError for a parameter the rule does not take or out of
// its range.
std::shared_ptr<const AggregationRule> make_median_rule(const RuleParams& params);
// trim: values dropped at each end per coordinate, 1..1000 (default 1).
std::shared_ptr<const AggregationRule> make_trimmed_mean_rule(const RuleParams& params);
// byzantine: dishonest children assumed, 0..1000 (default 1); select: copies
// kept, 0..10000 (default 0: the copies less `byzantine`).
std::shared_ptr<const AggregationRule> make_multi_krum_rule(const RuleParams& params);

}  // namespace fedwan::aggregation
