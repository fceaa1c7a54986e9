// The root's link to its standby (aggregator/root_role.hpp): every round's
// checkpoint goes there, the standby's acknowledgement releases the round's
// held-back last anchor chunk, and a standby that fences the root ends it.
#include "aggregator/root_role.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "common/stall_clock.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {

bool Aggregator::Impl::RootRole::replicates(uint64_t /*round*/) const {
  // Every round, to the standby that takes over from it.
  return standby_.link != nullptr;
}

bool Aggregator::Impl::RootRole::standby_awaited() const {
  return aggregator::standby_awaited(standby_view(), Clock::now(), n_.cfg_.heartbeat_timeout);
}

void Aggregator::Impl::RootRole::open_standby_link() {
  // The default linger lets the last frame (kDone) reach the standby at the
  // end; a replaced link is abandoned (closed at once).
  if (standby_.link) standby_.link->abandon();
  standby_.link.reset();
  standby_.link = std::make_unique<transport::ParentLink>(*n_.transport_, n_.self_.standby_endpoint,
                                                          n_.self_.id, n_.cfg_.link,
                                                          n_.security_->parent_factory());
  standby_.link_opened = Clock::now();
  standby_.seen = false;
  if (n_.uploading()) n_.start_upload();  // from its first piece, on the new link
}

void Aggregator::Impl::RootRole::standby_missing(const std::string& why) {
  if (standby_.warned) return;
  standby_.warned = true;
  log().warn("[agg:{}] its standby at {}: {}; rounds go on without it (a takeover now would "
             "redo them)",
             n_.self_.id, n_.self_.standby_endpoint, why);
  n_.security_->audit("standby_lost", {{"round", n_.round_}, {"reason", why}});
}

void Aggregator::Impl::RootRole::watch(std::vector<transport::Transport::Interest>* /*interests*/) {
  // The standby link is read at every turn of the loop; its frames are few.
}

void Aggregator::Impl::RootRole::receive(transport::Incoming& in) {
  if (!standby_.link) return;
  try {
    for (int i = 0; i < 16 && standby_.link->recv(&in, Millis(0)); ++i) on_standby_frame(in);
    if (!standby_.seen && standby_.link->established()) {
      // The standby answered the handshake: it is there.
      standby_.heard = Clock::now();
      standby_.seen = true;
      if (standby_.warned) n_.security_->audit("standby_back", {{"round", n_.round_}});
      standby_.warned = false;
    }
  } catch (const CryptoError& e) {
    n_.security_->log_noise("standby-link:" + n_.self_.id,
                            "[agg:" + n_.self_.id + "] link to its standby: " + e.what());
    standby_.seen = false;
    standby_.heard = Clock::time_point{};
  }
}

void Aggregator::Impl::RootRole::on_standby_frame(transport::Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, n_.model_.limits);
  if (!f.ok() || f.header.job_id != n_.topo_.job_id() || f.header.sender != n_.self_.index) {
    log().warn("[agg:{}] dropped a frame from its standby: {}", n_.self_.id,
               f.ok() ? "wrong job or sender" : f.detail);
    return;
  }
  standby_.heard = Clock::now();
  if (!standby_.seen) {
    log().info("[agg:{}] its standby at {} is up", n_.self_.id, standby_.link->endpoint());
    if (standby_.warned) n_.security_->audit("standby_back", {{"round", n_.round_}});
    standby_.seen = true;
    standby_.warned = false;
  }
  switch (f.header.type) {
    case wire::MsgType::kCheckpoint:
      if (f.header.flags == wire::kFlagReplicaStored) {
        standby_.acked = f.header.round;
        if (committed_ && f.header.round >= n_.round_) release_held_back();
      }
      return;
    case wire::MsgType::kReject: {
      const std::string reason(reinterpret_cast<const char*>(f.payload), f.payload_size);
      n_.security_->audit("fenced", {{"reason", reason}});
      throw ProtocolError("root '" + n_.self_.id + "': its standby refused it: " + reason);
    }
    default: return;  // heartbeats
  }
}

void Aggregator::Impl::RootRole::not_listening(Clock::duration d, Clock::time_point now) {
  // Its standby's heartbeats and acknowledgement wait unread meanwhile.
  StallClock::credit(standby_.heard, d, now);
  StallClock::credit(standby_.link_opened, d, now);
  StallClock::credit(held_since_, d, now);
}

void Aggregator::Impl::RootRole::busy_beat() {
  if (!standby_.link || !standby_.link->established()) return;
  wire::FrameHeader h =
      node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kHeartbeat, n_.round_);
  h.flags = wire::kFlagBusy;
  (void)standby_.link->try_send(node::make_frame(h, {}));
}

void Aggregator::Impl::RootRole::heartbeat(Clock::time_point now) {
  if (!standby_.link) return;
  if (standby_.link->established()) {
    wire::FrameHeader h =
        node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kHeartbeat, n_.round_);
    (void)standby_.link->try_send(node::make_frame(h, {}));
  }
  // A standby that went silent (or restarted): start its session over.
  const auto last = std::max(standby_.heard, standby_.link_opened);
  if (now - last > n_.cfg_.heartbeat_timeout) {
    standby_missing("it is not answering");
    open_standby_link();
  }
  if (committed_ && !held_back_.empty() &&
      (!standby_awaited() || now - held_since_ > n_.cfg_.heartbeat_timeout)) {
    standby_missing("it did not confirm the checkpoint of round " + std::to_string(n_.round_));
    release_held_back();
  }
}

}  // namespace fedwan
