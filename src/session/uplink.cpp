#include "session/uplink.hpp"

namespace fedwan::session {

Uplink::Uplink(const Topology& topo, const NodeSpec& self, transport::Transport& transport,
               node::NodeSecurity& security, const ParentSession::Options& options)
    : session_(topo, self, transport, security, options),
      parent_id_(topo.node(self.parent_index).id),
      resend_(options.heartbeat_timeout),
      upload_(topo, self.index) {}

void Uplink::welcomed(uint8_t flags) {
  welcomed_once_ = true;
  keeps_replicas_ = (flags & wire::kFlagKeepsReplicas) != 0;
}

bool Uplink::behind(bool behind) {
  if (!behind) {
    behind_beats_ = 0;
    return false;
  }
  if (++behind_beats_ < 3) return false;
  behind_beats_ = 0;
  return true;
}

void Uplink::record_link_bytes(costs::CostRecorder& costs) {
  costs.sent(parent_id_, session_.bytes_sent() - recorded_sent_);
  costs.received(parent_id_, session_.bytes_received() - recorded_received_);
  recorded_sent_ = session_.bytes_sent();
  recorded_received_ = session_.bytes_received();
}

}  // namespace fedwan::session
