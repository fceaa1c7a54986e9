// Preparing a demo run: its topology, credentials and plans (demo_plan.hpp).
#include "cli/demo_plan.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

#include "cli/demo_flags.hpp"
#include "cli/workload.hpp"
#include "common/loopback_port.hpp"
#include "fedwan/error.hpp"
#include "fedwan/security.hpp"
#include "security/tls_session.hpp"

namespace fedwan::cli {
namespace {

namespace fs = std::filesystem;

// A free loopback port this demo has not handed out yet, reserved for it
// (common/loopback_port.hpp: outside the ephemeral range, so a node killed
// by --chaos finds its port free again when it restarts).
int free_port() {
  static std::set<int> given;
  for (int tries = 0; tries < 1000; ++tries) {
    const int port = reserve_loopback_port();
    if (given.insert(port).second) return port;
  }
  throw Error("demo: cannot find a free loopback port not already in use by this demo");
}

Topology demo_topology(const DemoArgs& a, const std::vector<double>& weights,
                       const std::string& late_site) {
  FederationSpec fed;
  fed.rounds = a.rounds;
  fed.inner_steps = a.inner_steps;
  fed.overlap_steps = a.overlap_steps;
  fed.streams = a.streams;
  fed.codec = a.codec;
  fed.chunk_bytes = a.chunk_bytes;
  fed.outer.name = a.outer;
  fed.aggregation = aggregation_settings(a.aggregation);
  if (!a.region_aggregation.empty() && a.regions == 0) {
    throw ConfigError("--region-aggregation needs regions (--regions 0 puts the sites under the "
                      "root: use --root-aggregation)");
  }
  fed.privacy = privacy_settings(a.privacy);
  auto endpoint = [&](int k) {
    const int port = a.base_port > 0 ? a.base_port + k : free_port();
    return "tcp://127.0.0.1:" + std::to_string(port);
  };
  std::vector<NodeSpec> nodes;
  NodeSpec root;
  root.id = "root";
  root.role = Role::kRoot;
  root.endpoint = endpoint(0);
  if (!a.root_aggregation.empty()) {
    root.aggregation =
        aggregation_settings(a.root_aggregation, fed.aggregation, "--root-aggregation");
  }
  nodes.push_back(root);
  for (int r = 0; r < a.regions; ++r) {
    NodeSpec n;
    n.id = "region-" + std::to_string(r);
    n.role = Role::kRegion;
    n.parent = "root";
    n.endpoint = endpoint(1 + r);
    if (!a.region_aggregation.empty()) {
      n.aggregation =
          aggregation_settings(a.region_aggregation, fed.aggregation, "--region-aggregation");
    }
    nodes.push_back(n);
  }
  for (int s = 0; s < a.sites; ++s) {
    NodeSpec n;
    n.id = "site-" + std::to_string(s);
    n.role = Role::kSite;
    n.parent = a.regions > 0 ? "region-" + std::to_string(s % a.regions) : "root";
    n.weight = weights[static_cast<size_t>(s)];
    n.late_join = n.id == late_site;
    // What its cost records may bill: one device per rank.
    n.devices = static_cast<uint64_t>(std::max(1, a.ranks_per_site));
    nodes.push_back(n);
  }
  if (a.metrics) {
    for (NodeSpec& n : nodes) n.metrics = "127.0.0.1:" + std::to_string(free_port());
  }
  return Topology::build("fedwan-demo", fed, nodes);
}

// Site weights are their sample counts (FedAvg weighting).
std::vector<double> site_weights(const DemoArgs& a) {
  std::vector<double> weights(static_cast<size_t>(a.sites), 1.0);
  if (a.workload.trainer == "fashion-cnn") {
    const auto shards = fashion_shards(a.workload, static_cast<size_t>(a.sites));
    for (size_t s = 0; s < shards.size(); ++s) weights[s] = static_cast<double>(shards[s].size());
  }
  return weights;
}

// The demo's federation CA: a fresh one, or the one an earlier run left in
// the same --dir when it still serves every node. An existing CA is never
// replaced unless asked (--force): it may be one the user cares about.
void prepare_credentials(const Topology& topo, const fs::path& pki, bool force) {
  std::error_code ec;
  if (!fs::exists(pki / "ca", ec)) {
    provision_credentials(topo, pki.string(), 7, /*overwrite=*/false);
    return;
  }
  if (force) {
    std::cout << "fedwan demo: replacing the federation CA in " << pki.string() << " (--force)\n";
    provision_credentials(topo, pki.string(), 7, /*overwrite=*/true);
    return;
  }
  for (const NodeSpec& n : topo.nodes()) {
    try {
      const security::TlsContext bundle((pki / n.id).string());
      if (bundle.self().node_id != n.id) throw ConfigError("it is the bundle of another node");
    } catch (const Error& e) {
      throw ConfigError(pki.string() + " already holds a federation CA, but it cannot serve '" +
                        n.id + "' of this demo (" + e.what() +
                        "); pass --force to replace that CA and every bundle, or choose "
                        "another --dir");
    }
  }
  std::cout << "fedwan demo: reusing the federation CA in " << pki.string() << "\n";
}

// --node-binary NODE=PATH, each naming a node of the demo and a program
// this user may run.
std::map<std::string, std::string> parse_node_binaries(const std::vector<std::string>& flags,
                                                       const Topology& topo) {
  std::map<std::string, std::string> out;
  for (const std::string& f : flags) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == f.size()) {
      throw ConfigError("--node-binary " + f + ": expected NODE=PATH, e.g. site-3=./my-fedwan");
    }
    const std::string node = f.substr(0, eq);
    const std::string path = f.substr(eq + 1);
    if (topo.find(node) == nullptr) {
      throw ConfigError("--node-binary " + f + ": the demo has no node '" + node + "'");
    }
    std::error_code ec;
    if (!fs::is_regular_file(path, ec) || ::access(path.c_str(), X_OK) != 0) {
      throw ConfigError("--node-binary " + f + ": " + path + " is not a program this user may run");
    }
    if (!out.emplace(node, fs::absolute(path).string()).second) {
      throw ConfigError("--node-binary " + f + ": '" + node + "' is given twice");
    }
  }
  return out;
}

