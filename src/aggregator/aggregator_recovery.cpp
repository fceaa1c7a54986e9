// Aggregator, fault tolerance: children that rejoin (after a crash, a
// reconnect or this node's own restart), heartbeats and lost children,
// round deadlines and quorum (checkpoints and resuming from them are in
// aggregator_checkpoints.cpp, a region's side of the link to its parent in
// region_role.cpp, the root's link to its standby in root_role.cpp).
// docs/operations.md states the guarantees these steps give.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/role.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "common/atomic_file.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {

const std::vector<float>& Aggregator::Impl::anchor_values() const { return role_->anchor(); }

std::array<uint8_t, 32> Aggregator::Impl::Role::anchor_digest() const {
  const std::vector<float>& a = anchor();
  return sha256(a.data(), a.size() * sizeof(float));
}

// Every welcome compares a child's digest with it: a role keeps it while
// its anchor stands, so a burst of rejoins hashes the model once.
std::array<uint8_t, 32> Aggregator::Impl::anchor_digest() const { return role_->anchor_digest(); }

// ---- rejoining children -------------------------------------------------------

void Aggregator::Impl::send_full_anchor(const Child& c) {
  if (anchor_values().size() != model_.elements) {
    // A region restored from its replica image has no anchor until its
    // parent's model is in; children wait for it (Role::resyncing).
    log().error("[agg:{}] no anchor to send '{}' yet", self_.id, c.id);
    return;
  }
  const Codec& fp32 = *codec_by_id(CodecId::kFp32);
  // The round's own anchor (the next anchor's chunks follow from
  // welcome_one, and are added to it only once it is whole).
  const float* anchor = anchor_values().data();
  for (uint32_t i = 0; i < model_.plan->count(); ++i) {
    const uint32_t n = model_.plan->size(i);
    std::vector<uint8_t> payload(fp32.encoded_size(n));
    fp32.encode(anchor + model_.plan->offset(i), n, nullptr, payload.data());
    wire::FrameHeader h = node::chunk_header(topo_, self_.index, wire::MsgType::kAnchor, round_,
                                             *model_.plan, i, CodecId::kFp32);
    h.flags = wire::kFlagFullAnchor;
    // In the round's file for a large model: a whole model of frames
    // waits in the child's outbox, read back as its window takes them.
    send_child(c,
               anchors_.store.keep(
                   std::make_shared<const std::vector<uint8_t>>(node::make_frame(h, payload))),
               h);
  }
}

void Aggregator::Impl::send_unchanged_chunk(const Child& c, const wire::FrameHeader& next) {
  // fp32 -0.0 everywhere: x + (-0.0) is x, bit for bit, for every x (+0.0
  // and -0.0 included), so the chunk the child holds keeps its bits.
  const uint32_t n = model_.plan->size(next.chunk_index);
  const Codec& fp32 = *codec_by_id(CodecId::kFp32);
  const std::vector<float> nothing(n, -0.0f);
  std::vector<uint8_t> payload(fp32.encoded_size(n));
  fp32.encode(nothing.data(), n, nullptr, payload.data());
  const wire::FrameHeader h =
      node::chunk_header(topo_, self_.index, wire::MsgType::kAnchor, next.round, *model_.plan,
                         next.chunk_index, CodecId::kFp32);
  send_child(c, std::make_shared<const std::vector<uint8_t>>(node::make_frame(h, payload)), h);
}

