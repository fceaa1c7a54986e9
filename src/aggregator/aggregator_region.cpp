// Aggregator, a region's own steps: a complete chunk of its children's
// mean goes up (residency checked, error feedback for lossy codecs), and its
// side of the link to its parent: the child's end (session::Uplink: the
// session with backoff, jitter, standby failover and liveness, the welcome's
// progress, resends, link bytes), the hello/welcome exchange,
// the parent's frames and the anchor relayed down. The root's counterparts
// are in aggregator_root.cpp.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/child_claims.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "security/noise_filter.hpp"

namespace fedwan {

void Aggregator::Impl::check_residency(uint32_t chunk) const {
  // Residency: an aggregate leaves the region only if it mixes at least
  // k_min sites (every child contributes to every chunk in this protocol;
  // the topology was checked at load, this guards the invariant at run
  // time before anything is sent upward).
  size_t sites = 0;
  for (uint32_t idx : acc_->contributors(chunk)) sites += topo_.sites_under(idx).size();
  const uint32_t k_min = topo_.k_min_for(self_.index);
  if (sites < k_min) {
    const std::string why = "region '" + self_.id + "' would forward an aggregate of " +
                            std::to_string(sites) + " site(s); residency policy requires " +
                            std::to_string(k_min);
    security_->audit("policy_refusal", {{"round", round_}, {"chunk", chunk}, {"reason", why}});
    throw ProtocolError(why);
  }
}

void Aggregator::Impl::region_forward_chunk(uint32_t chunk, ChunkSum& cs) {
  const uint64_t off = plan_->offset(chunk);
  const uint32_t n = plan_->size(chunk);
  std::vector<uint8_t> payload(cfg_.codec->encoded_size(n));
  float* residual = nullptr;
  if (cfg_.codec->id() != CodecId::kFp32) {
    if (region_.residual.empty()) region_.residual.assign(total_elements_, 0.0f);
    residual = region_.residual.data() + off;
  }
  cfg_.codec->encode(cs.mean.data(), n, residual, payload.data());
  const wire::FrameHeader h = chunk_header(topo_, self_.index, wire::MsgType::kDelta, round_,
                                           *plan_, chunk, cfg_.codec->id(), cs.weight);
  auto frame = std::make_shared<const std::vector<uint8_t>>(make_frame(h, payload));
  region_.sent_up[chunk] = frame;
  up_.uplink->resend().handed_over(Clock::now());
  send_parent(std::vector<uint8_t>(*frame));
}

void Aggregator::Impl::region_heartbeat(Clock::time_point now) {
  session::ParentSession& parent = up_.uplink->session();
  // A hello, welcome or piece of the full model lost on a bad link: without
  // progress for a heartbeat timeout, ask again.
  if ((up_.uplink->in_federation() || phase_ == Phase::kAwaitWelcome) &&
      (!up_.welcomed || up_.full_pending) && up_.uplink->hello_overdue(now)) {
    log().info("[agg:{}] no answer to its hello from the parent; saying hello again", self_.id);
    up_.full_pending = false;
    up_.uplink->progressed(now);
    hello_parent();
  }
  // Once welcomed, every heartbeat carries this region's membership, so the
  // parent's quorum follows it even when a report on a change was lost.
  if (membership_settled()) {
    report_membership();
  } else {
    parent.heartbeat(round_);
  }
  // A secure session that does not come up (a handshake message lost):
  // start over.
  if (parent.stalled(now) && parent.retry_due(now) && phase_ != Phase::kJoining) {
    reconnect_parent("its secure session did not come up within " +
                     std::to_string(cfg_.heartbeat_timeout.count()) + " ms");
    return;
  }
  // Before its first answer the parent is judged by the join timeout.
  if (up_.uplink->in_federation() && parent.silent(now) && parent.retry_due(now)) {
    reconnect_parent("no frame from it for " + std::to_string(cfg_.heartbeat_timeout.count()) +
                     " ms");
  }
}

void Aggregator::Impl::on_parent_frame(Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, limits_);
  if (!f.ok()) {
    summary_.rejected_frames += 1;
    security_->log_noise(security::noise_key("malformed:parent", f.detail),
                         "[agg:" + self_.id + "] dropped malformed frame from parent: " +
                             wire::reject_reason_name(f.reject) + " (" + f.detail + ")");
    return;
  }
  if (f.header.job_id != topo_.job_id() || f.header.sender != self_.parent_index) {
    summary_.rejected_frames += 1;
    security_->log_noise("wrong-sender:parent", "[agg:" + self_.id +
                                                    "] dropped frame with wrong job or sender "
                                                    "from parent");
    return;
  }
  up_.uplink->session().heard(Clock::now());
  switch (f.header.type) {
    case wire::MsgType::kHeartbeat:
      // The parent's round still lacks part of this region's aggregate
      // (frames lost to a restart or a bad link): send again what it names
      // once its progress stalled; duplicates count once.
      if ((f.header.flags & wire::kFlagNeedUpdate) && f.header.round == round_ &&
          !region_.sent_up.empty()) {
        resend_up(f);
      }
      // Anchor chunks were lost: the parent moved past the round whose
      // anchor this node still waits for (round_ + 1), or is in it and
      // nothing came for a heartbeat timeout. Rejoin to be resynced. (The
      // parent being in that round while its anchor arrives is normal.)
      // A region that relayed the final anchor whole holds it, whatever its
      // parent's round: it waits for the end (said again until confirmed).
      if (up_.uplink->behind(
              up_.welcomed && !up_.full_pending && phase_ == Phase::kAwaitAnchor &&
              book_.relayed_through() < f.header.round &&
              (f.header.round > round_ + 1 ||
               (f.header.round == round_ + 1 &&
                Clock::now() - region_.anchor_progress_at > cfg_.heartbeat_timeout)))) {
        log().warn("[agg:{}] parent is at round {} while this node waits for the anchor of "
                   "round {}; rejoining",
                   self_.id, f.header.round, round_ + 1);
        hello_parent();
      }
      break;
    case wire::MsgType::kWelcome: on_parent_welcome(f); break;
    case wire::MsgType::kAnchor: on_parent_anchor(f, in.data(), in.frame_size); break;
    case wire::MsgType::kCheckpoint: break;  // the parent acknowledging a replica

    case wire::MsgType::kReject: {
      const std::string reason(reinterpret_cast<const char*>(f.payload), f.payload_size);
      for (const Child& c : down_.children) {
        refuse(c.id,
               "parent '" + topo_.node(self_.parent_index).id + "' refused '" + self_.id +
                   "': " + reason,
               false);
      }
      throw ProtocolError("parent '" + topo_.node(self_.parent_index).id + "' refused '" +
                          self_.id + "': " + reason);
    }
    case wire::MsgType::kDone: on_parent_done(f.header.round); break;
    default:
      summary_.rejected_frames += 1;
      security_->log_noise(std::string("unexpected:parent:") + wire::msg_type_name(f.header.type),
                           "[agg:" + self_.id + "] unexpected " +
                               wire::msg_type_name(f.header.type) + " from parent");
  }
}

