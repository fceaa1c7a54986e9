// SiteCore: the site role of the round protocol over a caller-owned flat
// fp32 buffer. join() says hello and loads the federation's anchor; sync()
// streams the pseudo-gradient (anchor - params) chunk by chunk with error
// feedback, then applies the next anchor as its chunks arrive.
//
// Fault tolerance: the encoded update of the current round is kept until the
// next anchor is in, so it can be sent again after a reconnect (the parent
// counts each (round, sender, chunk) once). Heartbeats go both ways; a
// silent parent is reconnected with backoff and jitter, and the hello that
// follows tells it the site's round and state so it can resync the site.
// Link upkeep (heartbeats, reconnects, hellos) is in site_link.cpp, the
// steps of sync() in site_sync.cpp, join() in site_membership.cpp.
// Checkpoints at each round boundary (site_checkpoint.cpp) let a restarted
// site resume (site_restore.cpp). Anchor chunks are taken in
// site_anchor.cpp.
#include "fedwan/site_core.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/byte_pool.hpp"
#include "common/crash_point.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "security/frame_protector.hpp"
#include "security/noise_filter.hpp"
#include "site/site_impl.hpp"

namespace fedwan {
SiteCore::Impl::Impl(SiteOptions options, float* p, size_t n)
    : opt(std::move(options)),
      topo(opt.topology),
      self(topo.node(opt.node_id)),
      cfg(topo, self,
          {opt.window, opt.round_timeout.count() > 0 ? std::optional<Millis>(opt.round_timeout)
                                                     : std::nullopt}),
      params(p),
      work(p),
      plan(cfg.plan(n)),
      limits(cfg.limits_for_model(n)) {
  if (self.role != Role::kSite) {
    throw ConfigError("node '" + self.id + "' is a " + role_name(self.role) +
                      ", not a site; run it with `fedwan aggregator`");
  }
  if (params == nullptr) throw ConfigError("site '" + self.id + "': no parameter buffer");
  if (!(opt.checkpoint_budget > 0 && opt.checkpoint_budget <= 1)) {
    throw ConfigError("site '" + self.id + "': checkpoint_budget " +
                      std::to_string(opt.checkpoint_budget) +
                      " is not a share of its time in (0, 1]");
  }
  if (cfg.privacy.mode == node::NodeConfig::Privacy::Mode::kLocal) {
    if (opt.update_encoder) {
      throw ConfigError("site '" + self.id +
                        "': local differential privacy noises the update on the host; it "
                        "cannot use an UpdateEncoder (fedwan::Site installs none then)");
    }
    local_privacy = std::make_unique<site::LocalPrivacy>(cfg.privacy, n);
  }
  initial_digest = sha256(params, n * sizeof(float));
  anchor.place(opt.checkpoint_dir, opt.page_out_from_bytes);
  outgoing.store = node::FrameStore(n * sizeof(float) >= opt.page_out_from_bytes,
                                    opt.checkpoint_dir, "site:" + self.id, "update");
  // The frames of an update are written into buffers used before: a site
  // makes one frame and one sealed copy a chunk. Eight of the largest
  // sealed frame cover the sealed copies, which go back as they are sent
  // (sized by the frame: a fixed few MiB would keep only one or two of a
  // 4 MiB chunk's, and every other copy would be faulted in afresh). The
  // frames themselves are kept for resends until the round ends; where
  // they stay in memory the pool keeps them too, so the next round's
  // update is written into pages this one faulted in (the site held them
  // at its peak already). The frames' share lasts as long as this site.
  const size_t buffers = 8;
  const size_t bytes =
      buffers * (wire::kHeaderSize + cfg.codec->encoded_size(plan.chunk_elements()) +
                 security::kSealTrailer + 64);
  BytePool::shared().allow(buffers, bytes);
  if (!outgoing.store.on()) {
    const size_t frames = plan.count();
    frames_pool = BytePool::shared().lease(
        buffers + frames, bytes + frames * (wire::kHeaderSize + 64) + cfg.codec->encoded_size(n));
  }
  security = std::make_unique<node::NodeSecurity>(opt.security, topo, self);
  transport = transport::make_transport(topo.node(self.parent_index).endpoint);
  session::ParentSession::Options so;
  so.link = cfg.link;
  so.reconnect_linger_ms = so.link.linger_ms;
  so.heartbeat = cfg.heartbeat;
  so.heartbeat_timeout = cfg.heartbeat_timeout;
  so.log_name = "site:" + self.id;
  uplink = std::make_unique<session::Uplink>(topo, self, *transport, *security, so);
  windows = topology::ParticipationWindows(self.windows);
  if (opt.devices < 1 || (opt.device_kind != "cpu" && opt.device_kind != "gpu")) {
    throw ConfigError("site '" + self.id +
                      "': devices must be >= 1 and device_kind cpu or gpu (got " +
                      std::to_string(opt.devices) + ", '" + opt.device_kind + "')");
  }
  if (self.devices && opt.devices > *self.devices) {
    throw ConfigError("site '" + self.id + "': it trains on " + std::to_string(opt.devices) +
                      " devices but the topology allows it " + std::to_string(*self.devices) +
                      " (its node's `devices`); its cost records would be refused. Raise "
                      "`devices` in the topology or train on fewer");
  }
  costs = costs::CostRecorder(opt.costs_path, topo.job(), self.id, "site", security->key());
  costs.set_devices(opt.devices, opt.device_kind);
  start_metrics();
}

void SiteCore::Impl::reset_link_state() {
  uplink->upload().restart();  // from its first piece, on the new session
  welcome.link_ok = true;
}

// ---- receiving ------------------------------------------------------------------

std::optional<wire::ParsedFrame> SiteCore::Impl::poll_frame(transport::Incoming* in,
                                                            Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left =
        std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
    if (!link().recv(in, left)) return std::nullopt;
    wire::ParsedFrame f = wire::parse_frame(in->data(), in->frame_size, limits);
    if (!f.ok()) {
      security->log_noise(security::noise_key("malformed:parent", f.detail),
                          "[site:" + self.id + "] dropped malformed frame from parent: " +
                              wire::reject_reason_name(f.reject) + " (" + f.detail + ")");
      continue;
    }
    if (f.header.job_id != topo.job_id() || f.header.sender != self.parent_index) {
      security->log_noise("wrong-sender:parent",
                          "[site:" + self.id + "] dropped a frame not from its parent");
      continue;
    }
    if (f.header.type == wire::MsgType::kReject) {
      throw ProtocolError(
          "site '" + self.id + "' refused by '" + topo.node(self.parent_index).id +
          "': " + std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
    }
    parent().heard(Clock::now());
    return f;
  }
}

void SiteCore::Impl::on_frame(const wire::ParsedFrame& f, SyncResult* res) {
  const wire::FrameHeader& h = f.header;
  switch (h.type) {
    case wire::MsgType::kWelcome: on_welcome(f, res); return;
    case wire::MsgType::kAnchor: on_anchor(f, res); return;
    case wire::MsgType::kHeartbeat: on_heartbeat(f, res); return;
    case wire::MsgType::kCheckpoint:
      if (h.flags == wire::kFlagReplicaStored) {
        log().debug("[site:{}] the parent keeps its checkpoint of round {}", self.id, h.round);
        crash_point("site.replica_stored");
      }
      return;
    case wire::MsgType::kDone: on_done(h); return;
    default:
      log().warn("[site:{}] ignored {} from the parent", self.id, wire::msg_type_name(h.type));
  }
}

void SiteCore::Impl::on_done(const wire::FrameHeader& h) {
  if (incoming.full_pending()) return;  // the final model in full comes first
  if (round >= h.round) {
    // It holds the final model: the federation is over.
    finished = true;
    incoming.forget_next();
    return;
  }
  // The final anchor is whole: its sync takes it, and is finished.
  if (incoming.next_complete() && incoming.next_round() >= h.round) return;
  // The federation ended at round h.round and this site holds an older
  // model. The end can overtake the final anchor's last chunks (a striped
  // link keeps each connection's order, not their order among one
  // another): it waits while they come, and the parent says the end again.
  const auto now = Clock::now();
  if (end_waiting.round != h.round) end_waiting = {h.round, now};
  if (now - std::max(incoming.progress_at(), end_waiting.since) <= cfg.heartbeat_timeout) return;
  // Nothing came for a heartbeat timeout: chunks were lost. It must not
  // finish on a model one chunk short: it rejoins, and its draining parent
  // hands it the final model in full and says the end again.
  if (welcome.awaiting) return;  // asked already
  log().warn("[site:{}] the federation ended at round {} while this site holds round {} "
             "({} of {} chunks of the next anchor in); rejoining for the final model",
             self.id, h.round, round, incoming.next_received(), plan.count());
  welcome.hello_pending = true;
  welcome.awaiting = true;
}

void SiteCore::Impl::on_welcome(const wire::ParsedFrame& f, SyncResult* res) {
  const wire::FrameHeader& h = f.header;
  if (h.total_elements != plan.total()) {
    throw ProtocolError("site '" + self.id + "': the federation's model has " +
                        std::to_string(h.total_elements) + " parameters, ours " +
                        std::to_string(plan.total()));
  }
  welcome.awaiting = false;
  const auto now = Clock::now();
  uplink->welcomed(h.flags);
  uplink->progressed(now);
  parent().heard(now, /*reset_backoff=*/false);
  const bool no_change = (h.flags & wire::kFlagNoChange) != 0;
  if (no_change && (h.round == round || !welcome.joined_once)) {
    if (welcome.joined_once && !anchor_matches(f)) return;
    if (!welcome.joined_once) {
      round = h.round;
      set_anchor(params);
      welcome.joined_once = true;
    }
    if (outgoing.sent && !outgoing.frames.empty()) {
      log().info("[site:{}] welcomed back at round {}; sending its update again", self.id, round);
      resend_update();
    }
    return;
  }
  // Resync: the model of round h.round follows in full.
  if (anchor.size() != plan.total()) set_anchor(params);
  incoming.expect_full(h.round);
  (void)res;
}

// ---- join and sync ------------------------------------------------------------------

SyncResult SiteCore::Impl::service() {
  SyncResult res;
  if (overlap.pending) {
    res.round = overlap.round;
    // While the sync is in flight its worker keeps the link. Once it is
    // done, the caller's thread does until finish_sync() merges it (tau
    // steps may be longer than the heartbeat timeout: unheard, the parent
    // would drop the site and the site its parent). What the link brings
    // goes into the sync's result: finish_sync() reports a resync or the
    // end, as it would had the worker read it.
    if (overlap.done.load() && !overlap.error) {
      if (overlap.worker.joinable()) overlap.worker.join();
      try {
        pump(Millis(0), &overlap.result);
      } catch (...) {
        overlap.error = std::current_exception();  // finish_sync() throws it
      }
    }
    return res;
  }
  if (!joined || finished) return res;
  pump(Millis(0), &res);
  res.round = round;
  res.finished = finished;
  cost_link_bytes();
  update_metrics();
  return res;
}

void SiteCore::Impl::throw_if_failed() const {
  if (!overlap.failed && !sync_failed) return;
  throw Error("site '" + self.id + "': " +
              (sync_failed ? "a sync failed with part of the next anchor taken in"
                           : "an overlapped sync failed") +
              "; build a new SiteCore (its join() resumes from the last checkpoint)");
}

// One round, in four steps: prepare the update's state, send the update
// chunk by chunk (sealed on a worker), wait for the next anchor (or a
// resync, or the end), and take the anchor as the new round.
SyncResult SiteCore::Impl::sync() {
  throw_if_failed();
  if (overlap.pending) {
    throw Error("site '" + self.id + "': a sync is pending; call finish_sync() first");
  }
  if (!joined) throw Error("site '" + self.id + "': call join() before sync()");
  if (finished) throw Error("site '" + self.id + "': the federation is already finished");
  if (left) throw Error("site '" + self.id + "' has left the federation");
  throw_if_stopped("before its sync");
  SyncResult res;
  cost_training_ends();
  const auto sync_started = Clock::now();
  const uint64_t start_round = round;
  sync_unfinished = true;
  in_sync.store(true);
  struct LeaveSync {
    std::atomic<bool>& flag;
    ~LeaveSync() { flag.store(false); }
  } leave_sync{in_sync};
  try {
    run_sync(&res);
  } catch (...) {
    sync_failed = anchor_mixed;
    throw;
  }
  sync_unfinished = false;
  // The round's record: its update counts when the round moved on from it.
  cost_link_bytes();
  costs.round_ended(start_round, round == start_round + 1 && !res.resynced);
  pause_outside_window(&res);
  cost_link_bytes();
  res.round = round;
  res.finished = finished;
  res.replica_bytes = replica_bytes_since_last();
  trained_since = Clock::now();
  update_metrics(true, std::chrono::duration<double>(Clock::now() - sync_started).count());
  return res;
}

void SiteCore::Impl::confirm_end(SyncResult* res) {
  try {
    res->bytes_sent += link().send(
        node::make_frame(node::node_header(topo, self.index, wire::MsgType::kDone, round), {}),
        Millis(2000));
  } catch (const Error& e) {
    // The parent then waits out its bound and finishes anyway.
    log().warn("[site:{}] could not confirm the end to the parent: {}", self.id, e.what());
  }
}

}  // namespace fedwan
