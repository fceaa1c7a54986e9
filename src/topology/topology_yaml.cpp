// Topology::to_yaml: the topology written back out as YAML that parses to
// the same digest (fedwan demo writes its topology with it).
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/topology.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan {

using topology_detail::format_double;

namespace {

// Strings are always double-quoted: an id such as "null" or "1" must stay a string.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// The items quoted and comma-separated: what goes between a flow sequence's [ ].
std::string quoted_list(const std::vector<std::string>& items) {
  std::string list;
  for (const std::string& item : items) list += (list.empty() ? "" : ", ") + quoted(item);
  return list;
}

// "{...}" with what differs from `base` ("" when nothing does), reading
// back to `a` when applied over `base`: a node's keys apply over the
// federation's, the federation's over the defaults.
std::string aggregation_flow(const AggregationSpec& a, const AggregationSpec& base) {
  std::vector<std::string> items;
  if (a.rule != base.rule) items.push_back("rule: " + quoted(a.rule));
  // A new rule starts with no params; otherwise params differ as a whole.
  if (a.params != (a.rule != base.rule ? std::map<std::string, double>() : base.params)) {
    std::string params;
    for (const auto& [key, value] : a.params) {
      params += (params.empty() ? "" : ", ") + key + ": " + format_double(value);
    }
    items.push_back("params: {" + params + "}");
  }
  if (a.finite_check != base.finite_check) {
    items.push_back(std::string("finite_check: ") + (a.finite_check ? "true" : "false"));
  }
  if (a.max_abs != base.max_abs) items.push_back("max_abs: " + format_double(a.max_abs));
  if (a.replay_window != base.replay_window) {
    items.push_back("replay_window: " + std::to_string(a.replay_window));
  }
  const NormBoundSpec& b = a.norm_bound;
  const NormBoundSpec& d = base.norm_bound;
  std::vector<std::string> bound;
  if (b.mode != d.mode) bound.push_back("mode: " + quoted(b.mode));
  if (b.factor != d.factor) bound.push_back("factor: " + format_double(b.factor));
  if (b.window != d.window) bound.push_back("window: " + std::to_string(b.window));
  if (b.bound != d.bound) bound.push_back("bound: " + format_double(b.bound));
  if (b.action != d.action) bound.push_back("action: " + quoted(b.action));
  std::string joined;
  for (const std::string& item : bound) joined += (joined.empty() ? "" : ", ") + item;
  if (!bound.empty()) items.push_back("norm_bound: {" + joined + "}");
  if (items.empty()) return "";
  joined.clear();
  for (const std::string& item : items) joined += (joined.empty() ? "" : ", ") + item;
  return "{" + joined + "}";
}

std::string aggregation_yaml(const AggregationSpec& a) {
  const std::string flow = aggregation_flow(a, AggregationSpec{});
  return flow.empty() ? "" : "  aggregation: " + flow + "\n";
}

std::string privacy_yaml(const PrivacySpec& p) {
  const PrivacySpec d;
  std::vector<std::string> items;
  if (p.mode != d.mode) items.push_back("mode: " + quoted(p.mode));
  if (p.clip != d.clip) items.push_back("clip: " + format_double(p.clip));
  if (p.noise_multiplier != d.noise_multiplier) {
    items.push_back("noise_multiplier: " + format_double(p.noise_multiplier));
  }
  if (p.target_epsilon != d.target_epsilon) {
    items.push_back("target_epsilon: " + format_double(p.target_epsilon));
  }
  if (p.delta != d.delta) items.push_back("delta: " + format_double(p.delta));
  if (p.epsilon_budget != d.epsilon_budget) {
    items.push_back("epsilon_budget: " + format_double(p.epsilon_budget));
  }
  if (p.target_quantile != d.target_quantile) {
    items.push_back("target_quantile: " + format_double(p.target_quantile));
  }
  if (p.clip_learning_rate != d.clip_learning_rate) {
    items.push_back("clip_learning_rate: " + format_double(p.clip_learning_rate));
  }
  if (p.clip_count_budget != d.clip_count_budget) {
    items.push_back("clip_count_budget: " + format_double(p.clip_count_budget));
  }
  if (items.empty()) return "";
  std::string joined;
  for (const std::string& item : items) joined += (joined.empty() ? "" : ", ") + item;
  return "  privacy: {" + joined + "}\n";
}

std::string federation_yaml(const FederationSpec& f) {
  std::string y = "federation:\n";
  y += "  rounds: " + std::to_string(f.rounds) + "\n";
  y += "  inner_steps: " + std::to_string(f.inner_steps) + "\n";
  y += "  codec: " + quoted(f.codec) + "\n";
  y += "  chunk_bytes: " + std::to_string(f.chunk_bytes) + "\n";
  y += "  round_timeout_s: " + format_double(f.round_timeout_s) + "\n";
  y += "  quorum: " + format_double(f.quorum) + "\n";
  y += "  deadline_s: " + format_double(f.deadline_s) + "\n";
  y += "  heartbeat_s: " + format_double(f.heartbeat_s) + "\n";
  y += "  heartbeat_timeout_s: " + format_double(f.heartbeat_timeout_s) + "\n";
  y += "  replica_every: " + std::to_string(f.replica_every) + "\n";
  y += "  tcp_congestion: " + quoted(f.tcp_congestion) + "\n";
  if (f.overlap_steps != 0) y += "  overlap_steps: " + std::to_string(f.overlap_steps) + "\n";
  if (f.socket_buffer_bytes != 0) {
    y += "  socket_buffer_bytes: " + std::to_string(f.socket_buffer_bytes) + "\n";
  }
  if (f.streams != kStreamsAuto) y += "  streams: " + std::to_string(f.streams) + "\n";
  if (f.max_streams != FederationSpec{}.max_streams) {
    y += "  max_streams: " + std::to_string(f.max_streams) + "\n";
  }
  y += aggregation_yaml(f.aggregation);
  y += privacy_yaml(f.privacy);
  y += "  outer_optimizer: {name: " + quoted(f.outer.name);
  for (const auto& [key, value] : f.outer.params) y += ", " + key + ": " + format_double(value);
  return y + "}\n";
}

// One node as an item of the `nodes:` sequence, on one line.
std::string node_yaml(const NodeSpec& s, const AggregationSpec& federation_aggregation) {
  std::string y = "  - {id: " + quoted(s.id) + ", role: " + role_name(s.role);
  if (!s.parent.empty()) y += ", parent: " + quoted(s.parent);
  if (s.role == Role::kSite) {
    y += ", weight: " + format_double(s.weight);
  } else {
    y += ", endpoint: " + quoted(s.endpoint);
    if (s.bind != s.endpoint) y += ", bind: " + quoted(s.bind);
    if (!s.standby_endpoint.empty()) y += ", standby_endpoint: " + quoted(s.standby_endpoint);
    if (s.standby_bind != s.standby_endpoint) y += ", standby_bind: " + quoted(s.standby_bind);
  }
  if (!s.jurisdiction.empty()) y += ", jurisdiction: " + quoted(s.jurisdiction);
  if (s.k_min != 0) y += ", k_min: " + std::to_string(s.k_min);
  if (!s.tcp_congestion.empty()) y += ", tcp_congestion: " + quoted(s.tcp_congestion);
  if (s.socket_buffer_bytes) {
    y += ", socket_buffer_bytes: " + std::to_string(*s.socket_buffer_bytes);
  }
  if (s.streams) y += ", streams: " + topology_detail::streams_text(*s.streams);
  if (s.max_streams) y += ", max_streams: " + std::to_string(*s.max_streams);
  if (s.late_join) y += ", late_join: true";
  if (s.removed) y += ", removed: true";
  if (s.devices) y += ", devices: " + std::to_string(*s.devices);
  if (!s.metrics.empty()) y += ", metrics: " + quoted(s.metrics);
  if (!s.windows.empty()) y += ", windows: [" + quoted_list(s.windows) + "]";
  if (!s.allowed_jurisdictions.empty()) {
    y += ", allowed_jurisdictions: [" + quoted_list(s.allowed_jurisdictions) + "]";
  }
  if (s.aggregation) {
    // Set only where it differs from the federation's (Topology::finalize).
    y += ", aggregation: " + aggregation_flow(*s.aggregation, federation_aggregation);
  }
  return y + "}\n";
}

}  // namespace

std::string Topology::to_yaml() const {
  std::string y = "# fedwan topology, digest " + digest_hex() + "\n";
  y += "job: " + quoted(job_) + "\n";
  if (version_ > 1) {
    y += "version: " + std::to_string(version_) + "\n";
    y += "history:\n";
    for (const auto& d : history_) y += "  - \"" + to_hex(d.data(), d.size()) + "\"\n";
  }
  y += federation_yaml(federation_);
  if (policy_.k_min != PolicySpec{}.k_min) {
    y += "policy:\n  k_min: " + std::to_string(policy_.k_min) + "\n";
  }
  y += "nodes:\n";
  for (const NodeSpec& s : nodes_) y += node_yaml(s, federation_.aggregation);
  if (signature_) {
    y += "signature:\n  cert: " + quoted(signature_->cert) +
         "\n  value: " + quoted(signature_->value) + "\n";
  }
  return y;
}

}  // namespace fedwan
