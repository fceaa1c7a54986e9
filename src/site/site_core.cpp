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
// Link upkeep (heartbeats, reconnects, hellos) is in site_link.cpp.
// Checkpoints at each round boundary (site_checkpoint.cpp) let a restarted
// site resume. The anchor of the round is never touched until the next one
// is complete: new anchor chunks go into `params`, which they replace anyway.
#include "fedwan/site_core.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include <nlohmann/json.hpp>

#include "checkpoint/replica_fetch.hpp"
#include "common/crash_point.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"
#include "security/noise_filter.hpp"
#include "security/sealing_pipeline.hpp"
#include "site/site_impl.hpp"

namespace fedwan {
namespace {

// "0.5 s", "300 s": a timeout as its user gave it (a sub-second join
// timeout must not read "within 0 s").
std::string seconds_text(std::chrono::milliseconds d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return text;
}

}  // namespace

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
  initial_digest = sha256(params, n * sizeof(float));
  security = std::make_unique<node::NodeSecurity>(opt.security, topo, self);
  transport = transport::make_transport(topo.node(self.parent_index).endpoint);
  session::ParentSession::Options so;
  so.link = cfg.link;
  so.reconnect_linger_ms = so.link.linger_ms;
  so.heartbeat = cfg.heartbeat;
  so.heartbeat_timeout = cfg.heartbeat_timeout;
  so.log_name = "site:" + self.id;
  parent = std::make_unique<session::ParentSession>(topo, self, *transport, *security, so);
  upload = std::make_unique<checkpoint::CheckpointUpload>(topo, self.index);
  windows = ParticipationWindows(self.windows);
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
  outgoing.resend = session::UpdateResend(cfg.heartbeat_timeout);
}

void SiteCore::Impl::reset_link_state() {
  if (upload->active()) start_upload();  // from its first piece, on the new session
  welcome.link_ok = true;
}

// ---- receiving ------------------------------------------------------------------

std::optional<wire::ParsedFrame> SiteCore::Impl::poll_frame(Incoming* in, Millis timeout) {
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
    parent->heard(Clock::now());
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
      }
      return;
    case wire::MsgType::kDone:
      if (incoming.full) return;  // the final model in full comes first
      if (incoming.next) {
        incoming.next->done_signalled = true;
      } else {
        finished = true;
      }
      return;
    default:
      log().warn("[site:{}] ignored {} from the parent", self.id, wire::msg_type_name(h.type));
  }
}

void SiteCore::Impl::on_welcome(const wire::ParsedFrame& f, SyncResult* res) {
  const wire::FrameHeader& h = f.header;
  if (h.total_elements != plan.total()) {
    throw ProtocolError("site '" + self.id + "': the federation's model has " +
                        std::to_string(h.total_elements) + " parameters, ours " +
                        std::to_string(plan.total()));
  }
  welcome.awaiting = false;
  welcome.welcomed_once = true;
  welcome.parent_keeps_replicas = (h.flags & wire::kFlagKeepsReplicas) != 0;
  welcome.progress_at = Clock::now();
  parent->heard(welcome.progress_at, /*reset_backoff=*/false);
  const bool no_change = (h.flags & wire::kFlagNoChange) != 0;
  if (no_change && (h.round == round || !welcome.joined_once)) {
    if (!welcome.joined_once) {
      round = h.round;
      anchor.assign(params, params + plan.total());
      welcome.joined_once = true;
    }
    if (outgoing.sent && !outgoing.frames.empty()) {
      log().info("[site:{}] welcomed back at round {}; sending its update again", self.id, round);
      resend_update();
    }
    return;
  }
  // Resync: the model of round h.round follows in full.
  if (anchor.size() != plan.total()) anchor.assign(params, params + plan.total());
  incoming.full.emplace();
  incoming.full->round = h.round;
  incoming.full->got.assign(plan.count(), false);
  (void)res;
}

