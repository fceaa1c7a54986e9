// The canonical text a topology's digest is taken of (one line per field,
// keys sorted, nodes in index order) and the job id: what every node must
// agree on, byte for byte.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan::topology_detail {

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
    c += "federation.streams=" + streams_text(f.streams) + "\n";
  }
  if (f.max_streams != defaults.max_streams) {
    c += "federation.max_streams=" + std::to_string(f.max_streams) + "\n";
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
  if (s.streams) line += " streams=" + streams_text(*s.streams);
  if (s.max_streams) line += " max_streams=" + std::to_string(*s.max_streams);
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
