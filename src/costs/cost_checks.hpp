// `fedwan costs`: the records of a run checked against each other and the
// topology, after the ledger verified whose each one is (cost_records.hpp).
//
// - Device time: a site's training time in a round is at most the round's
//   wall time (its parent's record: from the end of the parent's previous
//   round to the end of this one; without it, the site's own start to end)
//   plus CostTolerance, on at most the devices its topology node allows
//   (`devices`; unset or no topology: the count it declared). An
//   aggregator trains on nothing. A record past either bound is refused.
// - Link bytes: the bytes between a child and its parent are billed at the
//   parent's count (the neutral one: the child's record is its own word).
//   Per link, the child's totals over the rounds both recorded are compared
//   with the parent's and a difference past CostTolerance is reported with
//   both figures. A round only the parent recorded (the child's record is
//   missing or refused) bills the child its bytes all the same; a round only
//   the child recorded bills its own count, marked as declared.
// - With a topology, a record of a node it does not have is refused.
// Pure; thread safety: none needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "costs/cost_ledger.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::costs {

struct CostTolerance {
  // Link bytes: what a child and its parent may count differently over a
  // run: each TLS handshake is counted by the child alone (about 1.1 KiB
  // per connection and reconnect), and a child killed mid-round never
  // records what it sent before it died.
  double link_relative = 0.01;
  uint64_t link_bytes = uint64_t{64} << 10;
  // Training time: the two ends close their rounds at slightly different
  // moments (an overlapped site merges its anchor a few steps after its
  // parent moved on), and clocks drift.
  double time_relative = 0.10;
  double time_seconds = 5;
};

// One child's link to its parent, over the whole bill.
struct LinkReconciliation {
  std::string child, parent;
  // Totals over the rounds both ends recorded.
  uint64_t child_sent = 0, parent_received = 0;
  uint64_t child_received = 0, parent_sent = 0;
  uint64_t rounds_both = 0;         // billed at the parent's count
  uint64_t rounds_child_only = 0;   // billed at the child's (declared)
  uint64_t rounds_parent_only = 0;  // the child had no billable record
  bool mismatch = false;            // beyond the tolerance
};

struct CheckedCosts {
  std::vector<CostRecord> billed;    // what bill_costs prices, one per node and round
  std::vector<CostRefusal> refused;  // past a bound
  std::vector<LinkReconciliation> links;
  uint64_t device_records = 0;         // billed records with device time
  uint64_t wall_from_parent = 0;       // of those, bounded by their parent's round time
  uint64_t devices_from_topology = 0;  // of those, devices bounded by the topology
};

// `topology` may be null: parents are then inferred from the records'
// roles (a node's one peer of a higher role), and devices are as declared.
CheckedCosts check_costs(const CostLedger& ledger, const Topology* topology,
                         const CostTolerance& tolerance = {});

}  // namespace fedwan::costs
