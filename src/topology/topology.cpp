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
//     outer_optimizer: {name: diloco, lr: 0.7, momentum: 0.9}
//   policy: {k_min: 2}                # optional; default k_min of regions
//   nodes:                            # file order = index = wire sender id
//     - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000", jurisdiction: EU,
//        standby_endpoint: "tcp://127.0.0.2:7000"}
//     - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001",
//        bind: "tcp://*:7001", jurisdiction: EU, k_min: 2}
//     - {id: site-a, role: site, parent: eu, weight: 6000, allowed_jurisdictions: [EU]}
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
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
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

using topology_detail::join;
using topology_detail::YamlReader;

const std::vector<std::string> kTopKeys = {"job", "federation", "policy", "nodes"};
const std::vector<std::string> kFederationKeys = {
    "rounds",         "inner_steps", "codec",       "chunk_bytes",         "round_timeout_s",
    "quorum",         "deadline_s",  "heartbeat_s", "heartbeat_timeout_s", "replica_every",
    "outer_optimizer"};
// "name" and every hyper-parameter some optimizer takes (which one takes
// which is the optimizer's rule, checked in validate_federation).
std::vector<std::string> outer_keys() {
  std::vector<std::string> keys = {"name"};
  for (const auto& optimizer : outer_optimizer_names()) {
    for (const auto& p : outer_optimizer_params(optimizer)) {
      if (std::find(keys.begin(), keys.end(), p.name) == keys.end()) keys.push_back(p.name);
    }
  }
  return keys;
}
const std::vector<std::string> kNodeKeys = {"id", "role", "parent", "endpoint", "bind", "weight",
                                            "standby_endpoint", "standby_bind",
                                            // residency, read in topology_policy.cpp
                                            "jurisdiction", "allowed_jurisdictions", "k_min"};

using topology_detail::format_double;
using topology_detail::invalid_endpoint;
using topology_detail::kMaxSiteWeight;
using topology_detail::kMaxTopologyBytes;
using topology_detail::kMaxYamlNesting;
using topology_detail::misplaced_standby_key;
using topology_detail::standby_problem;
using topology_detail::valid_endpoint;
using topology_detail::validate_federation;
using topology_detail::yaml_nesting;

// ---- YAML reading ---------------------------------------------------------

FederationSpec read_federation(const YamlReader& r, const YAML::Node& n) {
  FederationSpec f;
  r.expect_map(n, "federation");
  r.check_keys(n, kFederationKeys, "federation");
  if (auto v = n["rounds"]) f.rounds = r.u64(v, "federation", "rounds");
  if (auto v = n["inner_steps"]) f.inner_steps = r.u64(v, "federation", "inner_steps");
  if (auto v = n["codec"]) f.codec = r.str(v, "federation", "codec");
  if (auto v = n["chunk_bytes"]) f.chunk_bytes = r.u64(v, "federation", "chunk_bytes");
  if (auto v = n["round_timeout_s"]) f.round_timeout_s = r.f64(v, "federation", "round_timeout_s");
  if (auto v = n["quorum"]) f.quorum = r.f64(v, "federation", "quorum");
  if (auto v = n["deadline_s"]) f.deadline_s = r.f64(v, "federation", "deadline_s");
  if (auto v = n["heartbeat_s"]) f.heartbeat_s = r.f64(v, "federation", "heartbeat_s");
  if (auto v = n["heartbeat_timeout_s"]) {
    f.heartbeat_timeout_s = r.f64(v, "federation", "heartbeat_timeout_s");
  }
  if (auto v = n["replica_every"]) f.replica_every = r.u64(v, "federation", "replica_every");
  if (auto o = n["outer_optimizer"]) {
    const std::string ctx = "federation.outer_optimizer";
    r.expect_map(o, ctx);
    r.check_keys(o, outer_keys(), ctx);
    for (const auto& entry : o) {
      const std::string key = entry.first.as<std::string>();
      if (key == "name") {
        f.outer.name = r.str(entry.second, ctx, "name");
      } else {
        f.outer.params[key] = r.f64(entry.second, ctx, key);
      }
    }
  }
  return f;
}

NodeSpec read_node(const YamlReader& r, const YAML::Node& n, size_t pos) {
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
  topology_detail::read_residency(r, n, ctx, s);
  return s;
}

}  // namespace

