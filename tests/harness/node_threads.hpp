// The nodes of a test federation as threads, for tests that drive one
// child by hand (harness/raw_site.hpp) beside real aggregators and sites:
// an aggregator's and a synthetic site's run on a NodeSpawner, a small fp32
// federation, and reading audit logs and alarms.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fedwan/aggregator.hpp"
#include "fedwan/topology.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"

namespace fedwan::testing {

// Spawns aggregator `id` of `topo` (the root with `init`), built on its own
// thread; its summary goes to *summary when given. `adjust` may change the
// options first. `topo` and *summary must outlive nodes.join().
void spawn_aggregator(NodeSpawner& nodes, const Topology& topo, const std::string& id,
                      const std::vector<float>& init, AggregatorSummary* summary = nullptr,
                      std::function<void(AggregatorOptions&)> adjust = {});

// Spawns site `id` training the synthetic workload (`steps` a round) to the
// end of the federation. `topo` must outlive nodes.join().
void spawn_synthetic_site(NodeSpawner& nodes, const Topology& topo, const std::string& id,
                          const std::vector<float>& init, uint64_t seed, uint64_t steps);

// A federation small enough to reason about chunk by chunk: fp32, chunks of
// 1024 elements, 2 local steps a round.
inline FederationSpec small_fp32_federation(uint64_t rounds) {
  FederationSpec fed;
  fed.rounds = rounds;
  fed.inner_steps = 2;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 30;
  return fed;
}

// A federation in which a child waited for in vain would hang a round
// (quorum 1.0, no deadline), with fast heartbeats: fp16, chunks of 1024
// elements, 2 local steps a round, DiLoCo.
inline FederationSpec every_member_federation(uint64_t rounds, double round_timeout_s) {
  FederationSpec f;
  f.rounds = rounds;
  f.inner_steps = 2;
  f.codec = "fp16";
  f.chunk_bytes = 4096;
  f.outer.name = "diloco";
  f.round_timeout_s = round_timeout_s;
  f.quorum = 1.0;
  f.deadline_s = 0;
  f.heartbeat_s = 0.2;
  f.heartbeat_timeout_s = 5;
  return f;
}

// The entries of an audit log, parsed.
std::vector<nlohmann::json> audit_entries(const std::filesystem::path& path);

// Entries of `event` whose fields mention `needle`.
size_t count_audit(const std::filesystem::path& path, const std::string& event,
                   const std::string& needle);

// Whether `alarms` ("kind: message") holds one of `kind`.
bool has_alarm(const std::vector<std::string>& alarms, const std::string& kind);

}  // namespace fedwan::testing
