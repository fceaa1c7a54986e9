// Aggregator: the root, region and standby roles of the round protocol.
//
// One thread owns both sockets (children ROUTER, parent DEALER) and runs an
// event loop. Deltas are accumulated chunk by chunk as they stream in; a
// region forwards chunk i upward the moment every child's chunk i is in, the
// root steps the outer optimizer on chunk i and streams the new anchor's
// chunk i down. See docs/protocol.md for the message sequence.
//
// This file: sending through the per-peer outboxes (aggregator/downlink.hpp),
// the event loop, the children's frame dispatch and deadlines. Construction
// is in aggregator_setup.cpp; aggregator_impl.hpp says where the rest is,
// aggregator/role.hpp what differs between the roles.
#include "fedwan/aggregator.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/role.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/privacy.hpp"
#include "node/node_frames.hpp"
#include "security/noise_filter.hpp"

namespace fedwan {
namespace {

constexpr std::chrono::milliseconds kPoll{100};

}  // namespace

// ---- sending ------------------------------------------------------------------

void Aggregator::Impl::send_child(const Child& c, aggregator::StoredFrame frame,
                                  const wire::FrameHeader& h) {
  down_.link.queue(down_.link.slot(c.id), std::move(frame), h);
  flush();
}

void Aggregator::Impl::send_children(const aggregator::StoredFrame& frame,
                                     const wire::FrameHeader& h) {
  for (const Child& c : down_.children) {
    if (c.live && !c.rejoin_pending) down_.link.queue(down_.link.slot(c.id), frame, h);
  }
  flush();
}

bool Aggregator::Impl::flush() {
  pump_serving();
  if (pace_waiting_) send_paces();
  down_.link.flush([this](const wire::FrameHeader& h, size_t bytes) {
    // Replicas are not round traffic (summary_.replica_bytes counts them).
    if (h.type != wire::MsgType::kCheckpoint) ledger_.charge_frame(h, bytes, round_);
  });
  (void)role_->flush();  // what waits to go up
  pump_upload();
  return outboxes_empty();
}

bool Aggregator::Impl::outboxes_empty() const {
  return role_->waiting() == 0 && down_.link.empty();
}

void Aggregator::Impl::refuse(const std::string& peer, const std::string& reason, bool count) {
  if (count) summary_.rejected_frames += 1;
  if (count) metrics_.refused += 1;
  // A child can provoke refusals at will: logged, audited and answered at
  // a bounded rate (the rest are counted in the summary entries).
  if (!security_->audit_noise("refusal", security::noise_key("refusal:" + peer, reason),
                              {{"peer", peer}, {"round", round_}, {"reason", reason}},
                              "[agg:" + self_.id + "] refused '" + peer + "': " + reason)) {
    return;
  }
  try {
    // Best effort and never queued: a refused peer may not be reading.
    (void)down_.link.link().try_send(peer, node::reject_frame(topo_, self_.index, round_, reason));
  } catch (const Error& e) {
    // An unknown or vanished peer cannot be told; the refusal is logged.
    log().debug("[agg:{}] could not deliver refusal to '{}': {}", self_.id, peer, e.what());
  }
}

void Aggregator::Impl::clear_outbox(const Child& c) {
  down_.link.outbox(down_.link.slot(c.id)).clear();
}

void Aggregator::Impl::send_done(uint64_t rounds) {
  // A child waiting for a round boundary (a newcomer that came in the last
  // round) gets none: it is handed the final model before the end.
  welcome_pending();
  for (const Child& c : down_.children) {
    wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kDone, rounds);
    send_child(c, node::make_frame(h, {}), h);
  }
}

// ---- event loop ---------------------------------------------------------------

