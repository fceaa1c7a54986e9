#include "security/authorization.hpp"

namespace fedwan::security {
namespace {

std::string expected_region(const Topology& t, const NodeSpec& n) {
  switch (n.role) {
    case Role::kRoot: return "";
    case Role::kRegion: return n.id;
    case Role::kSite: return t.node(n.parent_index).id;
  }
  return "";
}

// The certificate must state exactly what the topology says about `n`.
std::optional<std::string> matches_topology(const Topology& t, const NodeSpec& n,
                                            const security::NodeIdentity& cert) {
  if (cert.job != t.job()) {
    return "certificate of '" + cert.node_id + "' is for job '" + cert.job + "', not '" + t.job() +
           "'";
  }
  if (cert.role != n.role) {
    return std::string("certificate of '") + cert.node_id + "' gives role '" +
           role_name(cert.role) + "' but the topology makes '" + n.id + "' a " + role_name(n.role) +
           " (a node acts only in its topology role)";
  }
  const std::string region = expected_region(t, n);
  if (cert.region != region) {
    return "certificate of '" + cert.node_id + "' names region '" + cert.region +
           "' but the topology puts '" + n.id + "' in '" + region + "'";
  }
  return std::nullopt;
}

}  // namespace

namespace {

std::string removed_text(const Topology& topology, const NodeSpec& n) {
  return "'" + n.id + "' was removed from the federation (topology version " +
         std::to_string(topology.version()) + ")";
}

}  // namespace

std::optional<std::string> authorize_child(const Topology& topology, const NodeSpec& self,
                                           const security::NodeIdentity& cert,
                                           const std::string& claimed) {
  if (cert.node_id != claimed) {
    return "certificate is for '" + cert.node_id + "' but the connection claims to be '" + claimed +
           "' (node id mismatch)";
  }
  const NodeSpec* n = topology.find(cert.node_id);
  if (n == nullptr) {
    return "'" + cert.node_id + "' is not a node of topology " +
           topology.digest_hex().substr(0, 12);
  }
  if (n->role == Role::kRoot) {
    // Only the active root streaming its checkpoints to its standby, which
    // runs as the root with the root's credentials, connects as the root.
    if (self.id != n->id || !topology.has_standby()) {
      return "'" + n->id + "' is the root; it has no parent to connect to" +
             (self.id == n->id ? " (and no standby_endpoint in the topology to replicate to)" : "");
    }
    return matches_topology(topology, *n, cert);
  }
  if (auto bad = matches_topology(topology, *n, cert)) return bad;
  if (n->removed) return removed_text(topology, *n);
  if (n->role == Role::kSite) {
    // Covers "not my child" and the jurisdiction rules in one message.
    if (auto refusal = topology.residency_refusal(n->id, self.id)) return refusal;
  }
  if (topology.node(n->parent_index).id != self.id) {
    return std::string(role_name(n->role)) + " '" + n->id + "' reports to '" +
           topology.node(n->parent_index).id + "', not to '" + self.id + "'";
  }
  return std::nullopt;
}

std::string admission_refusal(const Topology& topology, const NodeSpec& self,
                              const std::string& claimed) {
  const NodeSpec* n = topology.find(claimed);
  if (n == nullptr) {
    return "'" + claimed + "' is not a node of topology " + topology.digest_hex().substr(0, 12) +
           "; check the node id and the topology file";
  }
  if (n->role == Role::kRoot) {
    if (self.id == n->id && topology.has_standby()) return "";
    return "'" + n->id + "' is the root; it has no parent to connect to";
  }
  if (n->removed) return removed_text(topology, *n);
  const std::string& parent = topology.node(n->parent_index).id;
  if (parent != self.id) {
    return std::string(role_name(n->role)) + " '" + n->id + "' reports to '" + parent +
           "', not to '" + self.id + "'";
  }
  return "";
}

std::optional<std::string> authorize_parent(const Topology& topology, const NodeSpec& self,
                                            const security::NodeIdentity& cert) {
  if (self.role == Role::kRoot) {
    // The root's only upstream link is to its standby, which presents the
    // root's own certificate.
    if (!topology.has_standby()) return "the root has no parent";
    const NodeSpec& root = topology.root();
    if (cert.node_id != root.id) {
      return "the standby at " + root.standby_endpoint + " presents a certificate for '" +
             cert.node_id + "' but the standby of '" + root.id +
             "' runs as the root with its credentials; refusing to send it anything";
    }
    return matches_topology(topology, root, cert);
  }
  const NodeSpec& parent = topology.node(self.parent_index);
  if (cert.node_id != parent.id) {
    std::string why = "the aggregator at " + parent.endpoint + " presents a certificate for '" +
                      cert.node_id + "' but '" + self.id + "' reports to '" + parent.id + "'";
    if (self.role == Role::kSite) {
      if (auto refusal = topology.residency_refusal(self.id, cert.node_id)) {
        why += " (residency: " + *refusal + ")";
      }
    }
    return why + "; refusing to send it anything";
  }
  if (auto bad = matches_topology(topology, parent, cert)) return bad;
  if (self.role == Role::kSite) {
    if (auto refusal = topology.residency_refusal(self.id, parent.id)) return refusal;
  }
  return std::nullopt;
}

}  // namespace fedwan::security
