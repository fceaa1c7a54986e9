// Topology file (YAML). Every key is checked: a misspelt key is an error, not
// a silently ignored setting. See docs/topology.md for the full reference.
//
//   job: fashion-demo                 # required; 1..64 of [A-Za-z0-9._-]
//   federation:                       # optional; every key optional
//     rounds: 20                      # >= 1
//     inner_steps: 50                 # >= 1 (H)
//     codec: fp16                     # a registered codec name
//     chunk_bytes: 1048576            # 4096..4194304, a multiple of 4
//     round_timeout_s: 600            # finite, > 0
//     quorum: 0.75                    # share of total weight, (0, 1]; default 1
//     deadline_s: 120                 # round closes at quorum after this; 0 = none
//     heartbeat_s: 2                  # > 0
//     heartbeat_timeout_s: 10         # > heartbeat_s
//     replica_every: 1                # checkpoint replication period, rounds; 0 = never
//     tcp_congestion: bbr             # TCP congestion control of the links; "system" = host's
//     overlap_steps: 5                # sites merge the anchor this many steps late; 0 = blocking
//     socket_buffer_bytes: 0          # TCP socket buffers; 0 = kernel autotuning
//     streams: 1                      # TCP connections per tree link, 1..16
//     outer_optimizer: {name: diloco, lr: 0.7, momentum: 0.9}
//   policy: {k_min: 2}                # optional; default k_min of regions
//   nodes:                            # file order = index = wire sender id
//     - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000", jurisdiction: EU,
//        standby_endpoint: "tcp://127.0.0.2:7000"}
//     - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001",
//        bind: "tcp://*:7001", jurisdiction: EU, k_min: 2}
//     - {id: site-a, role: site, parent: eu, weight: 6000, allowed_jurisdictions: [EU],
//        tcp_congestion: cubic}      # any node: overrides federation.tcp_congestion
//     - {id: site-b, role: site, parent: eu, streams: 4}  # not the root: its uplink's streams
//     - {id: site-c, role: site, parent: eu, late_join: true, windows: ["22:00-06:00"],
//        metrics: "127.0.0.1:9400"}
//
// Node rules: exactly one root, without a parent; every other node names an
// existing root or region as parent, and the parent links form a tree.
// Aggregators (root, region) need an endpoint (tcp://, ipc:// or inproc://),
// may give a separate bind endpoint, need at least one child and take no
// weight (theirs is the sum of their sites'). Sites take a weight (finite,
// > 0, default 1) and no endpoint or bind: a site only connects to its parent,
// so an endpoint there is a mistake that would otherwise look meaningful.
// Only the root takes standby_endpoint (an endpoint of the same schemes, not
// its own) and standby_bind (only with standby_endpoint; defaults to it).
// Any node may take tcp_congestion: the federation's, overridden for what
// that node sends (a name of [a-z0-9_], or "system" for the host's default).
// Any node but the root may take streams (1..16): the federation's,
// overridden for that node's uplink.
// Sites may take late_join (the federation does not wait for them at
// start) and windows (daily UTC participation windows); every aggregator
// needs at least one child that is not late_join. Any node may take metrics
// (host:port of its HTTP metrics endpoint).
// Outer optimizer hyper-parameters are whatever the named optimizer takes
// (outer_optimizer_params(), declared by each optimizer); one it does not
// take is refused.
// Residency: `jurisdiction` on aggregators, `allowed_jurisdictions` on sites
// (their parent's jurisdiction must be listed), `k_min` on regions (at least
// that many sites under them); each key on another role is refused. Those
// are read and checked in topology_policy.cpp.
#include "fedwan/topology.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "common/atomic_file.hpp"
#include "common/errno_text.hpp"
#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "topology/privacy_settings.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan {

std::string topology_detail::format_double(double d) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  return std::string(buf, res.ptr);
}

std::string topology_detail::join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

