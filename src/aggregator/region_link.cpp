// A region's link to its parent (aggregator/region_link.hpp).
#include "aggregator/region_link.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aggregator/region_role.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "security/noise_filter.hpp"

namespace fedwan {

Aggregator::Impl::RegionLink::RegionLink(Impl& node, RegionRole& region)
    : n_(node),
      region_(region),
      store_(false, n_.opt_.checkpoint_dir, "agg:" + n_.self_.id, "aggregate") {
  session::ParentSession::Options so;
  so.link = n_.cfg_.link;
  so.heartbeat = n_.cfg_.heartbeat;
  so.heartbeat_timeout = n_.cfg_.heartbeat_timeout;
  // A replaced session's queued frames are dropped: what matters is sent
  // again on the new one (hello, aggregates, checkpoint pieces).
  so.reconnect_linger_ms = 0;
  so.log_name = "agg:" + n_.self_.id;
  uplink_ =
      std::make_unique<session::Uplink>(n_.topo_, n_.self_, *n_.transport_, *n_.security_, so);
}

// ---- towards the parent ----------------------------------------------------------

void Aggregator::Impl::RegionLink::send(std::vector<uint8_t> frame) {
  send(aggregator::StoredFrame(std::make_shared<const std::vector<uint8_t>>(std::move(frame))));
}

void Aggregator::Impl::RegionLink::send(aggregator::StoredFrame frame) {
  out_.push({std::move(frame), wire::FrameHeader{}, nullptr}, Clock::now());
  n_.flush();
}

bool Aggregator::Impl::RegionLink::flush() {
  // What is left of a frame going out in pieces first.
  (void)uplink_->link().flush();
  // A membership report first: the aggregates queued behind it carry the
  // weight it explains (a site that left is missing from them).
  if (membership_due_) report_membership();
  while (!out_.empty() && !(membership_due_ && membership_settled())) {
    if (!uplink_->link().established()) break;
    aggregator::Outgoing& head = out_.front();
    if (!head.loaded) head.loaded = head.frame.load();  // read once, however long it waits
    if (!uplink_->link().try_send(*head.loaded)) break;
    out_.pop(Clock::now());
  }
  // More connections and nothing left to send on them: a heartbeat shows
  // the parent the newest now, before the next anchor goes down.
  if (out_.empty() && uplink_->link().announcing()) {
    if (membership_settled()) {
      report_membership();
    } else {
      (void)uplink_->session().heartbeat(n_.round_);
    }
  }
  return out_.empty();
}

void Aggregator::Impl::RegionLink::watch(std::vector<transport::Transport::Interest>* interests) {
  uplink_->link().watch(interests, !out_.empty());
}

void Aggregator::Impl::RegionLink::check_stuck(Clock::time_point now) const {
  if (out_.stuck(now, n_.cfg_.round_timeout)) {
    throw TimeoutError("aggregator '" + n_.self_.id + "': parent '" +
                       n_.topo_.node(n_.self_.parent_index).id + "' has not read for " +
                       std::to_string(n_.cfg_.round_timeout.count() / 1000) + " s");
  }
}

std::string Aggregator::Impl::RegionLink::awaited() const {
  return "parent '" + n_.topo_.node(n_.self_.parent_index).id + "' at " +
         uplink_->session().endpoint();
}

void Aggregator::Impl::RegionLink::hello() {
  welcome.full_pending = false;
  reported_round_.reset();  // the welcome that answers may be a restarted parent's
  wire::HelloPayload up;
  up.node_id = n_.self_.id;
  // The version it started from: the parent knew that one when it started.
  up.topology_digest = n_.watch_.start_digest;
  if (const auto digest = region_.held_digest()) up.model_digest = *digest;
  wire::FrameHeader h =
      node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kHello, n_.round_);
  h.total_elements = n_.model_.elements;
  if (n_.phase_ == Phase::kAwaitAnchor) h.flags = wire::kFlagSent;
  send(node::make_frame(h, wire::encode_hello(up)));
  welcome.welcomed = false;
  uplink_->progressed(Clock::now());
}

