// Aggregator, checkpoint replication: the checkpoints children send up are
// kept as replicas (the last few per child, docs/operations.md#recovery) and
// streamed back to a child that asks after losing its own; this node's
// checkpoint goes up to its parent, or from the root to its standby; the
// standby keeps the root's checkpoints and takes over when the root dies.
// Pieces are chunk_bytes each and leave only when no frame of the round
// protocol waits, so replication never delays a round.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/child_claims.hpp"
#include "checkpoint/checkpoint_upload.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {
namespace fs = std::filesystem;

std::vector<uint8_t> Aggregator::Impl::checkpoint_signal(uint64_t round, uint8_t flag) const {
  wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kCheckpoint, round);
  h.flags = flag;
  return make_frame(h, {});
}

// ---- replicas of children ------------------------------------------------------

void Aggregator::Impl::on_child_checkpoint(Child& c, const wire::ParsedFrame& f) {
  const wire::FrameHeader& h = f.header;
  if (h.flags != 0) return;  // signals go down, never up
  if (!repl_.store) {
    security_->log_noise("no-replicas:" + c.id,
                         "[agg:" + self_.id + "] '" + c.id +
                             "' sent a checkpoint, but this node keeps no replicas (no "
                             "--checkpoint-dir); dropped");
    return;
  }
  summary_.replica_bytes += f.payload_size;
  if (h.round > round_ + aggregator::kReplicaRoundSlack) {
    // A child checkpoints rounds it reached through this node.
    repl_.store->abandon(c.id);
    if (h.chunk_index == 0) {
      const std::string why = "a checkpoint of round " + std::to_string(h.round) +
                              ", while this node is at round " + std::to_string(round_);
      security_->audit_noise("replica_refused", "replica_refused:" + c.id,
                             {{"peer", c.id}, {"round", h.round}, {"reason", why}},
                             "[agg:" + self_.id + "] refused the checkpoint '" + c.id +
                                 "' sent: " + why);
    }
    return;
  }
  const checkpoint::ReplicaStore::Result r = repl_.store->add_piece(
      c.id, h.round, h.chunk_index, h.chunk_count, h.total_elements, f.payload, f.payload_size);
  using Kind = checkpoint::ReplicaStore::Result::Kind;
  if (r.kind == Kind::kPartial) return;
  if (r.kind == Kind::kRefused) {
    security_->audit_noise("replica_refused", "replica_refused:" + c.id,
                           {{"peer", c.id}, {"round", h.round}, {"reason", r.detail}},
                           "[agg:" + self_.id + "] refused the checkpoint '" + c.id +
                               "' sent for round " + std::to_string(h.round) + ": " + r.detail);
    return;
  }
  summary_.replicas_stored += 1;
  log().info("[agg:{}] kept the checkpoint of '{}' for round {} ({} bytes)", self_.id, c.id,
             r.round, r.bytes);
  security_->audit(
      "replica_stored",
      {{"peer", c.id}, {"round", r.round}, {"bytes", r.bytes}, {"sha256", r.sha256_hex}});
  wire::FrameHeader ack = node_header(topo_, self_.index, wire::MsgType::kCheckpoint, r.round);
  ack.flags = wire::kFlagReplicaStored;
  send_child(c, checkpoint_signal(r.round, wire::kFlagReplicaStored), ack);
}

void Aggregator::Impl::serve_replica(Child& c, const wire::ParsedFrame& f) {
  wire::HelloPayload hello;
  if (!wire::decode_hello(f.payload, f.payload_size, &hello) || hello.node_id != c.id ||
      !knows_topology(hello.topology_digest)) {
    refuse(c.id, "replica request does not match this federation (node or topology)");
    return;
  }
  clear_outbox(c);
  Serving& s = repl_.serving[down_.link.slot(c.id)];
  s.reader.reset();
  std::optional<fs::path> path = repl_.store ? repl_.store->latest(c.id) : std::nullopt;
  checkpoint::CheckpointIdentity id;
  if (path && checkpoint::check_checkpoint_stream(*path, c.id, topo_.lineage_digest(), &id,
                                                  repl_.store->signer_check(c.id))) {
    path.reset();
  }
  if (!path) {
    log().info("[agg:{}] '{}' asked for its replica; none is kept here", self_.id, c.id);
    security_->audit("replica_missing", {{"peer", c.id}});
    wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kCheckpoint, 0);
    h.flags = wire::kFlagNoReplica;
    send_child(c, checkpoint_signal(0, wire::kFlagNoReplica), h);
    return;
  }
  s.reader = std::make_unique<checkpoint::PieceReader>(*path, cfg_.piece_bytes());
  s.round = id.round;
  log().info("[agg:{}] sending '{}' its replica of round {} ({} bytes)", self_.id, c.id, id.round,
             s.reader->size());
  security_->audit(
      "replica_served",
      {{"peer", c.id}, {"round", id.round}, {"bytes", s.reader->size()}, {"path", path->string()}});
  flush();
}