void Aggregator::Impl::welcome_one(Child& c, uint64_t round, bool full) {
  clear_outbox(c);
  const std::array<uint8_t, 32> digest = anchor_digest();
  std::vector<uint8_t> payload(digest.begin(), digest.end());
  wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kWelcome, round);
  h.total_elements = model_.elements;
  h.flags = (full ? 0 : wire::kFlagNoChange) | welcome_flags();
  Frame frame = std::make_shared<const std::vector<uint8_t>>(node::make_frame(h, payload));
  pace_welcomed(c, round);  // before anything lets it start the round
  send_child(c, with_round_clip(std::move(frame), h), h);
  if (full) send_full_anchor(c);
  // Mid-round, the next anchor may be partly on its way already: what went
  // to the child before it came back may be lost, so it goes again (a child
  // ignores chunks it has). A chunk the anchor sent in full holds already
  // goes as an update that changes nothing.
  if (round == round_ && (phase_ == Phase::kTraining || phase_ == Phase::kAwaitAnchor)) {
    for (const auto& [frame, fh] : anchors_.next) {
      if (full && role_->chunk_advanced(fh.chunk_index)) {
        send_unchanged_chunk(c, fh);
      } else {
        send_child(c, frame, fh);
      }
    }
  }
  c.welcomed = true;
  c.live = true;
  // Its silence counts from its welcome: before it, it had nothing to say
  // (a child welcomed at a boundary or a first round may have said hello
  // long ago).
  c.last_heard = Clock::now();
  c.rejoin_pending = false;
  if (acc_ && acc_->is_open() && phase_ == Phase::kTraining) acc_->set_expected(c.index, true);
  became_member(c);
  pace_children();
}

void Aggregator::Impl::on_rejoin(Child& c, const wire::ParsedFrame& f) {
  wire::HelloPayload hello;
  const bool decoded = wire::decode_hello(f.payload, f.payload_size, &hello);
  if (decoded && !knows_topology(hello.topology_digest)) check_topology_file();  // just written
  if (!decoded || hello.node_id != c.id || !knows_topology(hello.topology_digest) ||
      f.header.total_elements != model_.elements) {
    refuse(c.id, "hello does not match this federation (node, topology or model size)");
    return;
  }
  const uint64_t their_round = f.header.round;
  const bool sent = (f.header.flags & wire::kFlagSent) != 0;
  c.hello = hello;
  c.joined = true;
  c.live = true;
  c.last_heard = Clock::now();
  summary_.rejoins += 1;
  // A child can say hello again as often as it likes: rate limited.
  security_->audit_noise(
      "rejoin", "rejoin:" + c.id,
      {{"peer", c.id}, {"their_round", their_round}, {"round", round_}, {"update_sent", sent}},
      "[agg:" + self_.id + "] '" + c.id + "' rejoined (it is at round " +
          std::to_string(their_round) + (sent ? ", update sent" : "") + ", this node at " +
          std::to_string(round_) + ")");
  if (phase_ == Phase::kDraining || phase_ == Phase::kDone) {
    // The federation is over: hand it the final model and the end.
    welcome_one(c, round_, c.hello.model_digest != anchor_digest());
    wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kDone, round_);
    send_child(c, node::make_frame(h, {}), h);
    return;
  }
  if (role_->resyncing()) {
    c.rejoin_pending = true;  // this region itself is (re)joining its parent
    return;
  }
  // Not a member (a late_join site, or back from a leave or a pause): it
  // counts from the next round boundary.
  if (admit_newcomer(c)) {
    close_ready_chunks();
    return;
  }
  if (role_->holds_rejoins()) {
    // The root waits for its standby to hold the round just committed:
    // welcomed once the round's last chunk is out (release_held_back).
    c.rejoin_pending = true;
    if (acc_ && acc_->is_open()) acc_->set_expected(c.index, false);
    return;
  }
  welcome_member_back(c, their_round);
}