void Aggregator::Impl::RegionLink::reconnect(const std::string& why, bool grow_backoff) {
  // Backoff, jitter, standby failover, the log line and the audit entry
  // are the session's; what was queued for the old one goes again as the
  // new session needs it.
  out_.clear();
  membership_due_ = false;  // the new session's welcome decides when it is told
  reported_round_.reset();
  uplink_->session().reconnect(why, n_.round_, grow_backoff);
  welcome.welcomed = false;
  welcome.full_pending = false;
  n_.restart_upload();  // from its first piece, on the new session
  if (n_.phase_ != Phase::kJoining) hello();
}

void Aggregator::Impl::RegionLink::busy_beat() {
  // Only to a parent that knows this region: before its welcome a region
  // has nothing to keep alive (and says hello as it must).
  if (uplink_->in_federation()) (void)uplink_->session().heartbeat(n_.round_, wire::kFlagBusy);
}

void Aggregator::Impl::RegionLink::heartbeat(Clock::time_point now) {
  session::ParentSession& parent = uplink_->session();
  // A hello, welcome or piece of the full model lost on a bad link: without
  // progress for a heartbeat timeout, ask again.
  if ((uplink_->in_federation() || n_.phase_ == Phase::kAwaitWelcome) &&
      (!welcome.welcomed || welcome.full_pending) && uplink_->hello_overdue(now)) {
    log().info("[agg:{}] no answer to its hello from the parent; saying hello again", n_.self_.id);
    uplink_->progressed(now);
    hello();
  }
  // Once welcomed, every heartbeat carries this region's membership, so the
  // parent's quorum follows it even when a report on a change was lost.
  if (membership_settled()) {
    report_membership();
  } else {
    parent.heartbeat(n_.round_);
  }
  // Said hello, not welcomed yet, and this session came up without a word
  // from the other end: it may be the root's passive standby (reached after
  // the root's session did not come up in time). Try the other end.
  if (!uplink_->in_federation() && n_.phase_ == Phase::kAwaitWelcome && parent.up_but_mute(now) &&
      parent.retry_due(now)) {
    reconnect("its session came up but the parent sent nothing for " +
                  std::to_string((3 * n_.cfg_.heartbeat_timeout).count()) + " ms",
              /*grow_backoff=*/false);
    return;
  }
  // A secure session that does not come up (a handshake message lost):
  // start over.
  if (parent.stalled(now) && parent.retry_due(now) && n_.phase_ != Phase::kJoining) {
    reconnect("its secure session did not come up within " +
              std::to_string(n_.cfg_.heartbeat_timeout.count()) + " ms");
    return;
  }
  // Before its first answer the parent is judged by the join timeout.
  if (uplink_->in_federation() && parent.silent(now) && parent.retry_due(now)) {
    reconnect(parent.silence(now));
  }
}

bool Aggregator::Impl::RegionLink::membership_settled() const {
  // Welcomed, and its children welcomed in turn: while the model in full is
  // on its way (its first join, a resync) they are not, and a report then
  // would tell the parent "no member" for a moment (weight 0: not waited
  // for, and a round of the parent's could close without it).
  return welcome.welcomed && !welcome.full_pending && n_.phase_ != Phase::kJoining &&
         n_.phase_ != Phase::kAwaitWelcome;
}

void Aggregator::Impl::RegionLink::report_membership() {
  if (!membership_settled()) return;
  wire::MembershipPayload p;
  p.weight = n_.member_weight();
  p.sites = n_.member_sites();
  reported_round_ = n_.round_;
  // A heartbeat is never queued; a report the link cannot take now stays
  // due (flush), so no aggregate overtakes it.
  membership_due_ =
      !uplink_->session().heartbeat(n_.round_, wire::kFlagMembership, wire::encode_membership(p));
}