void Aggregator::Impl::pump_serving() {
  for (size_t i = 0; i < repl_.serving.size(); ++i) {
    Serving& s = repl_.serving[i];
    const Outbox& box = down_.link.outbox(i);
    // Two pieces in the outbox at most: a replica never sits in memory.
    while (s.reader && box.size() < 2) {
      if (s.reader->done()) {
        s.reader.reset();
        break;
      }
      auto [frame, h] = checkpoint::piece_frame(topo_, self_.index, s.round, *s.reader);
      down_.link.queue(i, std::make_shared<const std::vector<uint8_t>>(std::move(frame)), h);
    }
  }
}

// ---- this node's checkpoint, sent up ---------------------------------------------

void Aggregator::Impl::start_upload() {
  if (opt_.checkpoint_dir.empty()) return;
  const uint64_t every = cfg_.replica_every;
  // The root replicates every round to its standby (which takes over from
  // it); other nodes every replica_every rounds to a parent that keeps them.
  const bool wanted = is_root_
                          ? standby_.link != nullptr
                          : up_.uplink->parent_keeps_replicas() && every > 0 && round_ % every == 0;
  if (!wanted) return;
  if (!repl_.upload)
    repl_.upload = std::make_unique<checkpoint::CheckpointUpload>(topo_, self_.index);
  try {
    repl_.upload->start(checkpoint::checkpoint_path(opt_.checkpoint_dir, self_.id), round_,
                        cfg_.piece_bytes());
  } catch (const Error& e) {
    log().warn("[agg:{}] cannot send its checkpoint: {}", self_.id, e.what());
  }
}

void Aggregator::Impl::pump_upload() {
  if (!uploading()) return;
  ParentLink* link = is_root_ ? standby_.link.get() : &up_.uplink->link();
  if (link == nullptr) return;
  // Behind everything of the round protocol.
  if (!is_root_ && (!up_.out.empty() || !up_.welcomed || up_.full_pending)) return;
  repl_.upload->pump(*link);
}

// ---- the root and its standby ----------------------------------------------------

void Aggregator::Impl::standby_missing(const std::string& why) {
  if (standby_.warned) return;
  standby_.warned = true;
  log().warn("[agg:{}] its standby at {}: {}; rounds go on without it (a takeover now would "
             "redo them)",
             self_.id, self_.standby_endpoint, why);
  security_->audit("standby_lost", {{"round", round_}, {"reason", why}});
}

void Aggregator::Impl::on_standby_frame(Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, limits_);
  if (!f.ok() || f.header.job_id != topo_.job_id() || f.header.sender != self_.index) {
    log().warn("[agg:{}] dropped a frame from its standby: {}", self_.id,
               f.ok() ? "wrong job or sender" : f.detail);
    return;
  }
  standby_.heard = Clock::now();
  if (!standby_.seen) {
    log().info("[agg:{}] its standby at {} is up", self_.id, standby_.link->endpoint());
    if (standby_.warned) security_->audit("standby_back", {{"round", round_}});
    standby_.seen = true;
    standby_.warned = false;
  }
  switch (f.header.type) {
    case wire::MsgType::kCheckpoint:
      if (f.header.flags == wire::kFlagReplicaStored) {
        standby_.acked = f.header.round;
        if (root_.held_back && f.header.round >= round_) release_held_back();
      }
      return;
    case wire::MsgType::kReject: {
      const std::string reason(reinterpret_cast<const char*>(f.payload), f.payload_size);
      security_->audit("fenced", {{"reason", reason}});
      throw ProtocolError("root '" + self_.id + "': its standby refused it: " + reason);
    }
    default: return;  // heartbeats
  }
}