namespace {

using topology_detail::YamlReader;

const std::vector<std::string> kTopKeys = {"job",     "federation", "policy",   "nodes",
                                           "version", "history",    "signature"};
const std::vector<std::string> kNodeKeys = {
    "id", "role", "parent", "endpoint", "bind", "weight", "standby_endpoint", "standby_bind",
    "tcp_congestion", "socket_buffer_bytes", "streams", "max_streams", "late_join", "windows",
    "metrics", "removed", "devices", "aggregation",
    // residency, read in topology_policy.cpp
    "jurisdiction", "allowed_jurisdictions", "k_min"};

using topology_detail::kMaxTopologyBytes;
using topology_detail::kMaxYamlNesting;
using topology_detail::misplaced_standby_key;
using topology_detail::read_aggregation;
using topology_detail::read_federation;
using topology_detail::read_tcp_congestion;
using topology_detail::yaml_nesting;

// ---- YAML reading ---------------------------------------------------------

NodeSpec read_node(const YamlReader& r, const YAML::Node& n, size_t pos,
                   const AggregationSpec& federation_aggregation) {
  std::string ctx = "nodes[" + std::to_string(pos) + "]";
  r.expect_map(n, ctx);
  NodeSpec s;
  if (!n["id"]) r.fail(n, ctx, "missing 'id'; give every node a unique id");
  s.id = r.str(n["id"], ctx, "id");
  ctx = "node '" + s.id + "'";
  r.check_keys(n, kNodeKeys, ctx);
  if (!n["role"]) r.fail(n, ctx, "missing 'role'; use root, region or site");
  std::string role = r.str(n["role"], ctx, "role");
  if (role == "root") {
    s.role = Role::kRoot;
  } else if (role == "region") {
    s.role = Role::kRegion;
  } else if (role == "site") {
    s.role = Role::kSite;
  } else {
    r.fail(n["role"], ctx, "unknown role '" + role + "'; use root, region or site");
  }
  if (auto v = n["parent"]) s.parent = r.str(v, ctx, "parent");
  if (auto v = n["endpoint"]) s.endpoint = r.str(v, ctx, "endpoint");
  if (auto v = n["bind"]) s.bind = r.str(v, ctx, "bind");
  if (auto v = n["weight"]) {
    if (s.role != Role::kSite) {
      r.fail(v, ctx, "'weight' applies to sites only; an aggregator weighs the sum of its sites");
    }
    s.weight = r.f64(v, ctx, "weight");
  }
  for (const char* key : {"standby_endpoint", "standby_bind"}) {
    const std::string misplaced = misplaced_standby_key(key, s.role);
    if (n[key] && !misplaced.empty()) r.fail(n[key], ctx, misplaced);
  }
  if (auto v = n["standby_endpoint"]) s.standby_endpoint = r.str(v, ctx, "standby_endpoint");
  if (auto v = n["standby_bind"]) s.standby_bind = r.str(v, ctx, "standby_bind");
  if (auto v = n["tcp_congestion"]) s.tcp_congestion = read_tcp_congestion(r, v, ctx);
  if (auto v = n["socket_buffer_bytes"])
    s.socket_buffer_bytes = r.u64(v, ctx, "socket_buffer_bytes");
  if (auto v = n["streams"]) s.streams = topology_detail::read_streams(r, v, ctx);
  if (auto v = n["max_streams"]) s.max_streams = r.u64(v, ctx, "max_streams");
  if (auto v = n["late_join"]) s.late_join = r.boolean(v, ctx, "late_join");
  if (auto v = n["windows"]) s.windows = r.str_list(v, ctx, "windows");
  if (auto v = n["metrics"]) s.metrics = r.str(v, ctx, "metrics");
  if (auto v = n["removed"]) s.removed = r.boolean(v, ctx, "removed");
  if (auto v = n["devices"]) s.devices = r.u64(v, ctx, "devices");
  if (auto a = n["aggregation"]) {
    if (s.role == Role::kSite) {
      r.fail(a, ctx,
             "'aggregation' applies to aggregators only (root, region): a site's update "
             "is judged by the aggregator it goes to");
    }
    s.aggregation = federation_aggregation;
    read_aggregation(r, a, ctx + ": aggregation", &*s.aggregation);
  }
  topology_detail::read_residency(r, n, ctx, s);
  return s;
}

}  // namespace

bool same_aggregation(const AggregationSpec& a, const AggregationSpec& b) {
  const NormBoundSpec& x = a.norm_bound;
  const NormBoundSpec& y = b.norm_bound;
  return a.rule == b.rule && a.params == b.params && a.finite_check == b.finite_check &&
         a.max_abs == b.max_abs && a.replay_window == b.replay_window && x.mode == y.mode &&
         x.factor == y.factor && x.window == y.window && x.bound == y.bound && x.action == y.action;
}

const char* role_name(Role role) {
  switch (role) {
    case Role::kRoot: return "root";
    case Role::kRegion: return "region";
    case Role::kSite: return "site";
  }
  return "unknown";
}

Topology Topology::parse(const std::string& yaml_text, const std::string& source) {
  YamlReader r(source);
  Topology t;
  try {
    if (yaml_nesting(yaml_text) > kMaxYamlNesting) {
      throw ConfigError(source + ": nested more than " + std::to_string(kMaxYamlNesting) +
                        " levels deep; a topology is a flat list of nodes");
    }
    YAML::Node doc = YAML::Load(yaml_text);
    if (!doc.IsMap()) {
      r.fail(doc, "topology", "expected a mapping with 'job', 'federation' and 'nodes'");
    }
    r.check_keys(doc, kTopKeys, "topology");
    if (!doc["job"]) r.fail(doc, "topology", "missing 'job'; name the federation job");
    t.job_ = r.str(doc["job"], "topology", "job");
    if (auto f = doc["federation"]) t.federation_ = read_federation(r, f);
    if (auto p = doc["policy"]) t.policy_ = topology_detail::read_policy(r, p);
    YAML::Node nodes = doc["nodes"];
    if (!nodes || !nodes.IsSequence() || nodes.size() == 0) {
      r.fail(nodes ? nodes : doc, "topology", "'nodes' must be a non-empty list of nodes");
    }
    for (size_t i = 0; i < nodes.size(); ++i)
      t.nodes_.push_back(read_node(r, nodes[i], i, t.federation_.aggregation));
    topology_detail::read_version(r, doc, &t.version_, &t.history_, &t.signature_);
  } catch (const YAML::Exception& e) {
    std::string where = source;
    if (!e.mark.is_null()) {
      where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    }
    throw ConfigError(where + ": YAML syntax error: " + e.msg);
  }
  t.finalize(source);
  return t;
}