// A member that said hello again: welcomed now, in the round, or at the
// next boundary.
void Aggregator::Impl::welcome_member_back(Child& c, uint64_t their_round) {
  const bool in_round = phase_ == Phase::kTraining || phase_ == Phase::kAwaitAnchor;
  // A child that offers the anchor of this round holds it: the history of
  // committed rounds is linear, so after round 0 a round number names one
  // anchor. (It offers no digest while its anchor is being replaced, and
  // at round 0 a newcomer's own initial model must be checked.)
  const bool holds_anchor =
      their_round == round_ && round_ > 0 && c.hello.model_digest != std::array<uint8_t, 32>{};
  // Only a site can be sent a mixed anchor in full (RootRole): a region
  // relays the round's frames to children that hold its anchor. It waits
  // for the next boundary (not reached while the root adds chunks under a
  // region: it adds them only where every child is a site).
  const bool mixed_for_it = !c.is_site && !role_->anchor_whole();
  if (in_round && !mixed_for_it && holds_anchor && role_->vouches_for_round_anchor()) {
    // Carry on; an update it already sent comes again and counts once.
    welcome_one(c, round_, false);
    return;
  }
  if (in_round && !mixed_for_it) {
    // Mid-round, even once some chunks of the next anchor went down: the
    // child gets the round's own anchor and then the next anchor's chunks
    // so far, and is expected for the chunks still open.
    // Deferring it to the next boundary could wait for ever when the round
    // needs its weight for quorum.
    welcome_one(c, round_, c.hello.model_digest != anchor_digest());
    return;
  }
  // Not in a round (or a region while the root's anchor is mixed): welcome
  // it at the next boundary, with the new anchor.
  c.rejoin_pending = true;
  if (acc_ && acc_->is_open()) acc_->set_expected(c.index, false);
  close_ready_chunks();
}

void Aggregator::Impl::welcome_pending() {
  bool any = false;
  for (const Child& c : down_.children) any = any || c.rejoin_pending;
  if (!any) return;
  const std::array<uint8_t, 32> digest = anchor_digest();
  for (Child& c : down_.children) {
    if (c.rejoin_pending) welcome_one(c, round_, c.hello.model_digest != digest);
  }
}

// ---- liveness -----------------------------------------------------------------

void Aggregator::Impl::on_heartbeat_timer() {
  const auto now = Clock::now();
  security_->tick();
  check_topology_file();
  // Time this node spent away from its loop is not its children's
  // silence: each is credited with it before it is judged, so a node busy
  // for longer than the timeout does not drop children that went on
  // talking to it (and stop heartbeating them, so that they reconnect).
  const Clock::duration away = clock_.ticks.tick(now);
  if (away > Clock::duration::zero()) {
    // Its parent is not credited when this node sent it nothing for a
    // heartbeat timeout or more: the parent has judged it lost, and it
    // rejoins at once (RegionLink::heartbeat finds the parent silent).
    session::Uplink* up = role_->uplink();
    credit_silence(away, now, up != nullptr && !up->session().judged_lost_after(away, now));
    if (2 * away >= cfg_.heartbeat_timeout) {
      log().warn("[agg:{}] away from its event loop for {} ms (a long checkpoint, a slow disk, the "
                 "host short of memory); its peers' silence meanwhile is not counted",
                 self_.id, std::chrono::duration_cast<std::chrono::milliseconds>(away).count());
    }
  }
  // A child is judged by its silence only once it can speak: until this
  // node's own first welcome (kJoining, kAwaitWelcome) its children wait for
  // theirs and send nothing but a hello now and then. Judged sooner, a region
  // whose parent took longer than a heartbeat timeout to welcome it lost
  // every child before its first round and that round could never close.
  if (phase_ != Phase::kJoining && phase_ != Phase::kAwaitWelcome) {
    for (Child& c : down_.children) {
      if (c.live && !ended_with(c) && now - c.last_heard > cfg_.heartbeat_timeout) child_lost(c);
    }
  }
  // A region that opened a round with no member under it (they all left or
  // paused) hears from nobody: it sits the round out (check_round_wait).
  if (phase_ == Phase::kTraining && role_->sits_out_empty_rounds() && member_weight() <= 0) {
    check_round_wait();
  }
  for (const Child& c : down_.children) {
    if (!c.live || !c.joined) continue;
    wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kHeartbeat, round_);
    std::vector<uint8_t> payload;
    if (phase_ == Phase::kTraining && acc_ && acc_->expected(c.index) &&
        !acc_->delivered_all(c.index)) {
      // With how far its update has come: the child sends again only what
      // is missing, and only once nothing more arrives (session::UpdateResend).
      h.flags = wire::kFlagNeedUpdate;
      payload = wire::encode_need_update(acc_->delivered(c.index), acc_->missing_chunks(c.index));
    }
    // Never queued behind a full window: a heartbeat that cannot go now is
    // superseded by the next.
    try {
      if (phase_ == Phase::kDraining && !c.confirmed_end && !role_->end_held_back()) {
        // The end said again until the child confirms it: a kDone lost on a
        // bad link must not leave the child waiting (one that lacks part of
        // the final anchor rejoins for it, see on_rejoin).
        (void)down_.link.link().try_send(
            c.id, node::make_frame(
                      node::node_header(topo_, self_.index, wire::MsgType::kDone, round_), {}));
      }
      (void)down_.link.link().try_send(c.id, node::make_frame(h, payload));
    } catch (const Error&) {
      // Not connected right now; its silence is judged by the timeout.
    }
  }
  pace_again();           // an allowance lost on the way costs a heartbeat at most
  role_->heartbeat(now);  // the parent's side, or the standby's
  update_metrics();
}

