// A region's link to its parent (aggregator/region_role.hpp): the child's
// end of the parent protocol (session::Uplink: the session with backoff,
// jitter, standby failover and liveness, the welcome's progress, resends,
// replicas kept, link bytes), the outbox towards the parent, where this
// session's welcome stands, the parent's frames checked and handed to the
// region, hellos, heartbeats with its membership, and its aggregate chunks
// kept for sending again. The region does what the frames mean.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aggregator/aggregator_impl.hpp"

namespace fedwan {

class Aggregator::Impl::RegionLink {
 public:
  RegionLink(Impl& node, RegionRole& region);

  session::Uplink& uplink() { return *uplink_; }

  // Where this session's welcome stands.
  struct Welcome {
    bool welcomed = false;      // the parent welcomed this session
    uint64_t round = 0;         // the round it was welcomed at
    bool full_pending = false;  // the model in full from the parent is arriving
    uint32_t full_chunks = 0;
    double clip = 0;  // adaptive clipping: the welcome round's clip
  } welcome;

  // ---- towards the parent
  void send(std::vector<uint8_t> frame);  // queued, then sent as the window opens
  void send(aggregator::StoredFrame frame);
  bool flush();  // whether nothing waits
  // Frames queued, and one still going out in pieces.
  size_t waiting() const { return out_.size() + (uplink_->session().link().sending() ? 1 : 0); }
  void watch(std::vector<transport::Transport::Interest>* interests);
  void check_stuck(Clock::time_point now) const;  // throws when the parent does not read
  std::string awaited() const;                    // the parent, for a timeout's message
  // Says hello (again): the anchor it holds, so the parent can skip the
  // model in full. A model in full still arriving is abandoned.
  void hello();
  // A new session, then hello; the session's backoff grows unless told not to.
  void reconnect(const std::string& why, bool grow_backoff = true);
  void heartbeat(Clock::time_point now);  // hello again, membership, reconnects
  void busy_beat();                       // writing its checkpoint (wire::kFlagBusy)
  // Its membership to the parent, now if the link takes it, else ahead of
  // anything queued once it does: the parent's quorum must know it before
  // the aggregates whose weight it explains.
  void report_membership();
  void telemetry(uint64_t round, const node::Traffic& t);
  void done();  // this region holds the final model, as its children do
  // This node's checkpoint goes up this round; the link it goes over while
  // nothing of the round protocol waits (null: not now).
  bool replicates(uint64_t round) const;
  transport::ParentLink* replica_link();

  // ---- its aggregate chunks of the open round, kept until the next anchor
  // completes so they can be sent again: those the parent lacks once its
  // progress stalls, or all after it welcomed this region back. On disk for
  // a large model (node/frame_store.hpp).
  void round_opened(uint64_t round);
  void send_aggregate(uint32_t chunk, Frame frame);
  void send_aggregates_again();

  // ---- from the parent: a batch of frames, each checked, then handed to
  // the region.
  void receive(transport::Incoming& in);

 private:
  void on_frame(transport::Incoming& in);
  void on_heartbeat(const wire::ParsedFrame& f);
  void resend(const wire::ParsedFrame& f);  // a need-update heartbeat
  // Welcomed, and its children welcomed in turn: a membership report is true.
  bool membership_settled() const;

  Impl& n_;
  RegionRole& region_;
  std::unique_ptr<session::Uplink> uplink_;
  Outbox out_;
  // A membership report the link did not take yet: it goes before the
  // outbox.
  bool membership_due_ = false;
  // The round whose aggregates a report went ahead of (none yet on this
  // session): each round's first aggregate follows one, so a parent that
  // restarted with older weights never judges the round by them.
  std::optional<uint64_t> reported_round_;
  std::map<uint32_t, aggregator::StoredFrame> sent_up_;  // by chunk
  aggregator::FrameStore store_;                         // where sent_up_ lies
};

}  // namespace fedwan
