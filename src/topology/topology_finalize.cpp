// Topology::finalize in its steps: the settings, each node on its own, one
// transport, the parent links, the tree (no cycle, everyone reaches the
// root), the children lists, and the canonical text the digest is taken of.
// Each step throws through `fail` (a ConfigError naming the source).
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "topology/participation_window.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan::topology_detail {

void check_settings(const std::string& job, const FederationSpec& federation,
                    const PolicySpec& policy, const std::vector<NodeSpec>& nodes,
                    const std::string& src, const Fail& fail) {
  if (!is_valid_node_id(job)) {
    fail("job '" + job + "' is invalid; use 1..64 characters of [A-Za-z0-9._-]");
  }
  validate_federation(federation, src);
  if (policy.k_min < 1) fail("policy: k_min 0 is invalid; use an integer >= 1");
  if (nodes.empty()) fail("the topology has no nodes; list a root, its regions and sites");
  if (nodes.size() > UINT32_MAX) fail("too many nodes");
}

namespace {

// A valid id no earlier node has, and a known role.
void check_identity(const std::vector<NodeSpec>& nodes, uint32_t i, const std::string& who,
                    const Fail& fail) {
  const NodeSpec& s = nodes[i];
  if (!is_valid_node_id(s.id)) {
    fail(who + "invalid id (node " + std::to_string(i) +
         "); use 1..64 characters of [A-Za-z0-9._-]");
  }
  for (uint32_t j = 0; j < i; ++j) {
    if (nodes[j].id == s.id) {
      fail(who + "duplicate id (nodes " + std::to_string(j) + " and " + std::to_string(i) +
           "); every node needs a unique id");
    }
  }
  if (s.role != Role::kRoot && s.role != Role::kRegion && s.role != Role::kSite) {
    fail(who + "unknown role " + std::to_string(static_cast<int>(s.role)) +
         "; use root, region or site");
  }
}

// The node's own overrides of the federation's TCP link settings.
void check_link_settings(const NodeSpec& s, const std::string& who, const Fail& fail) {
  if (!s.tcp_congestion.empty()) {
    const std::string congestion = tcp_congestion_problem(s.tcp_congestion);
    if (!congestion.empty()) fail(who + congestion);
  }
  if (s.socket_buffer_bytes) {
    const std::string buffers = socket_buffer_problem(*s.socket_buffer_bytes);
    if (!buffers.empty()) fail(who + buffers);
  }
  if (s.streams) {
    if (s.role == Role::kRoot) {
      fail(who + "streams " + std::to_string(*s.streams) +
           " is set on the root; the root has no parent link to stripe (set streams on its "
           "children, or federation.streams)");
    }
    const std::string streams = streams_problem(*s.streams);
    if (!streams.empty()) fail(who + streams);
  }
}

// removed, devices, late_join and windows: meaningless on an aggregator.
void check_site_only_settings(const NodeSpec& s, const std::string& who, const Fail& fail) {
  if (s.role != Role::kSite && s.removed) {
    fail(who + "removed applies to sites only; to retire an aggregator, restart the federation "
               "with a topology without it");
  }
  if (s.devices && (s.role != Role::kSite || *s.devices < 1 || *s.devices > kMaxSiteDevices)) {
    fail(who + (s.role != Role::kSite
                    ? std::string("devices applies to sites only; an aggregator trains on none")
                    : "devices " + std::to_string(*s.devices) + " must be 1 to " +
                          std::to_string(kMaxSiteDevices)));
  }
  if (s.role != Role::kSite && (s.late_join || !s.windows.empty())) {
    fail(who + (s.late_join ? "late_join" : "windows") +
         " applies to sites only; an aggregator runs for the whole federation");
  }
  for (const std::string& w : s.windows) {
    std::string why;
    if (!topology::parse_daily_window(w, &why)) fail(who + why);
  }
}

// Every optional field of the node; defaults the root's standby_bind.
void check_node_settings(NodeSpec& s, const std::string& who, const Fail& fail) {
  std::string residency = residency_field_problem(s);
  if (!residency.empty()) fail(who + residency);
  std::string standby = standby_problem(s);
  if (!standby.empty()) fail(who + standby);
  check_link_settings(s, who, fail);
  check_site_only_settings(s, who, fail);
  if (s.aggregation) {
    if (s.role == Role::kSite) {
      fail(who + "aggregation applies to aggregators only (root, region): a site's update is "
                 "judged by the aggregator it goes to");
    }
    if (auto why = aggregation_spec_problem(*s.aggregation)) fail(who + "aggregation: " + *why);
  }
  if (!s.metrics.empty() && !valid_metrics_address(s.metrics)) {
    fail(who + "metrics '" + s.metrics +
         "' is not host:port (e.g. \"127.0.0.1:9400\", port 0 = any free port)");
  }
}

// A site connects to its parent's endpoint and carries a weight.
void check_site_endpoint_and_weight(const NodeSpec& s, const std::string& who, const Fail& fail) {
  if (!s.endpoint.empty() || !s.bind.empty()) {
    fail(who + "a site has no endpoint or bind (it connects to its parent's endpoint); "
               "remove them");
  }
  if (!(s.weight > 0 && s.weight <= kMaxSiteWeight)) {
    fail(who + "weight " + format_double(s.weight) + " must be > 0 and at most " +
         format_double(kMaxSiteWeight));
  }
}

// An aggregator needs an endpoint and carries no weight; defaults its bind
// to the endpoint.
void check_aggregator_endpoint_and_weight(NodeSpec& s, const std::string& who, const Fail& fail) {
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

uint32_t the_one_root(const std::vector<NodeSpec>& nodes, const std::vector<uint32_t>& roots,
                      const Fail& fail) {
  if (roots.size() != 1) {
    std::vector<std::string> ids;
    ids.reserve(roots.size());
    for (uint32_t r : roots) ids.push_back(nodes[r].id);
    fail(roots.empty() ? "no node has role root; exactly one aggregator must be the root"
                       : std::to_string(roots.size()) + " nodes have role root (" + join(ids) +
                             "); exactly one may");
  }
  return roots[0];
}

}  // namespace

uint32_t check_nodes(std::vector<NodeSpec>& nodes, const Fail& fail) {
  const uint32_t n = static_cast<uint32_t>(nodes.size());
  std::vector<uint32_t> roots;
  for (uint32_t i = 0; i < n; ++i) {
    NodeSpec& s = nodes[i];
    const std::string who = "node '" + s.id + "': ";
    check_identity(nodes, i, who, fail);
    check_node_settings(s, who, fail);
    s.index = i;
    s.parent_index = 0;
    s.children.clear();
    if (s.role == Role::kSite) {
      check_site_endpoint_and_weight(s, who, fail);
      continue;
    }
    if (s.role == Role::kRoot) roots.push_back(i);
    check_aggregator_endpoint_and_weight(s, who, fail);
  }
  return the_one_root(nodes, roots, fail);
}

void check_one_transport(const std::vector<NodeSpec>& nodes, const Fail& fail) {
  // mem:// (in-process) reaches no other kind of endpoint.
  const NodeSpec* mem = nullptr;
  const NodeSpec* other = nullptr;
  for (const NodeSpec& s : nodes) {
    for (const std::string* e : {&s.endpoint, &s.bind, &s.standby_endpoint, &s.standby_bind}) {
      if (e->empty()) continue;
      (e->rfind("mem://", 0) == 0 ? mem : other) = &s;
    }
  }
  if (mem && other) {
    fail("node '" + mem->id + "' has a mem:// endpoint and node '" + other->id +
         "' another kind; the in-process transport (mem://) cannot be mixed with others");
  }
}

void link_parents(std::vector<NodeSpec>& nodes, const Fail& fail) {
  for (NodeSpec& s : nodes) {
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
    auto p = std::find_if(nodes.begin(), nodes.end(),
                          [&](const NodeSpec& candidate) { return candidate.id == s.parent; });
    if (p == nodes.end()) fail(who + "parent '" + s.parent + "' is not a node of this topology");
    if (p->role == Role::kSite) {
      fail(who + "parent '" + s.parent + "' is a site; only a root or region can have children");
    }
    s.parent_index = p->index;
  }
}

void check_reaches_root(const std::vector<NodeSpec>& nodes, uint32_t root, const Fail& fail) {
  // Walk up from every node; a walk that meets itself before the root has
  // found a cycle. 0: not visited, 1: on the current walk, 2: reaches the root.
  const uint32_t n = static_cast<uint32_t>(nodes.size());
  std::vector<uint8_t> state(n, 0);
  state[root] = 2;
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<uint32_t> path;
    uint32_t cur = i;
    while (state[cur] == 0) {
      state[cur] = 1;
      path.push_back(cur);
      cur = nodes[cur].parent_index;
    }
    if (state[cur] == 1) {
      size_t start = std::find(path.begin(), path.end(), cur) - path.begin();
      auto chain = [&](size_t from) {
        std::string out;
        for (size_t k = from; k < path.size(); ++k) out += nodes[path[k]].id + " -> ";
        return out + nodes[cur].id;
      };
      std::string cycle = chain(start);
      if (start == 0) {
        fail("node '" + nodes[i].id + "': cycle in parent links " + cycle +
             "; these nodes are unreachable from root '" + nodes[root].id +
             "', point one of them at an aggregator under the root");
      }
      fail("node '" + nodes[i].id + "': unreachable from root '" + nodes[root].id +
           "', its parent chain " + chain(0) + " runs into the cycle " + cycle);
    }
    for (uint32_t k : path) state[k] = 2;
  }
}

