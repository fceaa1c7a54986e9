// Topology versions (docs/operations.md, "Topology versions"): what a later
// version of a running federation's topology may change. Pure: no files,
// no signatures (security/topology_signature.hpp checks those).
#pragma once

#include <cstdint>
#include <vector>

#include "fedwan/topology.hpp"

namespace fedwan::topology {

struct VersionChange {
  std::vector<uint32_t> added;    // sites `next` appends (their indices)
  std::vector<uint32_t> removed;  // sites `next` marks removed
};

// What `next` changes in a federation running `current`, or a ConfigError
// saying why it may not replace it: another job; not a later version; a
// history that does not continue current's (so it was not made from it);
// other federation settings or policy; an existing node changed, reordered
// or taken out of the file (its index is its wire id: mark a site
// `removed: true` instead); a removed site back; an added node that is not
// a site, or added already removed. Aggregators cannot be added or removed
// while running.
VersionChange version_change(const Topology& current, const Topology& next);

}  // namespace fedwan::topology