void Aggregator::Impl::on_root_frame(Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, limits_);
  if (!f.ok() || f.header.job_id != topo_.job_id() || f.header.sender != self_.index) {
    log().warn("[agg:{}] dropped a frame from the root: {}", self_.id,
               f.ok() ? "wrong job or sender" : f.detail);
    return;
  }
  if (!standby_.passive) {
    // Two roots must never serve one federation: the one that comes back
    // after this standby took over is told to stop.
    refuse(self_.id, "the standby at " + self_.standby_endpoint + " took over as root at round " +
                         std::to_string(round_) +
                         "; this root must stop (restart it as the standby, see "
                         "docs/operations.md)");
    return;
  }
  standby_.root_heard = Clock::now();
  standby_.root_seen = true;
  if (f.header.type == wire::MsgType::kDone && phase_ != Phase::kDone) {
    log().info("[agg:{}] standby: the root finished the federation (round {}); stopping", self_.id,
               f.header.round);
    security_->audit("standby_done", {{"round", f.header.round}});
    phase_ = Phase::kDone;
    return;
  }
  if (f.header.type == wire::MsgType::kHello && (f.header.flags & wire::kFlagNeedReplica)) {
    serve_root_replica();
    return;
  }
  if (f.header.type != wire::MsgType::kCheckpoint || f.header.flags != 0) return;
  const wire::FrameHeader& h = f.header;
  summary_.replica_bytes += f.payload_size;
  const checkpoint::ReplicaStore::Result r = repl_.store->add_piece(
      self_.id, h.round, h.chunk_index, h.chunk_count, h.total_elements, f.payload, f.payload_size);
  using Kind = checkpoint::ReplicaStore::Result::Kind;
  if (r.kind == Kind::kRefused) {
    log().warn("[agg:{}] standby refused a root checkpoint: {}", self_.id, r.detail);
    security_->audit("replica_refused",
                     {{"peer", self_.id}, {"round", h.round}, {"reason", r.detail}});
  }
  if (r.kind != Kind::kStored) return;
  summary_.replicas_stored += 1;
  log().info("[agg:{}] standby holds the root's checkpoint of round {}", self_.id, r.round);
  security_->audit(
      "replica_stored",
      {{"peer", self_.id}, {"round", r.round}, {"bytes", r.bytes}, {"sha256", r.sha256_hex}});
  try {
    (void)down_.link.link().try_send(self_.id,
                                     checkpoint_signal(r.round, wire::kFlagReplicaStored));
  } catch (const Error& e) {
    log().warn("[agg:{}] could not acknowledge the root's checkpoint: {}", self_.id, e.what());
  }
}

void Aggregator::Impl::serve_root_replica() {
  std::optional<fs::path> path = repl_.store->latest(self_.id);
  checkpoint::CheckpointIdentity id;
  if (path && checkpoint::check_checkpoint_stream(*path, self_.id, topo_.lineage_digest(), &id,
                                                  repl_.store->signer_check(self_.id))) {
    path.reset();
  }
  try {
    if (!path) {
      log().warn("[agg:{}] standby: the root asked for its checkpoint; none is kept here",
                 self_.id);
      security_->audit("replica_missing", {{"peer", self_.id}});
      (void)down_.link.link().try_send(self_.id, checkpoint_signal(0, wire::kFlagNoReplica));
      return;
    }
    checkpoint::PieceReader reader(*path, cfg_.piece_bytes());
    log().warn("[agg:{}] standby: sending the root its checkpoint of round {} ({} bytes)", self_.id,
               id.round, reader.size());
    security_->audit("replica_served", {{"peer", self_.id},
                                        {"round", id.round},
                                        {"bytes", reader.size()},
                                        {"path", path->string()}});
    // A passive standby serves nothing else meanwhile: send in one go.
    while (!reader.done()) {
      (void)down_.link.link().send(
          self_.id, checkpoint::piece_frame(topo_, self_.index, id.round, reader).first,
          cfg_.heartbeat_timeout);
    }
  } catch (const Error& e) {
    // The root asks again after a while.
    log().warn("[agg:{}] standby: could not send the root its checkpoint: {}", self_.id, e.what());
  }
}

bool Aggregator::Impl::may_serve(const std::string& peer) {
  if (!standby_.passive) return true;
  const auto silent = Clock::now() - standby_.root_heard;
  // A root it never heard from and holds no checkpoint of may merely be
  // slow to start (its children, quicker, try the standby in turn): two
  // roots would then serve one federation. It is given the join timeout.
  const bool root_known =
      standby_.root_seen || (repl_.store && repl_.store->latest(self_.id).has_value());
  const auto patience =
      root_known ? cfg_.heartbeat_timeout
                 : std::max<std::chrono::milliseconds>(cfg_.heartbeat_timeout, opt_.join_timeout);
  if (silent <= patience) {
    log().debug("[agg:{}] standby: '{}' came, but the root is alive; not serving", self_.id, peer);
    return false;
  }
  take_over(peer);
  return true;
}

void Aggregator::Impl::take_over(const std::string& asker) {
  std::optional<fs::path> path = repl_.store->latest(self_.id);
  uint64_t round = 0;
  if (path) {
    // Installed as this node's own checkpoint, then resumed like a root
    // restarting from its disk.
    const checkpoint::CheckpointTrust trust =
        checkpoint::checkpoint_trust(*security_, topo_, self_);
    Checkpoint c = read_checkpoint(*path, trust.check);
    round = c.round;
    checkpoint::save_node_checkpoint(opt_.checkpoint_dir, c, trust);
  }
  standby_.passive = false;
  summary_.took_over = true;
  log().warn("[agg:{}] standby taking over as root: the root is silent and '{}' came; resuming "
             "{}",
             self_.id, asker,
             path ? "from its checkpoint of round " + std::to_string(round) : "from the start");
  security_->audit(
      "takeover",
      {{"asker", asker}, {"round", round}, {"replica", path ? path->string() : std::string()}});
  if (!path || !resume_from_checkpoint()) {
    phase_ = Phase::kJoining;
    phase_deadline_ = Clock::now() + opt_.join_timeout;
  }
}

}  // namespace fedwan
