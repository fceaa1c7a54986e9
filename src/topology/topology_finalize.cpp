// Topology::finalize in its steps: the settings, each node on its own, one
// transport, the parent links, the tree (no cycle, everyone reaches the
// root), the children lists. The canonical text the digest is taken of is
// in topology_canonical.cpp.
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
      fail(who + "streams " + streams_text(*s.streams) +
           " is set on the root; the root has no parent link to stripe (set streams on its "
           "children, or federation.streams)");
    }
    const std::string streams = streams_problem(*s.streams);
    if (!streams.empty()) fail(who + streams);
  }
  if (s.max_streams) {
    if (s.role == Role::kRoot) {
      fail(who + "max_streams " + std::to_string(*s.max_streams) +
           " is set on the root; the root has no parent link (set it on its children, or "
           "federation.max_streams)");
    }
    const std::string max_streams = max_streams_problem(*s.max_streams);
    if (!max_streams.empty()) fail(who + max_streams);
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

}  // namespace fedwan::topology_detail
