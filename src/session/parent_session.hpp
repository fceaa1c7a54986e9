// A child's session with its parent, the same for a site and a region
// aggregator: the link to the parent (over the node's transport), opening it
// again after a failure with exponential backoff and jitter, trying the
// root's standby every other time when the parent has one, judging the
// parent's liveness by what is heard from it, and heartbeats. Owned by
// session::Uplink, the rest of the child's end of the protocol. Not thread
// safe: the node's loop thread owns it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/stall_clock.hpp"
#include "fedwan/topology.hpp"
#include "node/node_security.hpp"
#include "transport/links.hpp"
#include "transport/transport.hpp"

namespace fedwan::session {

using transport::Millis;

class ParentSession {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    transport::LinkOptions link;      // window and frame limit of the link
    Millis heartbeat{2000};           // heartbeat period, and the first backoff step
    Millis heartbeat_timeout{10000};  // silence after which the parent is lost
    // Linger of links opened by reconnect() (the first link keeps
    // link.linger_ms): 0 drops what a replaced session still queued.
    int reconnect_linger_ms = 5000;
    std::string log_name;  // e.g. "site:a", in log lines
  };

  // Opens the first link to the parent's endpoint.
  ParentSession(const Topology& topo, const NodeSpec& self, transport::Transport& transport,
                node::NodeSecurity& security, Options options);

  transport::ParentLink& link() { return *link_; }
  const transport::ParentLink& link() const { return *link_; }
  // The endpoint the link uses now: the parent's, or after a failover its
  // standby's.
  const std::string& endpoint() const;
  Clock::time_point opened_at() const { return opened_at_; }

  // Replaces the link after `why` (logged and audited as "reconnect") and
  // schedules the next attempt: 0.5..1.5 x a step that doubles from the
  // heartbeat period up to 30 s (`grow_backoff` false keeps the step: a
  // session that merely did not come up is retried at a steady pace).
  void reconnect(const std::string& why, uint64_t round, bool grow_backoff = true);
  bool retry_due(Clock::time_point now) const { return now >= retry_at_; }
  uint64_t reconnects() const { return reconnects_; }

  // A valid frame from the parent: it is alive, and a later failure starts
  // the backoff over (when `reset_backoff`).
  void heard(Clock::time_point now, bool reset_backoff = true);
  // Judge the parent as silent from now on (its session failed).
  void forget_heard() { heard_ = Clock::time_point{}; }
  // This node did not listen for `d` until `now` (it wrote a checkpoint, or
  // its loop was away): the parent's silence meanwhile does not count, nor
  // does a handshake's. The next turn() counts from `now`.
  void not_listening(Clock::duration d, Clock::time_point now = Clock::now());
  // One turn of the owner's loop at `now` (a site calls it each time it
  // looks at its link): a turn later than two heartbeat periods means the
  // loop was away (a caller that trained without servicing the site, a
  // long encode); that time, less the period, is returned (zero when on
  // time) and credited as above unless judged_lost_after() it.
  Clock::duration turn(Clock::time_point now);
  // After a turn `away` that late, at `now`, the owner had sent nothing for
  // a heartbeat timeout or more (it sends only as its loop turns, and its
  // busy heartbeats from long work: the last it sent, see spoke()): its
  // parent has judged it lost, and it rejoins.
  bool judged_lost_after(Clock::duration away, Clock::time_point now) const {
    if (away <= Clock::duration::zero()) return false;
    const Clock::duration unheard = std::min(away + options_.heartbeat, now - spoke_);
    return unheard >= options_.heartbeat_timeout;
  }
  // A heartbeat went to the parent at `now` (heartbeat() says so itself).
  void spoke(Clock::time_point now) { spoke_ = std::max(spoke_, now); }
  Clock::time_point last_spoke() const { return spoke_; }
  Clock::time_point last_heard() const { return heard_; }
  // Bytes on the wire to and from the parent since the session began, over
  // every link it opened (checkpoint pieces, heartbeats, handshakes
  // included). Not thread safe: read by the thread that owns the link.
  uint64_t bytes_sent() const { return retired_sent_ + link_->counters().bytes_sent; }
  uint64_t bytes_received() const { return retired_received_ + link_->counters().bytes_received; }
  // Nothing heard from the parent for a heartbeat timeout; or for two
  // heartbeat periods since its end said it holds no session with this node
  // (ChannelSecurity::peer_without_session: it restarted). That word is not
  // authenticated, so it never ends a session whose parent still speaks.
  bool silent(Clock::time_point now) const { return now - heard_ > silence_limit(); }
  // Why silent() holds, for the reconnect's log line and audit entry.
  std::string silence(Clock::time_point now) const;
  // The secure session has not come up within a heartbeat timeout of the
  // link opening (a handshake message lost on the way).
  bool stalled(Clock::time_point now) const {
    return !link_->established() && now - opened_at_ > options_.heartbeat_timeout;
  }
  // Restarts the clock stalled() reads (the first join waits longer).
  void restart_stall_clock() { opened_at_ = Clock::time_point{}; }
  // Under a root with a standby: the session is up, yet nothing came from
  // the parent since the link opened (a heartbeat timeout to come up, then
  // two more). A live parent heartbeats a child that said hello, even before
  // it welcomes it; a passive standby completes TLS, then serves nobody
  // while the root lives. A child whose parent's silence is not judged yet
  // (before its first welcome) reconnects on this: the next session goes to
  // the other end.
  bool up_but_mute(Clock::time_point now) const {
    return !parent_.standby_endpoint.empty() && link_->established() &&
           now - std::max(opened_at_, heard_) > 3 * options_.heartbeat_timeout;
  }

  // Sends a heartbeat of `round` when the session is up and the window has
  // room (never blocks); `flags` and `payload` carry membership
  // (wire::kFlagLeaving, kFlagPausing, kFlagMembership). Whether it went.
  bool heartbeat(uint64_t round, uint8_t flags = 0, const std::vector<uint8_t>& payload = {});

  const Options& options() const { return options_; }

 private:
  void open(int linger_ms);
  Clock::duration silence_limit() const;
  bool told_no_session() const;

  const Topology& topo_;
  const NodeSpec& self_;
  const NodeSpec& parent_;
  transport::Transport& transport_;
  node::NodeSecurity& security_;
  Options options_;
  std::unique_ptr<transport::ParentLink> link_;
  Clock::time_point spoke_{};  // the last heartbeat that went
  bool use_standby_ = false;   // under a root with a standby: failed over
  Clock::time_point opened_at_, heard_, retry_at_;
  Clock::time_point last_frame_at_{};  // the parent's last frame, as heard (never credited)
  StallClock turns_;                   // of turn()
  uint64_t retired_sent_ = 0, retired_received_ = 0;  // of the links replaced
  Millis backoff_{0};
  uint64_t reconnects_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace fedwan::session
