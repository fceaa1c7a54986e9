// SiteCore, link upkeep: one turn of the link (frames in, heartbeat out),
// reconnecting a silent parent (session::Uplink and its ParentSession:
// backoff, jitter, standby failover, the welcome's progress), the hello that
// tells the parent where this site stands, and what the parent's heartbeats
// say (an update to send again, anchor chunks lost on the way).
#include <algorithm>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

// One turn of the link: the frames that are there (waiting at most `wait`
// for the first), a heartbeat when due, a pending hello, a reconnect when the
// parent went silent.
void SiteCore::Impl::pump(Millis wait, SyncResult* res) {
  upkeep();
  transport::Incoming in;
  try {
    std::optional<wire::ParsedFrame> f = poll_frame(&in, wait);
    for (int i = 0; f && i < 256; ++i) {
      res->bytes_received += in.message.size();
      on_frame(*f, res);
      f = poll_frame(&in, Millis(0));
    }
  } catch (const CryptoError& e) {
    // A session that fails in a way anyone on the path can cause (a plain
    // refusal, a TLS alert, a certificate that does not verify) is tried
    // again with backoff; so is, once in the federation, a re-handshake
    // racing the parent's restart. A real refusal fails every attempt and
    // ends in the join or round timeout, whose message names it. Only a
    // parent that proved who it is, and is not this site's parent, ends the
    // first join at once.
    if (!uplink->welcomed_once() && !resumed && link().security().failure_is_final()) throw;
    welcome.last_link_error = e.what();
    security->log_noise("link-failed:" + self.id,
                        "[site:" + self.id + "] " + e.what() + "; will reconnect");
    welcome.link_ok = false;
  }
  upkeep();
}

// Time this site did not look at its link (the caller trained without
// calling service(), a long encode or checkpoint) is not its parent's
// silence: what the parent sent meanwhile waits unread. Away for a whole
// heartbeat timeout it sent nothing for as long either: its parent has
// judged it lost, and it rejoins at once (true: it reconnected).
bool SiteCore::Impl::back_from_away(Clock::time_point now) {
  const Clock::duration away = parent().turn(now);
  const auto away_ms = std::chrono::duration_cast<Millis>(away).count();
  const bool lost = parent().judged_lost_after(away, now);
  // Away in its own long work (a whole-model copy), it said it was busy
  // meanwhile: nothing for the caller to change.
  const bool said_busy = parent().last_spoke() > now - away;
  if (2 * away >= cfg.heartbeat_timeout && !lost && !said_busy) {
    security->log_noise("away:" + self.id,
                        "did not read its link for " + std::to_string(away_ms) +
                            " ms, over half its heartbeat_timeout (" +
                            std::to_string(cfg.heartbeat_timeout.count()) +
                            " ms): its parent's silence meanwhile is not counted; call service() "
                            "between inner steps, or raise heartbeat_timeout_s");
  }
  // The sealing pipeline's worker may own the link: it is not replaced then.
  if (!lost || sealing_active || !uplink->in_federation() || !welcome.link_ok ||
      !parent().retry_due(now)) {
    return false;
  }
  reconnect("this site did not read or write its link for " +
            std::to_string(away_ms + cfg.heartbeat.count()) + " ms, over its heartbeat_timeout (" +
            std::to_string(cfg.heartbeat_timeout.count()) +
            " ms): its parent has judged it lost; call service() between inner steps, or raise "
            "heartbeat_timeout_s");
  return true;
}

void SiteCore::Impl::upkeep() {
  const auto now = Clock::now();
  if (back_from_away(now)) return;
  // While the sealing pipeline's worker owns the link's sealer, nothing else
  // may seal (a heartbeat, a hello) or replace the link under it.
  if (sealing_active) return;
  if (welcome.hello_pending && link().established()) {
    std::optional<size_t> n = link().try_send(hello_frame());
    if (n) {
      welcome.hello_pending = false;
      welcome.hello_sent_at = now;
      uplink->progressed(now);
    }
  }
  // A hello, welcome or piece of a full model can be lost on a bad link:
  // without progress for a heartbeat timeout, ask again.
  if ((welcome.awaiting || incoming.full_pending()) && !welcome.hello_pending &&
      uplink->hello_overdue(now) && now - welcome.hello_sent_at > cfg.heartbeat_timeout) {
    log().info("[site:{}] no {} from the parent; saying hello again", self.id,
               welcome.awaiting ? "welcome" : "model");
    welcome.hello_pending = true;
    welcome.awaiting = true;
    incoming.forget_full();
  }
  if (uplink->welcomed_once()) pump_upload();
  // Due, or the link just opened connections (transport/links.hpp).
  if (uplink->welcomed_once() && link().established() &&
      (now - welcome.last_heartbeat >= cfg.heartbeat || link().announcing())) {
    parent().heartbeat(round);
    welcome.last_heartbeat = now;
  }
  if (welcome.link_ok && parent().stalled(now) && parent().retry_due(now)) {
    // A handshake message lost on the way: start the session over.
    reconnect("its secure session did not come up within " +
                  std::to_string(cfg.heartbeat_timeout.count()) + " ms",
              /*grow_backoff=*/false);
    return;
  }
  if (now >= next_tick) {
    security->tick();
    next_tick = now + std::chrono::seconds(1);
  }
  const bool silent = parent().silent(now);
  const bool in_federation = uplink->in_federation();
  if (!in_federation && welcome.link_ok && parent().up_but_mute(now) && parent().retry_due(now)) {
    // Not welcomed yet, so its silence is otherwise judged by the join
    // timeout; but this session may have reached the root's passive standby
    // (after the root's did not come up in time). Try the other end.
    reconnect("its session came up but '" + topo.node(self.parent_index).id +
                  "' sent nothing for " + std::to_string((3 * cfg.heartbeat_timeout).count()) +
                  " ms",
              /*grow_backoff=*/false);
    return;
  }
  if (((in_federation && silent) || !welcome.link_ok) && parent().retry_due(now)) {
    reconnect(!welcome.link_ok ? (link().security().failure().empty()
                                      ? std::string("a send to it failed")
                                      : "its session failed: " + link().security().failure())
                               : parent().silence(now));
  }
}

