// The checks on a topology's federation.aggregation settings: what every
// aggregator checks on each child's copy of a chunk (docs/topology.md,
// "Aggregation"). Pure.
#pragma once

#include <optional>
#include <string>

#include "fedwan/topology.hpp"

namespace fedwan::topology {

// Why the settings are not usable, or nullopt (the rule's name is checked
// against the registered rules elsewhere).
std::optional<std::string> aggregation_problem(const AggregationSpec& a);

}  // namespace fedwan::topology