void SiteCore::Impl::on_anchor(const wire::ParsedFrame& f, SyncResult* res) {
  const wire::FrameHeader& h = f.header;
  const bool is_full = (h.flags & wire::kFlagFullAnchor) != 0;
  const Codec* c = codec_by_wire_id(h.codec);
  if (h.total_elements != plan.total() || h.chunk_count != plan.count() ||
      h.element_count != plan.size(h.chunk_index) ||
      !c->validate(f.payload, f.payload_size, h.element_count)) {
    throw ProtocolError("site '" + self.id +
                        "': parent sent an anchor chunk that does not "
                        "fit (round " +
                        std::to_string(h.round) + ", chunk " + std::to_string(h.chunk_index) +
                        ", " + std::to_string(h.element_count) + " elements)");
  }
  const uint64_t off = plan.offset(h.chunk_index);
  const uint32_t n = h.element_count;
  if (is_full) {
    if (!incoming.full || h.round != incoming.full->round || incoming.full->got[h.chunk_index]) {
      log().info("[site:{}] ignored a full anchor chunk of round {}", self.id, h.round);
      return;
    }
    c->decode(f.payload, n, anchor.data() + off);
    incoming.full->got[h.chunk_index] = true;
    welcome.progress_at = Clock::now();
    if (++incoming.full->received < plan.count()) return;
    // The whole model is in: this round restarts from it (an overlapped
    // sync's caller copies it at finish_sync).
    if (!overlapping()) std::memcpy(params, anchor.data(), plan.total() * sizeof(float));
    log().info("[site:{}] {} at round {}", self.id, welcome.joined_once ? "resynced" : "joined",
               incoming.full->round);
    if (welcome.joined_once) {
      security->audit("resync", {{"from_round", round}, {"to_round", incoming.full->round}});
    }
    round = incoming.full->round;
    incoming.full.reset();
    incoming.next.reset();
    outgoing.sent = false;
    outgoing.frames.clear();
    std::fill(residual.begin(), residual.end(), 0.0f);
    if (opt.update_encoder && !residual.empty()) {
      opt.update_encoder->write_residual(residual.data(), residual.size());
    }
    welcome.joined_once = true;
    res->resynced = true;
    if (round >= cfg.rounds) finished = true;
    round_checkpoint(/*upload=*/false);
    return;
  }
  if (!incoming.next && h.round == round + 1 && !incoming.full) {
    // Before this site's sync() (it rejoined mid-round, or the round closed
    // without it): kept until its deltas are computed.
    incoming.next.emplace();
    incoming.next->round = round + 1;
    incoming.next->got.assign(plan.count(), false);
    outgoing.encoded_upto = 0;
    incoming.early.clear();
  }
  if (!incoming.next || h.round != incoming.next->round || incoming.next->got[h.chunk_index]) {
    log().info("[site:{}] ignored an anchor chunk of round {} (at round {})", self.id, h.round,
               round);
    return;
  }
  if (h.chunk_index >= outgoing.encoded_upto) {
    // Closed without this site's chunk (quorum or deadline) before its delta
    // was computed here: apply it once it is.
    incoming.early.push_back(
        {h.chunk_index, h.codec, std::vector<uint8_t>(f.payload, f.payload + f.payload_size)});
    incoming.next->got[h.chunk_index] = true;
    incoming.next->received += 1;
    incoming.progress_at = Clock::now();
    return;
  }
  apply_update_chunk(h.chunk_index, *c, f.payload);
  incoming.next->got[h.chunk_index] = true;
  incoming.next->received += 1;
  incoming.progress_at = Clock::now();
}

void SiteCore::Impl::apply_update_chunk(uint32_t chunk, const Codec& c, const uint8_t* payload) {
  const uint64_t off = plan.offset(chunk);
  const uint32_t n = plan.size(chunk);
  if (!overlapping()) {
    std::memcpy(params + off, anchor.data() + off, n * sizeof(float));
    c.decode_accumulate(payload, n, 1.0f, params + off);
    return;
  }
  // Overlapped: the anchor is updated in place (its old chunk was only
  // needed for this chunk's delta, already encoded) and `work`, the params
  // sent, becomes what finish_sync adds to the caller's params.
  float* a = anchor.data() + off;
  float* w = work + off;
  c.decode_accumulate(payload, n, 1.0f, a);
  for (uint32_t k = 0; k < n; ++k) w[k] = a[k] - w[k];
}

