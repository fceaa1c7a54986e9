// The child's end of the parent protocol, the same for a site and a region
// aggregator: the session (ParentSession: the link, reconnects with backoff
// and standby failover, liveness, heartbeats), where the hello/welcome
// exchange stands (its progress clock, whether the parent knows this node,
// whether it keeps replicas), the update sent again on the parent's word
// (UpdateResend), this node's checkpoint going up (CheckpointUpload), the
// parent's heartbeats showing it ahead of this node, and the link bytes not
// yet in a cost record. What a hello says, what a welcome means and what
// goes up stay with the role (site/, aggregator/). Not thread safe: the
// node's loop thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint_upload.hpp"
#include "costs/cost_recorder.hpp"
#include "session/parent_session.hpp"
#include "session/update_resend.hpp"

namespace fedwan::session {

class Uplink {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens the first link to the parent (ParentSession's constructor).
  Uplink(const Topology& topo, const NodeSpec& self, transport::Transport& transport,
         node::NodeSecurity& security, const ParentSession::Options& options);

  ParentSession& session() { return session_; }
  const ParentSession& session() const { return session_; }
  transport::ParentLink& link() { return session_.link(); }
  UpdateResend& resend() { return resend_; }
  checkpoint::CheckpointUpload& upload() { return upload_; }
  const std::string& parent_id() const { return parent_id_; }

  // The hello/welcome exchange advanced: a hello went, a welcome or a piece
  // of the model in full came.
  void progressed(Clock::time_point now) { progress_at_ = now; }
  // Nothing advanced it for a heartbeat timeout: a hello, welcome or piece
  // of the model was lost on the way, and the node says hello again.
  bool hello_overdue(Clock::time_point now) const {
    return now - progress_at_ > session_.options().heartbeat_timeout;
  }
  // A welcome came with `flags`: the parent knows this node (its silence is
  // judged from now on) and says whether it keeps replicas of it.
  void welcomed(uint8_t flags);
  // Resumed from a checkpoint: in the federation before any welcome.
  void resumed() { resumed_ = true; }
  bool welcomed_once() const { return welcomed_once_; }
  // Welcomed once or resumed: the parent's silence means it is lost.
  bool in_federation() const { return welcomed_once_ || resumed_; }
  bool parent_keeps_replicas() const { return keeps_replicas_; }

  // One heartbeat from the parent, `behind` when it shows the parent past
  // an anchor this node still lacks. True on the third such heartbeat in a
  // row (the node rejoins to be resynced; the count starts over).
  bool behind(bool behind);

  // Adds to `costs` the bytes on the link since the last call, under the
  // parent's id.
  void record_link_bytes(costs::CostRecorder& costs);

 private:
  ParentSession session_;
  std::string parent_id_;
  UpdateResend resend_;
  checkpoint::CheckpointUpload upload_;
  Clock::time_point progress_at_;
  bool welcomed_once_ = false;
  bool resumed_ = false;
  bool keeps_replicas_ = false;
  int behind_beats_ = 0;
  uint64_t recorded_sent_ = 0, recorded_received_ = 0;
};

}  // namespace fedwan::session