void Aggregator::Impl::on_parent_done(uint64_t final_round) {
  // Said again by a parent waiting for this region's confirmation.
  if (phase_ == Phase::kDraining || phase_ == Phase::kDone) return;
  if (book_.relayed_through() < final_round) {
    // Chunks of the final anchor were lost on the way: passing the end on
    // would finish the children on a model a chunk short. Rejoin; the
    // draining parent hands the final model over in full (children are
    // welcomed with it) and says the end again.
    if (!up_.welcomed || up_.full_pending) return;  // asked already
    log().warn("[agg:{}] the parent ended the federation at round {} before this node had its "
               "final anchor whole; rejoining for the final model",
               self_.id, final_round);
    hello_parent();
    return;
  }
  // The round of the model it holds, so rejoining children are welcomed at
  // the final round and its heartbeats say it.
  round_ = final_round;
  send_done(final_round);
  region_.done_from_parent = true;
  phase_ = Phase::kDraining;
  phase_deadline_ = Clock::now() + cfg_.round_timeout;
  finish_deadline_ = Clock::now() + cfg_.finish_wait;
  maybe_finish();
}

void Aggregator::Impl::hello_parent() {
  wire::HelloPayload up;
  up.node_id = self_.id;
  // The version it started from: the parent knew that one when it started.
  up.topology_digest = watch_.start_digest;
  // It holds the anchor of its round (its digest was taken when the round
  // opened, before the next anchor's chunks began to change it): the parent
  // can skip the full model and take its update again.
  const bool settled = phase_ != Phase::kJoining && phase_ != Phase::kAwaitWelcome;
  if (region_.anchor.size() == total_elements_ && (settled || region_.holds_initial) &&
      !up_.full_pending) {
    up.model_digest = region_.round_anchor_digest;
  }
  wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kHello, round_);
  h.total_elements = total_elements_;
  if (phase_ == Phase::kAwaitAnchor) h.flags = wire::kFlagSent;
  send_parent(make_frame(h, wire::encode_hello(up)));
  up_.welcomed = false;
  up_.uplink->progressed(Clock::now());
}

