#include "session/parent_session.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "node/node_frames.hpp"

namespace fedwan::session {

ParentSession::ParentSession(const Topology& topo, const NodeSpec& self,
                             transport::Transport& transport, node::NodeSecurity& security,
                             Options options)
    : topo_(topo),
      self_(self),
      parent_(topo.node(self.parent_index)),
      transport_(transport),
      security_(security),
      options_(std::move(options)),
      turns_(options_.heartbeat) {
  open(options_.link.linger_ms);
  heard_ = Clock::now();
}

const std::string& ParentSession::endpoint() const {
  return use_standby_ ? parent_.standby_endpoint : parent_.endpoint;
}

void ParentSession::open(int linger_ms) {
  transport::LinkOptions lo = options_.link;
  lo.linger_ms = linger_ms;
  // A replaced link must not keep reconnecting under this node's routing id
  // (the parent would hand the id back and forth between two sockets).
  if (link_) {
    link_->abandon();
    retired_sent_ += link_->counters().bytes_sent;
    retired_received_ += link_->counters().bytes_received;
  }
  link_.reset();
  link_ = std::make_unique<transport::ParentLink>(transport_, endpoint(), self_.id, lo,
                                                  security_.parent_factory());
  opened_at_ = Clock::now();
}

void ParentSession::reconnect(const std::string& why, uint64_t round, bool grow_backoff) {
  if (grow_backoff || backoff_.count() == 0) {
    backoff_ =
        backoff_.count() == 0 ? options_.heartbeat : std::min<Millis>(backoff_ * 2, Millis(30000));
  }
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  const auto wait = Millis(static_cast<int64_t>(backoff_.count() * jitter(rng_)));
  retry_at_ = Clock::now() + wait;
  // Under a root with a standby, every other try goes to the standby.
  if (!parent_.standby_endpoint.empty()) use_standby_ = !use_standby_;
  log().warn("[{}] reconnecting to parent '{}' at {} ({}); next try in {} ms", options_.log_name,
             parent_.id, endpoint(), why, wait.count());
  security_.audit(
      "reconnect",
      {{"peer", parent_.id}, {"endpoint", endpoint()}, {"reason", why}, {"round", round}});
  reconnects_ += 1;
  open(options_.reconnect_linger_ms);
}

void ParentSession::heard(Clock::time_point now, bool reset_backoff) {
  heard_ = now;
  last_frame_at_ = now;
  if (reset_backoff) backoff_ = Millis(0);
}

bool ParentSession::told_no_session() const {
  // Said after the parent's last frame: a parent that spoke since holds
  // the session, whatever anyone said before.
  const auto said = link_->security().peer_without_session();
  return said && *said > last_frame_at_;
}

ParentSession::Clock::duration ParentSession::silence_limit() const {
  if (!told_no_session()) return options_.heartbeat_timeout;
  return std::min<Clock::duration>(2 * options_.heartbeat, options_.heartbeat_timeout);
}

std::string ParentSession::silence(Clock::time_point now) const {
  const auto ms = std::chrono::duration_cast<Millis>(now - heard_).count();
  if (told_no_session() && now - heard_ <= options_.heartbeat_timeout) {
    return "no frame from it for " + std::to_string(ms) +
           " ms, and its end says it holds no session with this node (as after a restart)";
  }
  return "no frame from it for " + std::to_string(options_.heartbeat_timeout.count()) + " ms";
}

void ParentSession::not_listening(Clock::duration d, Clock::time_point now) {
  StallClock::credit(heard_, d, now);
  StallClock::credit(opened_at_, d, now);
  turns_.reset(now);
}

ParentSession::Clock::duration ParentSession::turn(Clock::time_point now) {
  const Clock::duration away = turns_.tick(now);
  // Judged lost by its parent, it is not credited: rejoining at once beats
  // waiting another timeout to find that out.
  if (away > Clock::duration::zero() && !judged_lost_after(away, now)) {
    StallClock::credit(heard_, away, now);
    StallClock::credit(opened_at_, away, now);
  }
  return away;
}

bool ParentSession::heartbeat(uint64_t round, uint8_t flags, const std::vector<uint8_t>& payload) {
  if (!link_->established()) return false;
  wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kHeartbeat, round);
  h.flags = flags;
  if (!link_->try_send(node::make_frame(h, payload)).has_value()) return false;
  spoke(Clock::now());
  return true;
}

}  // namespace fedwan::session