const char* role_name(Role role) {
  switch (role) {
    case Role::kRoot:
      return "root";
    case Role::kRegion:
      return "region";
    case Role::kSite:
      return "site";
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
    for (size_t i = 0; i < nodes.size(); ++i) t.nodes_.push_back(read_node(r, nodes[i], i));
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
    throw ConfigError("cannot open topology file '" + path + "': " + std::strerror(ENOENT));
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

void Topology::finalize(const std::string& src) {
  auto fail = [&](const std::string& msg) { throw ConfigError(src + ": " + msg); };
  if (!is_valid_node_id(job_)) {
    fail("job '" + job_ + "' is invalid; use 1..64 characters of [A-Za-z0-9._-]");
  }
  validate_federation(federation_, src);
  if (policy_.k_min < 1) fail("policy: k_min 0 is invalid; use an integer >= 1");
  if (nodes_.empty()) fail("the topology has no nodes; list a root, its regions and sites");
  if (nodes_.size() > UINT32_MAX) fail("too many nodes");

  const uint32_t n = static_cast<uint32_t>(nodes_.size());
  std::vector<uint32_t> roots;
  for (uint32_t i = 0; i < n; ++i) {
    NodeSpec& s = nodes_[i];
    const std::string who = "node '" + s.id + "': ";
    if (!is_valid_node_id(s.id)) {
      fail(who + "invalid id (node " + std::to_string(i) +
           "); use 1..64 characters of [A-Za-z0-9._-]");
    }
    for (uint32_t j = 0; j < i; ++j) {
      if (nodes_[j].id == s.id) {
        fail(who + "duplicate id (nodes " + std::to_string(j) + " and " + std::to_string(i) +
             "); every node needs a unique id");
      }
    }
    if (s.role != Role::kRoot && s.role != Role::kRegion && s.role != Role::kSite) {
      fail(who + "unknown role " + std::to_string(static_cast<int>(s.role)) +
           "; use root, region or site");
    }
    std::string residency = topology_detail::residency_field_problem(s);
    if (!residency.empty()) fail(who + residency);
    std::string standby = standby_problem(s);
    if (!standby.empty()) fail(who + standby);
    s.index = i;
    s.parent_index = 0;
    s.children.clear();
    if (s.role == Role::kSite) {
      if (!s.endpoint.empty() || !s.bind.empty()) {
        fail(who +
             "a site has no endpoint or bind (it connects to its parent's endpoint); "
             "remove them");
      }
      if (!(s.weight > 0 && s.weight <= kMaxSiteWeight)) {
        fail(who + "weight " + format_double(s.weight) + " must be > 0 and at most " +
             format_double(kMaxSiteWeight));
      }
      continue;
    }
    if (s.role == Role::kRoot) roots.push_back(i);
    if (s.endpoint.empty()) {
      fail(who + std::string(role_name(s.role)) +
           " needs an endpoint its children connect to, e.g. tcp://host:7000");
    }
    if (s.bind.empty()) s.bind = s.endpoint;
    for (const std::string* e : {&s.endpoint, &s.bind}) {
      if (!valid_endpoint(*e)) fail(who + invalid_endpoint("endpoint", *e));
    }
    if (s.weight != 1.0) {
      fail(who + "weight applies to sites only; an aggregator weighs the sum of its sites");
    }
  }

  if (roots.size() != 1) {
    std::vector<std::string> ids;
    for (uint32_t r : roots) ids.push_back(nodes_[r].id);
    fail(roots.empty() ? "no node has role root; exactly one aggregator must be the root"
                       : std::to_string(roots.size()) + " nodes have role root (" + join(ids) +
                             "); exactly one may");
  }
  root_index_ = roots[0];
  for (NodeSpec& s : nodes_) {
    const std::string who = "node '" + s.id + "': ";
    if (s.role == Role::kRoot) {
      if (!s.parent.empty()) {
        fail(who + "the root has parent '" + s.parent + "'; the root has no parent, remove it");
      }
      continue;
    }
    if (s.parent.empty()) {
      fail(who + "missing parent; name the root or region this " + role_name(s.role) +
           " reports to");
    }
    const NodeSpec* p = find(s.parent);
    if (p == nullptr) fail(who + "parent '" + s.parent + "' is not a node of this topology");
    if (p->role == Role::kSite) {
      fail(who + "parent '" + s.parent + "' is a site; only a root or region can have children");
    }
    s.parent_index = p->index;
  }

  // Walk up from every node; a walk that meets itself before the root has
  // found a cycle. 0: not visited, 1: on the current walk, 2: reaches the root.
  std::vector<uint8_t> state(n, 0);
  state[root_index_] = 2;
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<uint32_t> path;
    uint32_t cur = i;
    while (state[cur] == 0) {
      state[cur] = 1;
      path.push_back(cur);
      cur = nodes_[cur].parent_index;
    }
    if (state[cur] == 1) {
      size_t start = std::find(path.begin(), path.end(), cur) - path.begin();
      auto chain = [&](size_t from) {
        std::string out;
        for (size_t k = from; k < path.size(); ++k) out += nodes_[path[k]].id + " -> ";
        return out + nodes_[cur].id;
      };
      std::string cycle = chain(start);
      if (start == 0) {
        fail("node '" + nodes_[i].id + "': cycle in parent links " + cycle +
             "; these nodes are unreachable from root '" + root().id +
             "', point one of them at an aggregator under the root");
      }
      fail("node '" + nodes_[i].id + "': unreachable from root '" + root().id +
           "', its parent chain " + chain(0) + " runs into the cycle " + cycle);
    }
    for (uint32_t k : path) state[k] = 2;
  }

  for (uint32_t i = 0; i < n; ++i) {
    if (i != root_index_) nodes_[nodes_[i].parent_index].children.push_back(i);
  }
  for (const NodeSpec& s : nodes_) {
    if (s.role != Role::kSite && s.children.empty()) {
      fail("node '" + s.id + "': " + role_name(s.role) +
           " has no children; add sites under it or remove it");
    }
  }
  // Residency across the tree, now that parents and children are known.
  if (auto why = topology_detail::residency_tree_problem(*this)) fail(*why);

  Sha256Digest job_hash = sha256(job_.data(), job_.size());
  job_id_ = 0;
  for (int k = 7; k >= 0; --k) job_id_ = (job_id_ << 8) | job_hash[k];

  // One line per field, keys sorted, nodes in index order (the index is the
  // wire sender id, so order matters). Optional values render as "-".
  const FederationSpec& f = federation_;
  std::string c = "fedwan-topology 1\n";
  c += "federation.chunk_bytes=" + std::to_string(f.chunk_bytes) + "\n";
  c += "federation.codec=" + f.codec + "\n";
  c += "federation.inner_steps=" + std::to_string(f.inner_steps) + "\n";
  // The hyper-parameters of version 0.6 always appear ("-" when unset),
  // later ones only when set: existing files keep their digests.
  std::map<std::string, std::string> outer;
  for (const char* key : {"beta1", "beta2", "eps", "lr", "momentum"}) outer[key] = "-";
  for (const auto& [key, value] : f.outer.params) outer[key] = format_double(value);
  for (const auto& [key, value] : outer) c += "federation.outer." + key + "=" + value + "\n";
  c += "federation.outer.name=" + f.outer.name + "\n";
  c += "federation.round_timeout_s=" + format_double(f.round_timeout_s) + "\n";
  c += "federation.rounds=" + std::to_string(f.rounds) + "\n";
  c += "job=" + job_ + "\n";
  // Fault-tolerance settings appear only when not the default, so a topology
  // without them keeps the digest it had before they existed.
  const FederationSpec defaults;
  if (f.quorum != defaults.quorum) c += "federation.quorum=" + format_double(f.quorum) + "\n";
  if (f.deadline_s != defaults.deadline_s) {
    c += "federation.deadline_s=" + format_double(f.deadline_s) + "\n";
  }
  if (f.heartbeat_s != defaults.heartbeat_s) {
    c += "federation.heartbeat_s=" + format_double(f.heartbeat_s) + "\n";
  }
  if (f.heartbeat_timeout_s != defaults.heartbeat_timeout_s) {
    c += "federation.heartbeat_timeout_s=" + format_double(f.heartbeat_timeout_s) + "\n";
  }
  if (f.replica_every != defaults.replica_every) {
    c += "federation.replica_every=" + std::to_string(f.replica_every) + "\n";
  }
  // Residency and standby fields appear only when set, so a topology without
  // them keeps the digest it had before they existed. The allowed list is a
  // set: sorted.
  for (const NodeSpec& s : nodes_) {
    std::vector<std::string> allowed = s.allowed_jurisdictions;
    std::sort(allowed.begin(), allowed.end());
    std::string line = "node." + std::to_string(s.index);
    if (!allowed.empty()) line += " allowed_jurisdictions=" + join(allowed);
    line += " bind=" + s.bind + " endpoint=" + s.endpoint + " id=" + s.id;
    if (!s.jurisdiction.empty()) line += " jurisdiction=" + s.jurisdiction;
    if (s.k_min != 0) line += " k_min=" + std::to_string(s.k_min);
    line += " parent=" + s.parent + " role=" + role_name(s.role);
    if (!s.standby_endpoint.empty()) {
      line += " standby_bind=" + s.standby_bind + " standby_endpoint=" + s.standby_endpoint;
    }
    c += line + " weight=" + format_double(s.weight) + "\n";
  }
  if (policy_.k_min != PolicySpec{}.k_min) {
    c += "policy.k_min=" + std::to_string(policy_.k_min) + "\n";
  }
  digest_ = sha256(c.data(), c.size());
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
std::vector<uint32_t> Topology::sites_under(uint32_t index) const {
  std::vector<uint32_t> out;
  std::vector<uint32_t> stack = {nodes_.at(index).index};
  while (!stack.empty()) {
    const NodeSpec& s = nodes_[stack.back()];
    stack.pop_back();
    if (s.role == Role::kSite) out.push_back(s.index);
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

std::string Topology::digest_hex() const { return to_hex(digest_.data(), digest_.size()); }

}  // namespace fedwan
