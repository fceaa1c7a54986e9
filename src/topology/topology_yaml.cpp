// Topology::to_yaml: the topology written back out as YAML that parses to
// the same digest (fedwan demo writes its topology with it).
#include <optional>
#include <string>
#include <utility>

#include "common/sha256.hpp"
#include "fedwan/topology.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan {

using topology_detail::format_double;

std::string Topology::to_yaml() const {
  // Strings are always double-quoted: an id such as "null" or "1" must stay a string.
  auto q = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    return out + "\"";
  };
  const FederationSpec& f = federation_;
  std::string y = "# fedwan topology, digest " + digest_hex() + "\n";
  y += "job: " + q(job_) + "\n";
  if (version_ > 1) {
    y += "version: " + std::to_string(version_) + "\n";
    y += "history:\n";
    for (const auto& d : history_) y += "  - \"" + to_hex(d.data(), d.size()) + "\"\n";
  }
  y += "federation:\n";
  y += "  rounds: " + std::to_string(f.rounds) + "\n";
  y += "  inner_steps: " + std::to_string(f.inner_steps) + "\n";
  y += "  codec: " + q(f.codec) + "\n";
  y += "  chunk_bytes: " + std::to_string(f.chunk_bytes) + "\n";
  y += "  round_timeout_s: " + format_double(f.round_timeout_s) + "\n";
  y += "  quorum: " + format_double(f.quorum) + "\n";
  y += "  deadline_s: " + format_double(f.deadline_s) + "\n";
  y += "  heartbeat_s: " + format_double(f.heartbeat_s) + "\n";
  y += "  heartbeat_timeout_s: " + format_double(f.heartbeat_timeout_s) + "\n";
  y += "  replica_every: " + std::to_string(f.replica_every) + "\n";
  y += "  tcp_congestion: " + q(f.tcp_congestion) + "\n";
  if (f.overlap_steps != 0) y += "  overlap_steps: " + std::to_string(f.overlap_steps) + "\n";
  if (f.socket_buffer_bytes != 0) {
    y += "  socket_buffer_bytes: " + std::to_string(f.socket_buffer_bytes) + "\n";
  }
  if (f.streams != 1) y += "  streams: " + std::to_string(f.streams) + "\n";
  if (f.aggregation.rule != AggregationSpec{}.rule) {
    y += "  aggregation: {rule: " + q(f.aggregation.rule) + "}\n";
  }
  y += "  outer_optimizer: {name: " + q(f.outer.name);
  for (const auto& [key, value] : f.outer.params) y += ", " + key + ": " + format_double(value);
  y += "}\n";
  if (policy_.k_min != PolicySpec{}.k_min) {
    y += "policy:\n  k_min: " + std::to_string(policy_.k_min) + "\n";
  }
  y += "nodes:\n";
  for (const NodeSpec& s : nodes_) {
    y += "  - {id: " + q(s.id) + ", role: " + role_name(s.role);
    if (!s.parent.empty()) y += ", parent: " + q(s.parent);
    if (s.role == Role::kSite) {
      y += ", weight: " + format_double(s.weight);
    } else {
      y += ", endpoint: " + q(s.endpoint);
      if (s.bind != s.endpoint) y += ", bind: " + q(s.bind);
      if (!s.standby_endpoint.empty()) y += ", standby_endpoint: " + q(s.standby_endpoint);
      if (s.standby_bind != s.standby_endpoint) y += ", standby_bind: " + q(s.standby_bind);
    }
    if (!s.jurisdiction.empty()) y += ", jurisdiction: " + q(s.jurisdiction);
    if (s.k_min != 0) y += ", k_min: " + std::to_string(s.k_min);
    if (!s.tcp_congestion.empty()) y += ", tcp_congestion: " + q(s.tcp_congestion);
    if (s.socket_buffer_bytes) {
      y += ", socket_buffer_bytes: " + std::to_string(*s.socket_buffer_bytes);
    }
    if (s.streams) y += ", streams: " + std::to_string(*s.streams);
    if (s.late_join) y += ", late_join: true";
    if (s.removed) y += ", removed: true";
    if (s.devices) y += ", devices: " + std::to_string(*s.devices);
    if (!s.metrics.empty()) y += ", metrics: " + q(s.metrics);
    if (!s.windows.empty()) {
      std::string list;
      for (const std::string& w : s.windows) list += (list.empty() ? "" : ", ") + q(w);
      y += ", windows: [" + list + "]";
    }
    if (!s.allowed_jurisdictions.empty()) {
      std::string list;
      for (const std::string& a : s.allowed_jurisdictions) {
        list += (list.empty() ? "" : ", ") + q(a);
      }
      y += ", allowed_jurisdictions: [" + list + "]";
    }
    y += "}\n";
  }
  if (signature_) {
    y += "signature:\n  cert: " + q(signature_->cert) + "\n  value: " + q(signature_->value) + "\n";
  }
  return y;
}

}  // namespace fedwan
