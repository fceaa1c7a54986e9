// Builds small federations for tests: a topology over ipc:// endpoints in a
// private temporary directory, and helpers to run every node as a thread.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/security.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "fedwan/topology.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::testing {

// Mutual-TLS settings for node `id` of `topo`: credentials are provisioned
// once per topology (by digest) per test process into a private directory.
inline SecurityOptions security_for(const Topology& topo, const std::string& id) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<TempDir>> provisioned;
  std::lock_guard<std::mutex> lock(mu);
  auto& dir = provisioned[topo.digest_hex()];
  if (!dir) {
    dir = std::make_unique<TempDir>();
    provision_credentials(topo, (dir->path() / "pki").string());
  }
  return credentials_in((dir->path() / "pki").string(), id);
}

// The directory security_for() provisioned `topo` into (for tests that
// issue or revoke certificates).
inline std::string credentials_dir_for(const Topology& topo) {
  const SecurityOptions s = security_for(topo, topo.root().id);
  return std::filesystem::path(s.credentials_dir).parent_path().string();
}

// root -> `regions` regions -> `sites_per_region` sites each (regions = 0:
// the sites hang directly under the root). Endpoints are ipc:// sockets in
// `dir`, or with `in_process` mem:// ones (the in-process transport).
inline Topology make_tree(const std::filesystem::path& dir, int regions, int sites_per_region,
                          FederationSpec fed, bool in_process = false) {
  std::vector<NodeSpec> nodes;
  auto endpoint = [&](const std::string& id) {
    return (in_process ? "mem://" : "ipc://") + (dir / (id + ".sock")).string();
  };
  NodeSpec root;
  root.id = "root";
  root.role = Role::kRoot;
  root.endpoint = endpoint("root");
  nodes.push_back(root);
  int site = 0;
  auto add_sites = [&](const std::string& parent) {
    for (int s = 0; s < sites_per_region; ++s, ++site) {
      NodeSpec n;
      n.id = "site-" + std::to_string(site);
      n.role = Role::kSite;
      n.parent = parent;
      n.weight = 100.0 + 37.0 * site;  // unequal weights exercise the weighting
      nodes.push_back(n);
    }
  };
  if (regions == 0) add_sites("root");
  for (int r = 0; r < regions; ++r) {
    NodeSpec n;
    n.id = "region-" + std::to_string(r);
    n.role = Role::kRegion;
    n.parent = "root";
    n.endpoint = endpoint(n.id);
    nodes.push_back(n);
    add_sites(n.id);
  }
  return Topology::build("test-job", fed, nodes);
}

// A site's options for a test federation: its credentials and `timeout`
// for joining and for each round.
inline SiteOptions site_options(const Topology& topo, const std::string& node,
                                std::chrono::milliseconds timeout) {
  SiteOptions o;
  o.topology = topo;
  o.node_id = node;
  o.join_timeout = timeout;
  o.round_timeout = timeout;
  o.security = security_for(topo, node);
  return o;
}

struct FederationRun {
  AggregatorSummary root;
  std::vector<AggregatorSummary> regions;
  std::vector<std::vector<float>> site_models;  // final params per site, by site order
  // Per site, over its join and syncs: bytes sent, and of them sent again.
  std::vector<uint64_t> site_bytes_sent, site_bytes_resent;
  std::vector<uint64_t> site_replica_bytes;  // per site: its replica's bytes sent
  std::vector<std::string> errors;
  std::string error_text() const {
    std::string out;
    for (const std::string& e : errors) out += e + "\n";
    return out;
  }
};

// Optional per-site set-up for run_threads (both called on the site's thread).
struct SiteSetup {
  // Before the SiteCore is built: adjust its options (params is its buffer).
  std::function<void(SiteOptions&, size_t site, std::vector<float>& params)> options;
  // Once the SiteCore exists, before join().
  std::function<void(SiteCore&, size_t site)> created;
  // Not a site's: the initial model each region is given (empty: none, and
  // it is sent the model in full when it joins).
  std::vector<float> region_initial_model;
  // Not a site's: adjusts an aggregator's options (on its thread).
  std::function<void(AggregatorOptions&)> aggregator;
};

// Runs every node of `topo` as a thread; sites train with the synthetic
// workload. Returns when all threads ended.
FederationRun run_threads(const Topology& topo, const std::vector<float>& init, uint64_t seed,
                          int window = 8, const SiteSetup& setup = {});

}  // namespace fedwan::testing