void attach_children(std::vector<NodeSpec>& nodes, const Fail& fail) {
  for (uint32_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].role != Role::kRoot) nodes[nodes[i].parent_index].children.push_back(i);
  }
  for (const NodeSpec& s : nodes) {
    if (s.role != Role::kSite && s.children.empty()) {
      fail("node '" + s.id + "': " + role_name(s.role) +
           " has no children; add sites under it or remove it");
    }
    if (s.role != Role::kSite && std::all_of(s.children.begin(), s.children.end(), [&](uint32_t c) {
          return nodes[c].late_join || nodes[c].removed;
        })) {
      fail("node '" + s.id +
           "': every child is late_join or removed; at least one must be there at the "
           "start (the model's size and the first round come from it)");
    }
  }
}

uint64_t job_id_of(const std::string& job) {
  const Sha256Digest job_hash = sha256(job.data(), job.size());
  uint64_t id = 0;
  for (int k = 7; k >= 0; --k) id = (id << 8) | job_hash[k];
  return id;
}

namespace {

// The settings rendered whatever their value (before job=, keys sorted).
std::string core_federation_lines(const FederationSpec& f) {
  std::string c = "federation.chunk_bytes=" + std::to_string(f.chunk_bytes) + "\n";
  c += "federation.codec=" + f.codec + "\n";
  c += "federation.inner_steps=" + std::to_string(f.inner_steps) + "\n";
  // The hyper-parameters of version 0.6 always appear ("-" when unset),
  // later ones only when set: existing files keep their digests.
  std::map<std::string, std::string> outer;
  for (const char* key : {"beta1", "beta2", "eps", "lr", "momentum"}) outer[key] = "-";
  for (const auto& [key, value] : f.outer.params) outer[key] = format_double(value);
  for (const auto& [key, value] : outer) {
    c.append("federation.outer.").append(key).append("=").append(value).append("\n");
  }
  c += "federation.outer.name=" + f.outer.name + "\n";
  c += "federation.round_timeout_s=" + format_double(f.round_timeout_s) + "\n";
  c += "federation.rounds=" + std::to_string(f.rounds) + "\n";
  return c;
}

// Fault-tolerance, replication, tcp_congestion, socket buffer and streams
// settings appear only when not the default, so a topology without them
// keeps the digest it had before they existed.
// The value checks and norm bound, each field only where not the default,
// so a topology that sets none keeps its digest.
std::string aggregation_lines(const AggregationSpec& a) {
  const AggregationSpec d;
  const std::string k = "federation.aggregation.";
  std::string c;
  for (const auto& [key, value] : a.params) {
    c += k;
    c += "params." + key + "=" + format_double(value) + "\n";
  }
  if (a.finite_check != d.finite_check) {
    c += k + "finite_check=" + (a.finite_check ? "true" : "false") + "\n";
  }
  if (a.max_abs != d.max_abs) c += k + "max_abs=" + format_double(a.max_abs) + "\n";
  if (a.replay_window != d.replay_window) {
    c += k + "replay_window=" + std::to_string(a.replay_window) + "\n";
  }
  const NormBoundSpec& b = a.norm_bound;
  if (b.mode != d.norm_bound.mode) c += k + "norm_bound.mode=" + b.mode + "\n";
  if (b.factor != d.norm_bound.factor) {
    c += k + "norm_bound.factor=" + format_double(b.factor) + "\n";
  }
  if (b.window != d.norm_bound.window) {
    c += k + "norm_bound.window=" + std::to_string(b.window) + "\n";
  }
  if (b.bound != d.norm_bound.bound) c += k + "norm_bound.bound=" + format_double(b.bound) + "\n";
  if (b.action != d.norm_bound.action) c += k + "norm_bound.action=" + b.action + "\n";
  return c;
}

// Differential privacy, each field only where not the default.
std::string privacy_lines(const PrivacySpec& p) {
  const PrivacySpec d;
  const std::string k = "federation.privacy.";
  std::string c;
  if (p.mode != d.mode) c += k + "mode=" + p.mode + "\n";
  if (p.clip != d.clip) c += k + "clip=" + format_double(p.clip) + "\n";
  if (p.noise_multiplier != d.noise_multiplier) {
    c += k + "noise_multiplier=" + format_double(p.noise_multiplier) + "\n";
  }
  if (p.target_epsilon != d.target_epsilon) {
    c += k + "target_epsilon=" + format_double(p.target_epsilon) + "\n";
  }
  if (p.delta != d.delta) c += k + "delta=" + format_double(p.delta) + "\n";
  if (p.epsilon_budget != d.epsilon_budget) {
    c += k + "epsilon_budget=" + format_double(p.epsilon_budget) + "\n";
  }
  if (p.target_quantile != d.target_quantile) {
    c += k + "target_quantile=" + format_double(p.target_quantile) + "\n";
  }
  if (p.clip_learning_rate != d.clip_learning_rate) {
    c += k + "clip_learning_rate=" + format_double(p.clip_learning_rate) + "\n";
  }
  if (p.clip_count_budget != d.clip_count_budget) {
    c += k + "clip_count_budget=" + format_double(p.clip_count_budget) + "\n";
  }
  return c;
}

std::string later_federation_lines(const FederationSpec& f) {
  const FederationSpec defaults;
  std::string c;
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
  if (f.tcp_congestion != defaults.tcp_congestion) {
    c += "federation.tcp_congestion=" + f.tcp_congestion + "\n";
  }
  if (f.socket_buffer_bytes != defaults.socket_buffer_bytes) {
    c += "federation.socket_buffer_bytes=" + std::to_string(f.socket_buffer_bytes) + "\n";
  }
  if (f.streams != defaults.streams) {
    c += "federation.streams=" + std::to_string(f.streams) + "\n";
  }
  if (f.overlap_steps != defaults.overlap_steps) {
    c += "federation.overlap_steps=" + std::to_string(f.overlap_steps) + "\n";
  }
  if (f.aggregation.rule != defaults.aggregation.rule) {
    c += "federation.aggregation.rule=" + f.aggregation.rule + "\n";
  }
  return c + aggregation_lines(f.aggregation) + privacy_lines(f.privacy);
}

// Residency, standby, tcp_congestion, socket buffer, streams, membership
// and metrics fields appear only when set, so a topology without them keeps
// the digest it had before they existed. The allowed list is a set: sorted.
// A node's own aggregation settings, every field (it is set only where it
// differs from the federation's).
std::string node_aggregation_text(const AggregationSpec& a) {
  const NormBoundSpec& b = a.norm_bound;
  std::string t = "rule=" + a.rule;
  for (const auto& [key, value] : a.params) t += ";params." + key + "=" + format_double(value);
  t += std::string(";finite_check=") + (a.finite_check ? "true" : "false");
  t += ";max_abs=" + format_double(a.max_abs) + ";replay_window=" + std::to_string(a.replay_window);
  t += ";norm_bound.mode=" + b.mode + ";norm_bound.factor=" + format_double(b.factor) +
       ";norm_bound.window=" + std::to_string(b.window) +
       ";norm_bound.bound=" + format_double(b.bound) + ";norm_bound.action=" + b.action;
  return t;
}

std::string node_line(const NodeSpec& s) {
  std::vector<std::string> allowed = s.allowed_jurisdictions;
  std::sort(allowed.begin(), allowed.end());
  std::string line = "node." + std::to_string(s.index);
  if (s.aggregation) line += " aggregation=" + node_aggregation_text(*s.aggregation);
  if (!allowed.empty()) line += " allowed_jurisdictions=" + join(allowed);
  line += " bind=" + s.bind + " endpoint=" + s.endpoint + " id=" + s.id;
  if (!s.jurisdiction.empty()) line += " jurisdiction=" + s.jurisdiction;
  if (s.k_min != 0) line += " k_min=" + std::to_string(s.k_min);
  line += " parent=" + s.parent + " role=" + role_name(s.role);
  if (s.socket_buffer_bytes) {
    line += " socket_buffer_bytes=" + std::to_string(*s.socket_buffer_bytes);
  }
  if (!s.standby_endpoint.empty()) {
    line += " standby_bind=" + s.standby_bind + " standby_endpoint=" + s.standby_endpoint;
  }
  if (s.streams) line += " streams=" + std::to_string(*s.streams);
  if (!s.tcp_congestion.empty()) line += " tcp_congestion=" + s.tcp_congestion;
  if (s.late_join) line += " late_join=1";
  if (!s.metrics.empty()) line += " metrics=" + s.metrics;
  if (!s.windows.empty()) line += " windows=" + join(s.windows);
  if (s.removed) line += " removed=1";
  if (s.devices) line += " devices=" + std::to_string(*s.devices);
  return line + " weight=" + format_double(s.weight) + "\n";
}

}  // namespace

std::string canonical_text(const std::string& job, const FederationSpec& f,
                           const PolicySpec& policy, const std::vector<NodeSpec>& nodes) {
  // One line per field, keys sorted, nodes in index order (the index is the
  // wire sender id, so order matters). Optional values render as "-".
  std::string c = "fedwan-topology 1\n";
  c += core_federation_lines(f);
  c += "job=" + job + "\n";
  c += later_federation_lines(f);
  for (const NodeSpec& s : nodes) c += node_line(s);
  if (policy.k_min != PolicySpec{}.k_min) {
    c += "policy.k_min=" + std::to_string(policy.k_min) + "\n";
  }
  return c;
}

}  // namespace fedwan::topology_detail