void SiteCore::Impl::apply_early() {
  for (auto it = incoming.early.begin(); it != incoming.early.end();) {
    if (it->chunk < outgoing.encoded_upto) {
      apply_update_chunk(it->chunk, *codec_by_wire_id(it->codec), it->payload.data());
      it = incoming.early.erase(it);
    } else {
      ++it;
    }
  }
}

// ---- sending ---------------------------------------------------------------------

bool SiteCore::Impl::send_now(std::vector<uint8_t> frame, SyncResult* res) {
  if (!welcome.link_ok) return false;
  try {
    res->bytes_sent += link().send(std::move(frame), cfg.heartbeat_timeout);
    return true;
  } catch (const TimeoutError& e) {
    log().warn("[site:{}] send to the parent failed: {}", self.id, e.what());
  } catch (const TransportError& e) {
    log().warn("[site:{}] send to the parent failed: {}", self.id, e.what());
  }
  welcome.link_ok = false;
  return false;
}

void SiteCore::Impl::resend_update() {
  if (sealing_active) return;  // mid-upload: the update is going out anyway
  SyncResult ignored;
  for (const std::vector<uint8_t>& fr : outgoing.frames) {
    if (!send_now(fr, &ignored)) return;
  }
}

void SiteCore::Impl::resend_chunks(const std::vector<uint32_t>& chunks, SyncResult* res) {
  if (sealing_active) return;  // mid-upload: the update is going out anyway
  for (uint32_t c : chunks) {
    if (c >= outgoing.frames.size()) continue;
    const uint64_t before = res->bytes_sent;
    if (!send_now(outgoing.frames[c], res)) return;
    res->bytes_resent += res->bytes_sent - before;
  }
}

// ---- join and sync ------------------------------------------------------------------

SyncResult SiteCore::Impl::join() {
  if (joined) throw Error("site '" + self.id + "' already joined");
  if (left) throw Error("site '" + self.id + "' has left the federation");
  SyncResult res;
  // From a checkpoint, when there is one; with none intact, from the copy
  // the parent keeps (then resumed like a local one).
  if (!resume() && !opt.checkpoint_dir.empty() &&
      checkpoint::fetch_replica(
          link(),
          [this](const std::string& why) -> ParentLink& {
            reconnect(why);
            return link();
          },
          topo, self, cfg, opt.checkpoint_dir, plan.total(), opt.join_timeout, *security,
          &stop_requested)) {
    resume();
  }
  // Sent once the secure session is up (upkeep); asked again when lost.
  welcome.hello_pending = true;
  welcome.awaiting = true;
  welcome.hello_sent_at = welcome.progress_at = Clock::now();
  parent->heard(Clock::now(), /*reset_backoff=*/false);
  const auto deadline = Clock::now() + opt.join_timeout;
  while (welcome.awaiting || incoming.full) {
    if (Clock::now() >= deadline) {
      if (!link().established()) {
        throw TimeoutError(
            "TLS handshake with parent " + link().endpoint() + " did not complete within " +
            std::to_string(opt.join_timeout.count()) +
            " ms: is the parent running, with its credentials?" +
            (welcome.last_link_error.empty() ? "" : " Last error: " + welcome.last_link_error));
      }
      throw TimeoutError("site '" + self.id + "': no welcome from parent '" +
                         topo.node(self.parent_index).id + "' at " + link().endpoint() +
                         " within " + seconds_text(opt.join_timeout) + " (is it running?)");
    }
    throw_if_stopped("while joining");
    pump(Millis(100), &res);
  }
  joined = true;
  log().info("[site:{}] joined at round {}", self.id, round);
  pause_outside_window(&res);
  res.round = round;
  res.finished = finished;
  cost_link_bytes();
  trained_since = Clock::now();
  update_metrics(true);
  return res;
}