void Aggregator::Impl::RegionLink::telemetry(uint64_t round, const node::Traffic& t) {
  wire::TelemetryPayload p{t.wan_bytes, t.fp32_bytes, t.frames};
  send(node::make_frame(
      node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kTelemetry, round),
      wire::encode_telemetry(p)));
}

void Aggregator::Impl::RegionLink::done() {
  send(node::make_frame(
      node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kDone, n_.cfg_.rounds), {}));
}

bool Aggregator::Impl::RegionLink::replicates(uint64_t round) const {
  // Every replica_every rounds, to a parent that keeps them.
  const uint64_t every = n_.cfg_.replica_every;
  return uplink_->parent_keeps_replicas() && every > 0 && round % every == 0;
}

transport::ParentLink* Aggregator::Impl::RegionLink::replica_link() {
  // Behind everything of the round protocol.
  if (!out_.empty() || !welcome.welcomed || welcome.full_pending) return nullptr;
  return &uplink_->link();
}

// ---- its aggregates ------------------------------------------------------------------

void Aggregator::Impl::RegionLink::round_opened(uint64_t round) {
  sent_up_.clear();
  store_.rotate(n_.spills());  // the frames still queued keep the old file
  uplink_->resend().begin(round, Clock::now());
}

void Aggregator::Impl::RegionLink::send_aggregate(uint32_t chunk, Frame frame) {
  // Its weight in the round goes before the round's first aggregate, however
  // this session was welcomed (a parent that restarted knows only the
  // weights of its last checkpoint).
  if (reported_round_ != n_.round_) report_membership();
  const aggregator::StoredFrame& kept = sent_up_[chunk] = store_.keep(std::move(frame));
  uplink_->resend().handed_over(Clock::now());
  send(kept);
}

void Aggregator::Impl::RegionLink::send_aggregates_again() {
  for (const auto& [chunk, frame] : sent_up_) send(frame);
}

void Aggregator::Impl::RegionLink::resend(const wire::ParsedFrame& f) {
  if (!n_.model_.plan) return;
  wire::NeedUpdatePayload need;
  if (!wire::decode_need_update(f.payload, f.payload_size, n_.model_.plan->count(), &need)) {
    n_.summary_.rejected_frames += 1;
    n_.security_->log_noise("need-update:parent",
                            "[agg:" + n_.self_.id + "] dropped a malformed need-update heartbeat");
    return;
  }
  uint32_t chunks = 0;
  for (uint32_t chunk : uplink_->resend().on_need(n_.round_, need, Clock::now())) {
    auto it = sent_up_.find(chunk);
    if (it == sent_up_.end()) continue;  // not complete here yet
    n_.summary_.resent_bytes += it->second.size();
    send(it->second);
    chunks += 1;
  }
  if (chunks > 0) {
    n_.summary_.resent_chunks += chunks;
    log().info("[agg:{}] parent lacks {} chunk(s) of round {} and receives nothing more; "
               "sending them again",
               n_.self_.id, chunks, n_.round_);
  }
}

// ---- from the parent -------------------------------------------------------------------

void Aggregator::Impl::RegionLink::receive(transport::Incoming& in) {
  try {
    for (int i = 0; i < 64 && n_.phase_ != Phase::kDone && uplink_->link().recv(&in, Millis(0));
         ++i) {
      on_frame(in);
    }
  } catch (const CryptoError& e) {
    // See SiteCore::Impl::pump: a session failure anyone on the path can
    // cause, or a re-handshake after the first welcome, is retried with
    // backoff; a real refusal ends in the round timeout. A parent that
    // proved who it is and is the wrong one ends the first join at once.
    if (!uplink_->in_federation() && uplink_->link().security().failure_is_final()) throw;
    n_.security_->log_noise("parent-link:" + n_.self_.id,
                            "[agg:" + n_.self_.id + "] " + e.what() + "; will reconnect");
    uplink_->session().forget_heard();
    if (!uplink_->in_federation()) uplink_->session().restart_stall_clock();  // a new session soon
  }
}

