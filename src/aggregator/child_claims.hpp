// What a parent makes of the values a child states that the parent already
// knows from the topology or from its own state. An authenticated child can
// still lie in any of them; each is taken from what the parent knows, or
// checked against it and refused. Pure: no sockets, no clocks.
//
//   field                     parent's rule
//   delta weight (site)       the site's topology weight; the header is ignored
//   delta weight (region)     (0, weight of the sites under it]; more is refused
//   delta codec               the federation's codec
//   delta chunk/elements      the chunk plan (RoundAccumulator)
//   delta round               the open round (RoundAccumulator: stale, future)
//   telemetry round           a round the parent still waits a report for
//   telemetry counts          once per child and round; frames * 64 <= bytes
//   checkpoint round          at most a couple of rounds past the parent's
//   checkpoint size           at most replica_max_bytes (16 models + 64 MiB)
//   hello node, topology,     must match the authenticated peer, the loaded
//   model size                topology and the federation's model
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fedwan::aggregator {

// How much a parent trusts the weight in a child's delta header.
struct DeltaWeight {
  double weight = 0;                   // the weight to aggregate with
  bool claim_differs = false;          // the header said something else (audited)
  std::optional<std::string> refusal;  // set: refuse the delta
};

// `subtree_weight` is the topology weight of the sites under the child (the
// site's own weight for a site). `excused`: the weight the child says was
// delivered below it and refused there (a region's; a site has none); with
// the claimed weight it may not exceed the subtree's.
DeltaWeight judge_delta_weight(bool child_is_site, double subtree_weight, double claimed,
                               double excused = 0);

// Telemetry is counters a parent cannot know, but can bound: every frame is
// at least a header long, and the sums stay far from wrapping.
inline constexpr uint64_t kMaxTelemetryBytes = uint64_t{1} << 56;  // 64 PiB per round
std::optional<std::string> telemetry_refusal(uint64_t wan_bytes, uint64_t fp32_bytes,
                                             uint64_t frames);

// A child writes a checkpoint at a round boundary it reached through this
// parent, so a replica claims a round at most this many past the parent's.
inline constexpr uint64_t kReplicaRoundSlack = 2;

// The most bytes a child's replica may announce: `configured` when set,
// else what a checkpoint of the model may be on the wire
// (node::checkpoint_max_bytes: 16 fp32 models plus 64 MiB); 0 while neither
// is known (no replica is taken then).
uint64_t replica_max_bytes(uint64_t configured, uint64_t model_elements);

}  // namespace fedwan::aggregator