SyncResult SiteCore::Impl::service() {
  SyncResult res;
  if (overlap.pending) {  // the worker keeps the link meanwhile
    res.round = overlap.round;
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

// One round, in four steps: prepare the update's state, send the update
// chunk by chunk (sealed on a worker), wait for the next anchor (or a
// resync, or the end), and take the anchor as the new round.
SyncResult SiteCore::Impl::sync() {
  if (overlap.failed) {
    throw Error("site '" + self.id +
                "': an overlapped sync failed; build a new SiteCore (its "
                "join() resumes from the last checkpoint)");
  }
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
  run_sync(&res);
  sync_unfinished = false;
  // The round's record: its update counts when the round moved on from it.
  cost_link_bytes();
  costs.round_ended(start_round, round == start_round + 1 && !res.resynced);
  pause_outside_window(&res);
  cost_link_bytes();
  res.round = round;
  res.finished = finished;
  trained_since = Clock::now();
  update_metrics(true, std::chrono::duration<double>(Clock::now() - sync_started).count());
  return res;
}

void SiteCore::Impl::run_sync(SyncResult* res) {
  const uint64_t start_round = round;
  const auto current = [&] { return round == start_round && !res->resynced; };
  begin_update();
  send_update(start_round, res);
  if (current()) update_sent();
  await_anchor(start_round, res);
  if (current() && incoming.next && !finished) take_anchor();
  incoming.next.reset();
  if (finished) confirm_end(res);
  security->audit_sync();
  res->round = round;
  res->finished = finished;
}

void SiteCore::Impl::begin_update() {
  if (cfg.codec->id() != CodecId::kFp32 && residual.empty()) residual.assign(plan.total(), 0.0f);
  // Anchor chunk i may arrive while later deltas still go out; it goes into
  // params once delta chunk i is computed (apply_early).
  if (!incoming.next || incoming.next->round != round + 1) {
    incoming.next.emplace();
    incoming.next->round = round + 1;
    incoming.next->got.assign(plan.count(), false);
    incoming.early.clear();
  }
  outgoing.encoded_upto = 0;
  outgoing.frames.clear();
  outgoing.sent = false;
  outgoing.digest = Sha256();
  outgoing.bytes = 0;
  outgoing.resend.begin(round, Clock::now());
}

void SiteCore::Impl::send_update(uint64_t start_round, SyncResult* res) {
  const bool lossy = cfg.codec->id() != CodecId::kFp32;
  std::vector<float> delta(plan.chunk_elements());
  std::vector<uint8_t> payload;
  // On a secure link, chunk i is encrypted on a worker while chunk i+1 is
  // encoded here, so sealing costs no extra time while the encoder is busy.
  if (welcome.link_ok && !welcome.awaiting) {
    try {
      link().wait_established(cfg.heartbeat_timeout);
    } catch (const TimeoutError&) {
      welcome.link_ok = false;
    }
  }
  security::FrameSealer* sealer =
      welcome.link_ok && link().established() ? link().security().sealer() : nullptr;
  std::optional<security::SealingPipeline> sealing;
  if (sealer != nullptr) {
    sealing.emplace(*sealer, 2);
    sealing_active = true;
  }
  struct SealingFlag {
    bool& active;
    ~SealingFlag() { active = false; }
  } sealing_flag{sealing_active};
  for (uint32_t i = 0; i < plan.count() && round == start_round && !res->resynced; ++i) {
    const uint64_t off = plan.offset(i);
    const uint32_t n = plan.size(i);
    payload.resize(cfg.codec->encoded_size(n));
    if (opt.update_encoder) {
      opt.update_encoder->encode(*cfg.codec, off, n, lossy, payload.data());
    } else {
      for (uint32_t k = 0; k < n; ++k) delta[k] = anchor[off + k] - work[off + k];
      cfg.codec->encode(delta.data(), n, lossy ? residual.data() + off : nullptr, payload.data());
    }
    outgoing.encoded_upto = i + 1;
    const wire::FrameHeader h = chunk_header(topo, self.index, wire::MsgType::kDelta, round, plan,
                                             i, cfg.codec->id(), self.weight);
    outgoing.digest.update(payload.data(), payload.size());
    outgoing.bytes += payload.size();
    outgoing.frames.push_back(make_frame(h, payload));
    if (sealing && welcome.link_ok) {
      sealing->submit(outgoing.frames.back());
      send_sealed(*sealing, 1, res);
    } else {
      send_now(outgoing.frames.back(), res);
    }
    if (i == 0) crash_point("site.mid_upload");
    apply_early();
    pump(Millis(0), res);
    throw_if_stopped("while sending its update");
  }
  if (sealing) send_sealed(*sealing, 0, res);
  incoming.progress_at = Clock::now();
}

void SiteCore::Impl::send_sealed(security::SealingPipeline& sealing, size_t keep, SyncResult* res) {
  std::vector<uint8_t> sealed;
  while (sealing.in_flight() > keep) {
    if (!sealing.next(&sealed, cfg.round_timeout)) {
      throw TimeoutError("site '" + self.id + "': sealing a delta chunk timed out");
    }
    if (!welcome.link_ok) continue;
    try {
      res->bytes_sent += link().send_sealed(std::move(sealed), cfg.heartbeat_timeout);
    } catch (const TimeoutError&) {
      welcome.link_ok = false;
    } catch (const TransportError&) {
      welcome.link_ok = false;
    }
  }
}

void SiteCore::Impl::update_sent() {
  outgoing.sent = true;
  outgoing.sent_at = Clock::now();
  outgoing.resend.handed_over(outgoing.sent_at);
  const Sha256Digest d = outgoing.digest.finish();
  security->audit("update_sent", {{"round", round},
                                  {"parent", topo.node(self.parent_index).id},
                                  {"chunks", plan.count()},
                                  {"bytes", outgoing.bytes},
                                  {"sha256", to_hex(d.data(), d.size())}});
  if (!welcome.link_ok)
    welcome.hello_pending = welcome.awaiting = true;  // resent after the welcome
}

void SiteCore::Impl::await_anchor(uint64_t start_round, SyncResult* res) {
  const auto deadline = Clock::now() + cfg.round_timeout;
  while (round == start_round && !finished && !res->resynced) {
    if (incoming.next && (incoming.next->done_signalled || incoming.next->received == plan.count()))
      break;
    if (Clock::now() >= deadline) {
      throw TimeoutError(
          "site '" + self.id + "': no anchor for round " + std::to_string(round + 1) +
          " from parent '" + topo.node(self.parent_index).id + "' at " + link().endpoint() +
          " within " + std::to_string(cfg.round_timeout.count() / 1000) + " s (" +
          std::to_string(incoming.next ? incoming.next->received : 0) + " of " +
          std::to_string(plan.count()) + " chunks in; is it running?)" +
          (welcome.last_link_error.empty() ? "" : " Last link error: " + welcome.last_link_error));
    }
    throw_if_stopped("while waiting for the next anchor");
    pump(Millis(50), res);
  }
}

void SiteCore::Impl::take_anchor() {
  if (incoming.next->done_signalled && incoming.next->received < plan.count()) {
    finished = true;  // the federation ended instead
    return;
  }
  apply_early();
  // Overlapped, the anchor was updated in place as its chunks came.
  if (!overlapping()) std::memcpy(anchor.data(), params, plan.total() * sizeof(float));
  round += 1;
  outgoing.sent = false;
  outgoing.frames.clear();
  if (round >= cfg.rounds) finished = true;
  round_checkpoint(/*upload=*/!finished);
}

void SiteCore::Impl::confirm_end(SyncResult* res) {
  try {
    res->bytes_sent += link().send(
        make_frame(node_header(topo, self.index, wire::MsgType::kDone, round), {}), Millis(2000));
  } catch (const Error& e) {
    // The parent then waits out its bound and finishes anyway.
    log().warn("[site:{}] could not confirm the end to the parent: {}", self.id, e.what());
  }
}

}  // namespace fedwan