void SiteCore::Impl::reconnect(const std::string& why, bool grow_backoff) {
  parent().reconnect(why, round, grow_backoff);
  reset_link_state();
  // The parent learns where this site stands from the hello and answers
  // with a welcome: carry on (and send the update again), or resync.
  welcome.hello_pending = true;
  welcome.awaiting = true;
}

std::vector<uint8_t> SiteCore::Impl::hello_frame() {
  wire::HelloPayload hello;
  hello.node_id = self.id;
  hello.topology_digest = topo.digest();
  // A site that has never joined offers its initial model; one that has
  // offers the anchor of its round (the parent skips the full model when it
  // matches). An anchor being replaced in full, not yet in after a restore
  // from a replica image, or found to differ from the parent's, is offered
  // as nothing.
  welcome.offered.reset();
  if (!incoming.full_pending() && !replica_image && !welcome.offer_none) {
    hello.model_digest =
        welcome.joined_once ? sha256(anchor.data(), anchor.size() * 4) : initial_digest;
    if (welcome.joined_once && anchor_whole()) {
      welcome.offered = hello.model_digest;
      welcome.offered_round = round;
    }
  }
  wire::FrameHeader h = node::node_header(topo, self.index, wire::MsgType::kHello, round);
  h.total_elements = plan.total();
  if (outgoing.sent && !outgoing.frames.empty()) h.flags = wire::kFlagSent;
  return node::make_frame(h, wire::encode_hello(hello));
}

void SiteCore::Impl::on_heartbeat(const wire::ParsedFrame& f, SyncResult* res) {
  // The parent writes its checkpoint (the anchor's last chunk waits for
  // it): alive, and nothing of this round was lost.
  if (f.header.flags & wire::kFlagBusy) {
    (void)uplink->behind(false);
    return;
  }
  const wire::FrameHeader& h = f.header;
  if (h.flags & wire::kFlagPace) {
    wire::PacePayload p;
    if (!wire::decode_pace(f.payload, f.payload_size, &p)) {
      security->log_noise("pace:" + self.id,
                          "[site:" + self.id + "] dropped a malformed pace heartbeat");
      return;
    }
    // The newest round's allowance stands; within a round it only grows.
    if (h.round > pace.round) {
      pace.round = h.round;
      pace.allowed = p.allowed;
    } else if (h.round == pace.round) {
      pace.allowed = std::max(pace.allowed, p.allowed);
    }
    pace.window = p.window;
    pace.heard += 1;
    return;
  }
  if (!uplink->welcomed_once() || welcome.awaiting) return;
  const auto now = Clock::now();
  // The parent's round still lacks part of this update. Chunks on their way
  // are not lost: only those the parent names once its count of chunks
  // received stopped growing go again (session::UpdateResend).
  if ((h.flags & wire::kFlagNeedUpdate) && h.round == round && outgoing.sent &&
      !outgoing.frames.empty()) {
    wire::NeedUpdatePayload need;
    if (!wire::decode_need_update(f.payload, f.payload_size, plan.count(), &need)) {
      security->log_noise("need-update:" + self.id,
                          "[site:" + self.id + "] dropped a malformed need-update heartbeat");
      return;
    }
    const std::vector<uint32_t> lost = uplink->resend().on_need(round, need, now);
    if (!lost.empty()) {
      log().info("[site:{}] parent lacks {} chunk(s) of round {} and receives nothing more; "
                 "sending them again",
                 self.id, lost.size(), round);
      resend_chunks(lost, res);
    }
    return;
  }
  // Anchor chunks lost on the way: the parent moved past the round whose
  // anchor this site still misses, or it is in that round and nothing came
  // for a heartbeat timeout. Rejoin to be resynced. (The parent being in the
  // next round while the anchor is complete, or still arriving, is normal.)
  const bool incomplete = incoming.next_incomplete();
  const bool stalled = incomplete && h.round == incoming.next_round() && outgoing.sent &&
                       now - incoming.progress_at() > cfg.heartbeat_timeout;
  if (uplink->behind(incomplete && (h.round > incoming.next_round() || stalled))) {
    log().warn("[site:{}] parent is at round {} while this site waits for the anchor of "
               "round {}; rejoining",
               self.id, h.round, round + 1);
    welcome.hello_pending = true;
    welcome.awaiting = true;
  }
}

}  // namespace fedwan