AggregatorSummary Aggregator::Impl::run() {
  // Lines logged while it runs carry its id and round.
  LogScope scope(self_.id, &round_);
  if (!repl_.recovered) {
    repl_.recovered = true;
    recover();
  }
  // A resumed node is past joining: its round has the round timeout.
  clock_.phase_deadline =
      Clock::now() + (phase_ == Phase::kJoining ? opt_.join_timeout : cfg_.round_timeout);
  while (phase_ != Phase::kDone) {
    if (stop_requested.load()) throw StoppedError("aggregator '" + self_.id + "' stopped");
    // Replica pieces wait for room in a window like frames in an outbox.
    bool serving = uploading();
    for (const Serving& s : repl_.serving) serving = serving || s.reader != nullptr;
    const bool pending = !flush() || serving;
    std::vector<transport::Transport::Interest> interests = {{&down_.link.link().socket()}};
    role_->watch(&interests);
    // A server socket cannot signal room for one particular child, so while
    // frames wait the loop polls briefly instead of sleeping.
    // Frames the link read ahead are no longer the socket's to signal.
    const Millis wait = down_.link.link().holding() ? Millis(0) : pending ? Millis(2) : kPoll;
    (void)transport_->wait(interests, wait);
    // What this turn does may block for long (an update recorded, a
    // child's replica stored, on a disk slow to flush): its peers go on
    // hearing from it, a busy heartbeat each period (common/keep_alive.hpp).
    const KeepAlive keep = keep_alive();
    timers_.poll();
    transport::Incoming in;
    // Drain a bounded batch per socket so neither side starves the other.
    for (int i = 0; i < 64 && down_.link.link().recv(&in, Millis(0)); ++i) on_child_frame(in);
    role_->receive(in);  // from the parent, or the standby
    maybe_finish();
    check_deadlines();
    if (membership_.report_due) {
      membership_.report_due = false;
      role_->report_membership();
    }
  }
  deliver_the_rest();
  costs_stopped();
  update_metrics();
  summary_.rejected_frames += down_.link.link().counters().rejected;
  summary_.security_mode = security_->plaintext() ? "plaintext" : "mtls/" + opt_.security.cipher;
  summary_.handshake_ms = security_->handshake_ms();
  security_->tick(/*all=*/true);
  summary_.alarms = security_->alarms();
  if (cfg_.privacy.on()) {
    summary_.privacy_epsilon = gaussian_epsilon(cfg_.privacy.noise_multiplier,
                                                std::min(round_, cfg_.rounds), cfg_.privacy.delta);
  }
  if (acc_) {
    summary_.privacy_clipped = acc_->privacy_clipped();
    summary_.chunks_parked = acc_->chunks_parked();
    summary_.parked_bytes = acc_->bytes_parked();
  }
  // The per-round buffers go before the final model is handed over, which
  // moves: the summary never holds a second copy of it.
  acc_.reset();
  anchors_ = {};
  role_->summarize(summary_);  // the root's final model
  return std::move(summary_);
}

void Aggregator::Impl::deliver_the_rest() {
  // What is still queued (the last anchors, done, telemetry), within the
  // finish wait.
  const auto deadline = Clock::now() + cfg_.finish_wait;
  while (!flush() && Clock::now() < deadline) {
    (void)transport_->wait({&down_.link.link().socket()}, Millis(2), /*for_send=*/true);
  }
  for (size_t i = 0; i < down_.children.size(); ++i) {
    log().debug("[agg:{}] sent {} frames to '{}'", self_.id, down_.link.outbox(i).sent(),
                down_.children[i].id);
  }
  if (!outboxes_empty()) {
    log().warn("[agg:{}] {} frames were not delivered before shutdown", self_.id,
               role_->waiting() + down_.link.waiting());
  }
}

void Aggregator::Impl::maybe_finish() {
  if (phase_ != Phase::kDraining) return;
  bool reported = book_.nothing_owed();
  if (!reported && Clock::now() >= clock_.finish_deadline) {
    // A child that was lost never reports its traffic: report without it.
    log().warn("[agg:{}] reporting the last rounds without some children's traffic", self_.id);
    book_.report_without_lost();
    for (uint64_t r : book_.owed()) role_->report(r);
    reported = true;
  }
  if (!reported) return;
  // Children that left or paused hold no final model to confirm.
  const std::string missing = down_.children.unconfirmed_members();
  if (!missing.empty()) {
    if (Clock::now() < clock_.finish_deadline) return;
    log().warn("[agg:{}] finishing although {} did not confirm the final model", self_.id, missing);
  }
  role_->finished();  // the end, to the parent or the standby
  phase_ = Phase::kDone;
}

void Aggregator::Impl::check_deadlines() {
  const auto now = Clock::now();
  for (size_t i = 0; i < down_.children.size(); ++i) {
    const Outbox& box = down_.link.outbox(i);
    if (!down_.children[i].live || ended_with(down_.children[i])) continue;
    // A child that does not read is as good as gone: stop waiting for it.
    // One that says it is busy is waited for, up to a round's timeout.
    if (box.stuck(now, cfg_.heartbeat_timeout)) {
      log().warn("[agg:{}] '{}' has not read for {} ms ({} frames waiting)", self_.id,
                 down_.children[i].id, cfg_.heartbeat_timeout.count(), box.size());
      child_lost(down_.children[i]);
    } else if (box.held(now, cfg_.round_timeout)) {
      log().warn("[agg:{}] '{}' has said it was busy and not read for {} ms ({} frames waiting)",
                 self_.id, down_.children[i].id, cfg_.round_timeout.count(), box.size());
      child_lost(down_.children[i]);
    }
  }
  role_->check_stuck(now);  // the parent reads
  if (now < clock_.phase_deadline || role_->passive()) return;
  std::string missing;
  auto add = [&](const std::string& id) { missing += (missing.empty() ? "" : ", ") + id; };
  switch (phase_) {
    case Phase::kJoining:
      for (const Child& c : down_.children) {
        if (!c.joined && !c.late) add(c.id);
      }
      throw TimeoutError("aggregator '" + self_.id + "': children did not join within " +
                         std::to_string(opt_.join_timeout.count() / 1000) + " s: " + missing);
    case Phase::kTraining: {
      const aggregator::RoundWait w = round_wait();
      for (const std::string& id : w.waiting_for) add(id);
      if (w.state == aggregator::RoundWait::State::kNever) add("nobody who can come: " + w.reason);
      if (missing.empty()) {
        for (uint32_t idx : acc_->missing_children()) add(topo_.node(idx).id);
      }
      throw TimeoutError("aggregator '" + self_.id + "': round " + std::to_string(round_) +
                         " did not complete within " +
                         std::to_string(cfg_.round_timeout.count() / 1000) +
                         " s; still waiting for: " + missing);
    }
    case Phase::kAwaitWelcome:
    case Phase::kAwaitAnchor:
      throw TimeoutError("aggregator '" + self_.id + "': no answer from " + role_->awaited() +
                         " within " + std::to_string(cfg_.round_timeout.count() / 1000) + " s");
    case Phase::kDraining:
      throw TimeoutError("aggregator '" + self_.id +
                         "': regions did not report the traffic "
                         "of the last round");
    case Phase::kDone: return;
  }
}