void Aggregator::Impl::reconnect_parent(const std::string& why) {
  // Backoff, jitter, standby failover, the log line and the audit entry
  // are the session's; what was queued for the old one goes again as the
  // new session needs it.
  up_.out.clear();
  up_.uplink->session().reconnect(why, round_);
  up_.welcomed = false;
  up_.full_pending = false;
  if (uploading()) start_upload();  // from its first piece, on the new session
  if (phase_ != Phase::kJoining) hello_parent();
}

void Aggregator::Impl::on_parent_welcome(const wire::ParsedFrame& f) {
  if (f.header.total_elements != total_elements_) {
    throw ProtocolError("parent welcomed '" + self_.id + "' with a model of " +
                        std::to_string(f.header.total_elements) + " parameters, children have " +
                        std::to_string(total_elements_));
  }
  up_.welcomed = true;
  up_.uplink->welcomed(f.header.flags);
  up_.welcome_round = f.header.round;
  // Draining, it holds the final model: a welcome after a reconnect asks
  // for nothing (the model in full that may follow is ignored).
  if (phase_ == Phase::kDraining || phase_ == Phase::kDone) return;
  const bool no_change = (f.header.flags & wire::kFlagNoChange) != 0;
  if (phase_ != Phase::kAwaitWelcome && no_change && f.header.round == round_) {
    // Rejoined the parent (it or the link restarted) in the same round: send
    // again what it may have lost; duplicates count once.
    log().info("[agg:{}] parent welcomed it back at round {}", self_.id, round_);
    for (const auto& [chunk, fr] : region_.sent_up) send_parent(std::vector<uint8_t>(*fr));
    return;
  }
  if (no_change) {
    // Only a region that already holds this round's anchor asks without a
    // full anchor (after resuming, or given the initial model); open the
    // round at once.
    region_.holds_initial = false;
    finish_parent_welcome();
    return;
  }
  region_.holds_initial = false;
  // The model follows in full; finish_parent_welcome() runs when it is in.
  up_.full_pending = true;
  up_.full_chunks = 0;
  if (region_.anchor.size() != total_elements_) region_.anchor.assign(total_elements_, 0.0f);
}

void Aggregator::Impl::finish_parent_welcome() {
  const uint64_t round = up_.welcome_round;
  const bool first = phase_ == Phase::kAwaitWelcome;
  log().info("[agg:{}] {} at round {}", self_.id, first ? "joined" : "resynced to the parent",
             round);
  const uint64_t sent_up = round_;
  const bool whole = !first && phase_ == Phase::kAwaitAnchor && sent_up < round;
  book_.relayed_through(round);
  // Its aggregate of the round it took part in went up whole: the traffic
  // report of that round still goes (its parent waits for it), the rounds
  // it missed have none.
  if (whole) try_send_telemetry(sent_up);
  book_.sent_through(round);
  for (Child& c : down_.children) {
    if (!first && c.live) c.rejoin_pending = true;  // they hold an older anchor
  }
  if (round >= cfg_.rounds) {
    // The federation's final model (it rejoined after the last round): no
    // round opens; children are welcomed with it, and the parent's kDone
    // follows.
    round_ = round;
    replaced_anchor_.clear();
    next_anchor_.clear();
    phase_ = Phase::kAwaitAnchor;
  } else {
    open_round(round);
  }
  if (first) {
    welcome_children(round);
  } else {
    welcome_pending();
  }
}

