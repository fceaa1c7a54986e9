#include "node/node_config.hpp"

#include <algorithm>
#include <string>

#include "fedwan/error.hpp"
#include "topology/aggregation_settings.hpp"
#include "topology/privacy_settings.hpp"

namespace fedwan::node {
namespace {

Millis millis(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000)); }

}  // namespace

aggregation::ScreenConfig screen_config(const AggregationSpec& a) {
  if (auto why = topology::aggregation_problem(a)) {
    throw ConfigError("federation.aggregation: " + *why);
  }
  using Norm = aggregation::ScreenConfig::Norm;
  aggregation::ScreenConfig c;
  c.finite_check = a.finite_check;
  c.max_abs = a.max_abs;
  c.replay_window = static_cast<uint32_t>(a.replay_window);
  const NormBoundSpec& b = a.norm_bound;
  c.norm = b.mode == "adaptive"   ? Norm::kAdaptive
           : b.mode == "absolute" ? Norm::kAbsolute
                                  : Norm::kOff;
  c.factor = b.factor;
  c.window = static_cast<uint32_t>(b.window);
  c.bound = b.bound;
  c.clip = b.action == "clip";
  return c;
}

int64_t max_message_bytes(uint64_t chunk_bytes) {
  // The largest payloads, a full anchor's fp32 chunk and a checkpoint
  // piece, are chunk_bytes. The slack holds a sealed frame's trailer
  // (security::kSealTrailer) and, when chunk_bytes is near its 4 KiB
  // minimum, a control frame's payload (wire::FrameLimits).
  constexpr uint64_t kSlack = 4096;
  return static_cast<int64_t>(wire::kHeaderSize + chunk_bytes + kSlack);
}

NodeConfig::NodeConfig(const Topology& topology, const NodeSpec& self,
                       const NodeOverrides& overrides) {
  const FederationSpec& fed = topology.federation();
  codec = &codec_by_name(fed.codec);
  chunk_bytes = fed.chunk_bytes;
  rounds = topology::rounds_run(fed);
  privacy.mode = fed.privacy.mode == "central" ? Privacy::Mode::kCentral
                 : fed.privacy.mode == "local" ? Privacy::Mode::kLocal
                                               : Privacy::Mode::kOff;
  if (privacy.on()) {
    privacy.clip = fed.privacy.clip;
    privacy.noise_multiplier = topology::privacy_noise_multiplier(fed);
    privacy.update_noise_multiplier = topology::update_noise_multiplier(fed);
    privacy.count_noise_multiplier = topology::count_noise_multiplier(fed);
    privacy.target_quantile = fed.privacy.target_quantile;
    privacy.clip_learning_rate = fed.privacy.clip_learning_rate;
    privacy.delta = fed.privacy.delta;
    privacy.epsilon_budget = fed.privacy.epsilon_budget;
  }
  privacy.topology_rounds = fed.rounds;
  inner_steps = fed.inner_steps;
  quorum = fed.quorum;
  replica_every = fed.replica_every;
  outer = fed.outer;
  // An aggregator's own settings where it has them (sites screen nothing).
  const AggregationSpec& judged = topology.aggregation(self);
  rule = aggregation::make_rule(judged.rule, judged.params);
  screen = screen_config(judged);
  limits.max_chunk_elements = static_cast<uint32_t>(chunk_bytes / sizeof(float));
  limits.max_piece_bytes = piece_bytes();
  link.window = overrides.window;
  link.max_message_bytes = max_message_bytes(chunk_bytes);
  // The node's own setting governs what it sends; "system" leaves the host's.
  const std::string& congestion =
      self.tcp_congestion.empty() ? fed.tcp_congestion : self.tcp_congestion;
  link.tcp_congestion = congestion == "system" ? std::string() : congestion;
  link.socket_buffer_bytes =
      static_cast<int>(self.socket_buffer_bytes.value_or(fed.socket_buffer_bytes));
  // The connections this node opens to its parent (the root has none: its
  // link to a standby is one connection).
  const Topology::UplinkStreams up = topology.uplink_streams(self);
  link.streams = static_cast<int>(up.connections);
  link.adaptive_streams = up.adaptive;
  link.reorder_wait_ms = static_cast<int>(std::max(1000.0, fed.heartbeat_timeout_s * 500));
  round_timeout = overrides.round_timeout.value_or(millis(fed.round_timeout_s));
  heartbeat = millis(fed.heartbeat_s);
  heartbeat_timeout = millis(fed.heartbeat_timeout_s);
  if (fed.deadline_s > 0) {
    const double share = self.role == Role::kRoot ? 1.0 : 0.8;
    round_deadline = millis(fed.deadline_s * share);
  }
  finish_wait = std::min<Millis>(round_timeout, Millis(30000));
}

wire::FrameLimits NodeConfig::limits_for_model(uint64_t total_elements) const {
  wire::FrameLimits l = limits;
  l.max_total_elements = total_elements;
  l.max_checkpoint_bytes = checkpoint_max_bytes(total_elements);
  return l;
}

uint64_t checkpoint_max_bytes(uint64_t total_elements) {
  constexpr uint64_t kPerElement = sizeof(float) * kCheckpointModels;
  if (total_elements > (UINT64_MAX - kCheckpointSlackBytes) / kPerElement) return UINT64_MAX;
  return total_elements * kPerElement + kCheckpointSlackBytes;
}

}  // namespace fedwan::node