void Aggregator::Impl::child_lost(Child& c) {
  if (!c.live) return;
  c.live = false;
  summary_.children_lost += 1;
  clear_outbox(c);
  log().warn("[agg:{}] lost '{}' (silent for over {} ms); round {} goes on without it", self_.id,
             c.id, cfg_.heartbeat_timeout.count(), round_);
  security_->audit("child_lost", {{"peer", c.id}, {"round", round_}});
  if (acc_ && acc_->is_open() && phase_ == Phase::kTraining) {
    acc_->set_expected(c.index, false);
    close_ready_chunks();
    pace_children();
  }
}

void Aggregator::Impl::close_ready_chunks() {
  if (!acc_ || phase_ != Phase::kTraining) return;
  for (uint32_t chunk : acc_->ready_chunks()) complete_chunk(chunk);
  if (acc_->round_complete()) {
    complete_round();
  } else {
    check_round_wait();
  }
}

void Aggregator::Impl::arm_deadline() {
  if (!cfg_.round_deadline) return;
  const auto when = clock_.round_started + *cfg_.round_deadline;
  const uint64_t round = round_;
  timers_.at(*clock_.deadline_timer, when, [this, round] { on_deadline(round); });
}

void Aggregator::Impl::on_deadline(uint64_t round) {
  if (phase_ != Phase::kTraining || round != round_ || !acc_) return;
  clock_.past_deadline = true;
  pace_lift();  // nobody waits for anyone past the deadline
  const std::vector<uint32_t> chunks = acc_->quorate_chunks();
  nlohmann::json missing = nlohmann::json::array();
  for (uint32_t idx : acc_->missing_children()) missing.push_back(topo_.node(idx).id);
  log().warn("[agg:{}] round {} reached its deadline; closing {} chunks with quorum, missing {}",
             self_.id, round, chunks.size(), missing.dump());
  security_->audit("deadline",
                   {{"round", round}, {"chunks_closed", chunks.size()}, {"missing", missing}});
  for (uint32_t chunk : chunks) complete_chunk(chunk);
  if (acc_->round_complete()) {
    complete_round();
  } else {
    const aggregator::RoundWait w = round_wait();
    log().warn("[agg:{}] round {} lacks quorum ({} of the weight); waiting for {}", self_.id, round,
               cfg_.quorum,
               w.waiting_for.empty() ? std::string("children to rejoin")
                                     : aggregator::join_names(w.waiting_for));
    check_round_wait();
  }
}

}  // namespace fedwan