void Aggregator::Impl::on_child_frame(transport::Incoming& in) {
  if (role_->own_frame(in)) return;        // a standby: the active root's checkpoints
  if (!role_->may_serve(in.peer)) return;  // a passive standby while the root lives
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, model_.limits);
  const std::optional<size_t> slot = down_.link.find(in.peer);
  if (!slot) {
    refuse(in.peer, "node '" + in.peer + "' is not a child of '" + self_.id + "' in topology " +
                        topo_.digest_hex().substr(0, 12));
    return;
  }
  Child& c = down_.children[*slot];
  if (c.removed) {
    refuse(c.id, "'" + c.id + "' was removed from the federation (topology version " +
                     std::to_string(topo_.version()) + ")");
    return;
  }
  c.last_heard = Clock::now();
  costs_.recorder.received(c.id, in.message.size());
  c.bytes_received += in.message.size();
  if (!f.ok()) {
    ledger_.charge(round_, in.message.size(), in.message.size());
    summary_.rejected_frames += 1;
    metrics_.malformed += 1;
    security_->log_noise(security::noise_key("malformed:" + c.id, f.detail),
                         "[agg:" + self_.id + "] dropped malformed frame from '" + c.id +
                             "': " + wire::reject_reason_name(f.reject) + " (" + f.detail + ")");
    return;
  }
  if (f.header.type != wire::MsgType::kCheckpoint) {
    ledger_.charge_frame(f.header, in.message.size(), round_);
  }
  c.last_round = f.header.round;
  if (f.header.job_id != topo_.job_id()) {
    refuse(c.id, "frame for another federation (job id mismatch); check the topology's job");
    return;
  }
  if (f.header.sender != c.index) {
    refuse(c.id, "sender id " + std::to_string(f.header.sender) + " does not match node '" + c.id +
                     "' (id " + std::to_string(c.index) + ")");
    return;
  }
  switch (f.header.type) {
    case wire::MsgType::kHello:
      if (f.header.flags & wire::kFlagNeedReplica) {
        serve_replica(c, f);
      } else if (phase_ == Phase::kJoining) {
        on_hello(c, f);
      } else {
        on_rejoin(c, f);
      }
      break;
    case wire::MsgType::kHeartbeat:  // liveness (last_heard, above), and membership
      c.heartbeats += 1;
      // Busy writing its checkpoint: alive, and not reading for a while.
      if (f.header.flags & wire::kFlagBusy) down_.link.outbox(*slot).peer_busy(c.last_heard);
      if (f.header.flags & (wire::kFlagLeaving | wire::kFlagPausing | wire::kFlagMembership)) {
        on_membership(c, f);
      }
      break;
    case wire::MsgType::kDelta: on_delta(c, f, aggregator::delta_facts(in.inspected, f)); break;
    case wire::MsgType::kTelemetry: on_telemetry(c, f); break;
    case wire::MsgType::kCheckpoint: on_child_checkpoint(c, f); break;
    case wire::MsgType::kDone:
      c.confirmed_end = true;
      maybe_finish();
      break;
    case wire::MsgType::kReject:
      security_->log_noise(
          "reports:" + c.id,
          "[agg:" + self_.id + "] child '" + c.id + "' reports: " +
              std::string(reinterpret_cast<const char*>(f.payload), f.payload_size));
      break;
    default:
      refuse(c.id,
             std::string("unexpected ") + wire::msg_type_name(f.header.type) + " from a child");
  }
}

// ---- public facade ----------------------------------------------------------------

Aggregator::Aggregator(AggregatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
Aggregator::~Aggregator() = default;
AggregatorSummary Aggregator::run() { return impl_->run(); }
void Aggregator::stop() { impl_->stop_requested.store(true); }

}  // namespace fedwan