Topology Topology::load(const std::string& path) {
  ReadFileOptions o;
  o.what = "topology file";
  o.max_bytes = kMaxTopologyBytes;
  o.too_large_hint = "a topology lists nodes and settings in a few KiB";
  std::optional<std::string> text = read_file_if_exists(path, o);
  if (!text) {
    throw ConfigError("cannot open topology file '" + path + "': " + errno_text(ENOENT));
  }
  return parse(*text, path);
}

Topology Topology::build(std::string job, FederationSpec federation, std::vector<NodeSpec> nodes,
                         PolicySpec policy) {
  Topology t;
  t.job_ = std::move(job);
  t.federation_ = std::move(federation);
  t.policy_ = policy;
  t.nodes_ = std::move(nodes);
  t.finalize("<build>");
  return t;
}

void Topology::finalize(const std::string& source) {
  const topology_detail::Fail fail = [&](const std::string& msg) {
    throw ConfigError(source + ": " + msg);
  };
  topology_detail::check_settings(job_, federation_, policy_, nodes_, source, fail);
  root_index_ = topology_detail::check_nodes(nodes_, fail);
  topology_detail::check_one_transport(nodes_, fail);
  topology_detail::link_parents(nodes_, fail);
  topology_detail::check_reaches_root(nodes_, root_index_, fail);
  topology_detail::attach_children(nodes_, fail);
  // Residency across the tree, now that parents and children are known.
  if (auto why = topology_detail::residency_tree_problem(*this)) fail(*why);
  const bool regions = std::any_of(nodes_.begin(), nodes_.end(), [](const NodeSpec& s) {
    return s.role == Role::kRegion && !s.removed;
  });
  if (auto why = topology::privacy_problem(federation_, regions)) {
    fail("federation.privacy: " + *why);
  }
  for (NodeSpec& s : nodes_) {
    // The same settings as the federation's are no setting of its own (one
    // digest for one meaning).
    if (s.aggregation && same_aggregation(*s.aggregation, federation_.aggregation)) {
      s.aggregation.reset();
    }
    if (s.aggregation && federation_.privacy.mode == "central" &&
        s.aggregation->rule != "weighted_mean") {
      fail("node '" + s.id + "': aggregation rule '" + s.aggregation->rule +
           "' under federation.privacy mode central: central mode needs the weighted_mean rule "
           "at every aggregator (another rule changes the sum's sensitivity the noise is "
           "calibrated to)");
    }
  }
  job_id_ = topology_detail::job_id_of(job_);
  if (history_.size() + 1 != version_) {
    fail("version " + std::to_string(version_) + " lists " + std::to_string(history_.size()) +
         " earlier digests in 'history'; it must list exactly " + std::to_string(version_ - 1) +
         " (one per earlier version; `fedwan topology sign` writes them)");
  }
  std::string canonical = topology_detail::canonical_text(job_, federation_, policy_, nodes_);
  if (version_ > 1) {  // version 1 keeps the digest topologies had before versions
    canonical += "version=" + std::to_string(version_) + "\n";
    for (const auto& d : history_) canonical += "history=" + to_hex(d.data(), d.size()) + "\n";
  }
  digest_ = sha256(canonical.data(), canonical.size());
}

Topology::UplinkStreams Topology::uplink_streams(const NodeSpec& child) const {
  if (child.role == Role::kRoot) return {};
  const uint64_t streams = child.streams.value_or(federation_.streams);
  if (streams != kStreamsAuto) return {streams, false};
  return {child.max_streams.value_or(federation_.max_streams), true};
}

const NodeSpec& Topology::node(const std::string& id) const {
  const NodeSpec* s = find(id);
  if (s == nullptr) throw ConfigError("node '" + id + "' is not in topology '" + job_ + "'");
  return *s;
}

const NodeSpec* Topology::find(const std::string& id) const {
  for (const NodeSpec& s : nodes_) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

// Ascending index (file order), so callers iterate sites deterministically.
// Removed sites are no longer under anything.
std::vector<uint32_t> Topology::sites_under(uint32_t index) const {
  std::vector<uint32_t> out;
  std::vector<uint32_t> stack = {nodes_.at(index).index};
  while (!stack.empty()) {
    const NodeSpec& s = nodes_[stack.back()];
    stack.pop_back();
    if (s.role == Role::kSite && !s.removed) out.push_back(s.index);
    stack.insert(stack.end(), s.children.begin(), s.children.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Summed in index order, so every aggregator computes the same double.
double Topology::weight_under(uint32_t index) const {
  double sum = 0;
  for (uint32_t i : sites_under(index)) sum += nodes_[i].weight;
  return sum;
}

uint64_t Topology::rounds_to_run() const { return topology::rounds_run(federation_); }

std::string Topology::digest_hex() const { return to_hex(digest_.data(), digest_.size()); }

}  // namespace fedwan