void Aggregator::Impl::RegionLink::on_frame(transport::Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, n_.model_.limits);
  if (!f.ok()) {
    n_.summary_.rejected_frames += 1;
    n_.security_->log_noise(security::noise_key("malformed:parent", f.detail),
                            "[agg:" + n_.self_.id + "] dropped malformed frame from parent: " +
                                wire::reject_reason_name(f.reject) + " (" + f.detail + ")");
    return;
  }
  if (f.header.job_id != n_.topo_.job_id() || f.header.sender != n_.self_.parent_index) {
    n_.summary_.rejected_frames += 1;
    n_.security_->log_noise("wrong-sender:parent", "[agg:" + n_.self_.id +
                                                       "] dropped frame with wrong job or sender "
                                                       "from parent");
    return;
  }
  uplink_->session().heard(Clock::now());
  const std::string parent = n_.topo_.node(n_.self_.parent_index).id;
  switch (f.header.type) {
    case wire::MsgType::kHeartbeat: on_heartbeat(f); break;
    case wire::MsgType::kWelcome: region_.on_parent_welcome(f); break;
    case wire::MsgType::kAnchor: region_.on_parent_anchor(f, in.data(), in.frame_size); break;
    case wire::MsgType::kCheckpoint: break;  // the parent acknowledging a replica
    case wire::MsgType::kReject: {
      std::string why = "parent '" + parent + "' refused '" + n_.self_.id + "': ";
      why.append(reinterpret_cast<const char*>(f.payload), f.payload_size);
      for (const Child& c : n_.down_.children) n_.refuse(c.id, why, false);
      throw ProtocolError(why);
    }
    case wire::MsgType::kDone: region_.on_parent_done(f.header.round); break;
    default:
      n_.summary_.rejected_frames += 1;
      n_.security_->log_noise(std::string("unexpected:parent:") +
                                  wire::msg_type_name(f.header.type),
                              "[agg:" + n_.self_.id + "] unexpected " +
                                  wire::msg_type_name(f.header.type) + " from parent");
  }
}

void Aggregator::Impl::RegionLink::on_heartbeat(const wire::ParsedFrame& f) {
  // The parent writes its checkpoint (the anchor's last chunk waits for
  // it): alive, and nothing of this round was lost.
  if (f.header.flags & wire::kFlagBusy) {
    (void)uplink_->behind(false);
    return;
  }
  // The parent's round still lacks part of this region's aggregate (frames
  // lost to a restart or a bad link): send again what it names once its
  // progress stalled; duplicates count once.
  if ((f.header.flags & wire::kFlagNeedUpdate) && f.header.round == n_.round_ &&
      !sent_up_.empty()) {
    resend(f);
  }
  // Anchor chunks were lost: the parent moved past the round whose anchor
  // this node still waits for (round_ + 1), or is in it and nothing came
  // for a heartbeat timeout. Rejoin to be resynced. (The parent being in
  // that round while its anchor arrives is normal.) A region that relayed
  // the final anchor whole holds it, whatever its parent's round: it waits
  // for the end (said again until confirmed).
  if (uplink_->behind(welcome.welcomed && !welcome.full_pending &&
                      n_.phase_ == Phase::kAwaitAnchor &&
                      n_.book_.relayed_through() < f.header.round &&
                      (f.header.round > n_.round_ + 1 || (f.header.round == n_.round_ + 1 &&
                                                          region_.anchor_stalled(Clock::now()))))) {
    log().warn("[agg:{}] parent is at round {} while this node waits for the anchor of "
               "round {}; rejoining",
               n_.self_.id, f.header.round, n_.round_ + 1);
    hello();
  }
}

}  // namespace fedwan