std::optional<AddedSite> plan_added_site(const DemoArgs& a, const DemoPlan& plan) {
  if (a.add_site == 0) return std::nullopt;
  if (a.insecure_plaintext) {
    throw ConfigError("--add-site needs mutual TLS: aggregators adopt only topology versions "
                      "the admin signed, checked against the federation CA");
  }
  if (a.add_site < 2 || a.add_site > a.rounds) {
    throw ConfigError("--add-site " + std::to_string(a.add_site) + ": a round in 2.." +
                      std::to_string(a.rounds));
  }
  return prepare_added_site(plan.topology, plan.dir, plan.pki,
                            a.metrics ? "127.0.0.1:" + std::to_string(free_port()) : "");
}

}  // namespace

DemoPlan plan_demo(const DemoArgs& a, fs::path dir) {
  const std::vector<double> weights = site_weights(a);
  if (a.insecure_plaintext && a.streams != kStreamsAuto && a.streams > 1) {
    throw ConfigError("--streams " + std::to_string(a.streams) +
                      " needs the secure channel (plaintext frames carry no sequence numbers "
                      "to restore their order): drop --insecure-plaintext, or use --streams 1");
  }
  DemoPlan plan;
  plan.late = parse_site_round("--late", a.late, a.sites, 2, a.rounds);
  plan.leave = parse_site_round("--leave", a.leave, a.sites, 1, a.rounds);
  if (plan.late && plan.leave && plan.late->site == plan.leave->site &&
      plan.leave->round <= plan.late->round) {
    throw ConfigError("--leave " + a.leave + " comes before --late " + a.late);
  }
  plan.topology = demo_topology(a, weights, plan.late ? plan.late->site : std::string());
  plan.chaos = parse_chaos(a.chaos, plan.topology, a.rounds);
  if (plan.chaos && a.no_checkpoints) {
    throw ConfigError("--chaos " + a.chaos +
                      " needs checkpoints to recover from: drop --no-checkpoints");
  }
  if (a.no_audit_log && (plan.late || a.add_site > 0 || plan.chaos)) {
    throw ConfigError(std::string("--no-audit-log: ") +
                      (plan.late        ? "--late"
                       : a.add_site > 0 ? "--add-site"
                                        : "--chaos") +
                      " needs the nodes' audit logs (the demo follows the run through them)");
  }
  plan.binaries = parse_node_binaries(a.node_binaries, plan.topology);
  plan.dir = std::move(dir);
  plan.topology_file = (plan.dir / "topology.yaml").string();
  std::ofstream(plan.topology_file) << plan.topology.to_yaml();
  // Every link is mutual TLS unless asked otherwise: a fresh federation CA
  // and one bundle per node, private to this run.
  plan.pki = plan.dir / "pki";
  if (!a.insecure_plaintext) prepare_credentials(plan.topology, plan.pki, a.force);
  plan.added = plan_added_site(a, plan);
  fs::create_directories(plan.dir / "audit");
  // The ranks of a site meet here; addresses left by an earlier run in the
  // same directory would be taken for live ranks.
  fs::remove_all(plan.dir / "rendezvous");
  // Nodes resume from these after a restart, never from an earlier run's.
  fs::remove_all(plan.dir / "checkpoints");
  fs::remove_all(plan.dir / "reports");
  fs::create_directories(plan.dir / "reports");
  plan.root_report = (plan.dir / "root.json").string();
  return plan;
}

}  // namespace fedwan::cli