void Aggregator::Impl::on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw,
                                        size_t raw_size) {
  const wire::FrameHeader& h = f.header;
  const bool full = (h.flags & wire::kFlagFullAnchor) != 0;
  if (h.total_elements != total_elements_ || h.chunk_count != plan_->count() ||
      h.element_count != plan_->size(h.chunk_index)) {
    throw ProtocolError("parent sent an anchor chunk that does not fit (round " +
                        std::to_string(h.round) + ", chunk " + std::to_string(h.chunk_index) +
                        ", " + std::to_string(h.element_count) + " elements)");
  }
  const Codec* codec = codec_by_wire_id(h.codec);
  float* dst = region_.anchor.data() + plan_->offset(h.chunk_index);
  if (full) {
    // The model in full, answering this region's hello: kept, not relayed;
    // children get it from welcome_children() as they need it.
    if (!up_.full_pending || h.round != up_.welcome_round) {
      log().info("[agg:{}] ignored a full anchor chunk of round {} it did not ask for", self_.id,
                 h.round);
      return;
    }
    codec->decode(f.payload, h.element_count, dst);
    up_.uplink->progressed(Clock::now());
    if (++up_.full_chunks == plan_->count()) {
      up_.full_pending = false;
      finish_parent_welcome();
    }
    return;
  }
  // An update opens the next round.
  if (h.round != round_ + 1 || up_.full_pending) {
    log().info("[agg:{}] ignored an anchor chunk of round {} (training round {})", self_.id,
               h.round, round_);
    return;
  }
  if (region_.relay_round != h.round || region_.relayed.size() != plan_->count()) {
    region_.relay_round = h.round;
    region_.relayed.assign(plan_->count(), false);
    region_.relayed_chunks = 0;
  }
  if (region_.relayed[h.chunk_index]) {
    // Sent again by a parent that welcomed this region back mid-round: the
    // chunk is in the anchor and went down already.
    log().debug("[agg:{}] ignored a duplicate anchor chunk {} of round {}", self_.id, h.chunk_index,
                h.round);
    return;
  }
  region_.relayed[h.chunk_index] = true;
  keep_round_anchor(h.chunk_index);
  codec->decode_accumulate(f.payload, h.element_count, 1.0f, dst);
  region_.anchor_progress_at = Clock::now();
  // Relay the chunk as it is, re-addressed from this node: no decode.
  wire::FrameHeader out = h;
  out.sender = self_.index;
  auto bytes = std::make_shared<std::vector<uint8_t>>(raw, raw + raw_size);
  wire::encode_header(out, bytes->data());
  const Frame frame = std::move(bytes);
  next_anchor_.emplace_back(frame, out);
  for (const Child& c : down_.children) {
    if (c.live && !c.rejoin_pending) send_child(c, frame, out);
  }
  region_.relayed_chunks += 1;
  if (region_.relayed_chunks < plan_->count()) return;
  region_.relayed_chunks = 0;
  book_.relayed_through(h.round);
  if (h.round < cfg_.rounds) {
    round_ = h.round;
    save_checkpoint();
    start_upload();
    open_round(h.round);
    welcome_pending();
  }
  try_send_telemetry(h.round - 1);
}

void Aggregator::Impl::send_parent(std::vector<uint8_t> frame) {
  up_.out.push(
      {std::make_shared<const std::vector<uint8_t>>(std::move(frame)), wire::FrameHeader{}},
      Clock::now());
  flush();
}

void Aggregator::Impl::resend_up(const wire::ParsedFrame& f) {
  if (!plan_) return;
  wire::NeedUpdatePayload need;
  if (!wire::decode_need_update(f.payload, f.payload_size, plan_->count(), &need)) {
    summary_.rejected_frames += 1;
    security_->log_noise("need-update:parent",
                         "[agg:" + self_.id + "] dropped a malformed need-update heartbeat");
    return;
  }
  uint32_t chunks = 0;
  for (uint32_t chunk : up_.uplink->resend().on_need(round_, need, Clock::now())) {
    auto it = region_.sent_up.find(chunk);
    if (it == region_.sent_up.end()) continue;  // not complete here yet
    summary_.resent_bytes += it->second->size();
    send_parent(std::vector<uint8_t>(*it->second));
    chunks += 1;
  }
  if (chunks > 0) {
    summary_.resent_chunks += chunks;
    log().info("[agg:{}] parent lacks {} chunk(s) of round {} and receives nothing more; "
               "sending them again",
               self_.id, chunks, round_);
  }
}

}  // namespace fedwan
