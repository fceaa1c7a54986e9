// The root's standby (aggregator/standby_role.hpp): passive, it keeps the
// active root's checkpoints and serves them back; it takes over when the
// root is silent and a child comes to it.
#include "aggregator/standby_role.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "aggregator/child_claims.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "checkpoint/stream_check.hpp"
#include "common/log.hpp"
#include "common/stall_clock.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {
namespace fs = std::filesystem;

Aggregator::Impl::StandbyRole::StandbyRole(Impl& node)
    : RootRole(node), root_heard_(Clock::now()) {}

bool Aggregator::Impl::StandbyRole::recover(bool resumed) {
  // A standby whose directory holds its own root checkpoint took over
  // before: it starts as the active root.
  if (!resumed) {
    passive_ = true;  // until the root dies
    log().info("[agg:{}] standby: keeping the root's checkpoints until it is needed", n_.self_.id);
  }
  return resumed;
}

void Aggregator::Impl::StandbyRole::summarize(AggregatorSummary& s) {
  // A standby that never took over has no model of the federation.
  if (!passive_) RootRole::summarize(s);
}

void Aggregator::Impl::StandbyRole::heartbeat(Clock::time_point now) {
  RootRole::heartbeat(now);
  if (!passive_) return;
  // The standby's heartbeat, so the root knows it is there.
  wire::FrameHeader h =
      node::node_header(n_.topo_, n_.self_.index, wire::MsgType::kHeartbeat, n_.round_);
  try {
    (void)n_.down_.link.link().try_send(n_.self_.id, node::make_frame(h, {}));
  } catch (const Error&) {
    // The root is not connected (yet, or any more).
  }
}

bool Aggregator::Impl::StandbyRole::own_frame(transport::Incoming& in) {
  if (in.peer != n_.self_.id) return false;
  on_root_frame(in);  // the active root, streaming its checkpoints
  return true;
}

void Aggregator::Impl::StandbyRole::on_root_frame(transport::Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size, n_.model_.limits);
  if (!f.ok() || f.header.job_id != n_.topo_.job_id() || f.header.sender != n_.self_.index) {
    log().warn("[agg:{}] dropped a frame from the root: {}", n_.self_.id,
               f.ok() ? "wrong job or sender" : f.detail);
    return;
  }
  if (!passive_) {
    // Two roots must never serve one federation: the one that comes back
    // after this standby took over is told to stop.
    n_.refuse(n_.self_.id, "the standby at " + n_.self_.standby_endpoint +
                               " took over as root at round " + std::to_string(n_.round_) +
                               "; this root must stop (restart it as the standby, see "
                               "docs/operations.md)");
    return;
  }
  root_heard_ = Clock::now();
  root_seen_ = true;
  if (f.header.type == wire::MsgType::kDone && n_.phase_ != Phase::kDone) {
    log().info("[agg:{}] standby: the root finished the federation (round {}); stopping",
               n_.self_.id, f.header.round);
    n_.security_->audit("standby_done", {{"round", f.header.round}});
    n_.phase_ = Phase::kDone;
    return;
  }
  if (f.header.type == wire::MsgType::kHello && (f.header.flags & wire::kFlagNeedReplica)) {
    serve_root_replica();
    return;
  }
  if (f.header.type != wire::MsgType::kCheckpoint || f.header.flags != 0) return;
  const wire::FrameHeader& h = f.header;
  n_.summary_.replica_bytes += f.payload_size;
  // The root is this node's own identity; its checkpoints are bounded as a
  // child's are once the model's size is known.
  n_.repl_.store->set_max_bytes(
      aggregator::replica_max_bytes(n_.opt_.replica_max_bytes, n_.model_.elements));
  const checkpoint::ReplicaStore::Result r =
      n_.repl_.store->add_piece(n_.self_.id, h.round, h.chunk_index, h.chunk_count,
                                h.total_elements, f.payload, f.payload_size);
  using Kind = checkpoint::ReplicaStore::Result::Kind;
  if (r.kind == Kind::kRefused) {
    log().warn("[agg:{}] standby refused a root checkpoint: {}", n_.self_.id, r.detail);
    n_.security_->audit("replica_refused",
                        {{"peer", n_.self_.id}, {"round", h.round}, {"reason", r.detail}});
  }
  if (r.kind != Kind::kStored) return;
  n_.summary_.replicas_stored += 1;
  log().info("[agg:{}] standby holds the root's checkpoint of round {}", n_.self_.id, r.round);
  n_.security_->audit(
      "replica_stored",
      {{"peer", n_.self_.id}, {"round", r.round}, {"bytes", r.bytes}, {"digest", r.digest_hex}});
  try {
    (void)n_.down_.link.link().try_send(n_.self_.id,
                                        n_.checkpoint_signal(r.round, wire::kFlagReplicaStored));
  } catch (const Error& e) {
    log().warn("[agg:{}] could not acknowledge the root's checkpoint: {}", n_.self_.id, e.what());
  }
}
void Aggregator::Impl::StandbyRole::serve_root_replica() {
  std::optional<fs::path> path = n_.repl_.store->latest(n_.self_.id);
  checkpoint::CheckpointIdentity id;
  if (path && checkpoint::check_checkpoint_stream(*path, n_.self_.id, n_.topo_.lineage_digest(),
                                                  &id, n_.repl_.store->signer_check(n_.self_.id))) {
    path.reset();
  }
  try {
    if (!path) {
      log().warn("[agg:{}] standby: the root asked for its checkpoint; none is kept here",
                 n_.self_.id);
      n_.security_->audit("replica_missing", {{"peer", n_.self_.id}});
      (void)n_.down_.link.link().try_send(n_.self_.id,
                                          n_.checkpoint_signal(0, wire::kFlagNoReplica));
      return;
    }
    checkpoint::PieceReader reader(*path, n_.cfg_.upload_piece_bytes());
    log().warn("[agg:{}] standby: sending the root its checkpoint of round {} ({} bytes)",
               n_.self_.id, id.round, reader.size());
    n_.security_->audit("replica_served", {{"peer", n_.self_.id},
                                           {"round", id.round},
                                           {"bytes", reader.size()},
                                           {"path", path->string()}});
    // A passive standby serves nothing else meanwhile: send in one go.
    while (!reader.done()) {
      (void)n_.down_.link.link().send(
          n_.self_.id, checkpoint::piece_frame(n_.topo_, n_.self_.index, id.round, reader).first,
          n_.cfg_.heartbeat_timeout);
    }
  } catch (const Error& e) {
    // The root asks again after a while.
    log().warn("[agg:{}] standby: could not send the root its checkpoint: {}", n_.self_.id,
               e.what());
  }
}

void Aggregator::Impl::StandbyRole::not_listening(Clock::duration d, Clock::time_point now) {
  RootRole::not_listening(d, now);
  // The root's heartbeats wait unread meanwhile: a standby that was away
  // (writing the root's checkpoint) does not take the root for dead.
  StallClock::credit(root_heard_, d, now);
}

bool Aggregator::Impl::StandbyRole::may_serve(const std::string& peer) {
  if (!passive_) return true;
  const auto silent = Clock::now() - root_heard_;
  // A root it never heard from and holds no checkpoint of may merely be
  // slow to start (its children, quicker, try the standby in turn): two
  // roots would then serve one federation. It is given the join timeout.
  const bool root_known =
      root_seen_ || (n_.repl_.store && n_.repl_.store->latest(n_.self_.id).has_value());
  const auto patience = root_known ? n_.cfg_.heartbeat_timeout
                                   : std::max<std::chrono::milliseconds>(n_.cfg_.heartbeat_timeout,
                                                                         n_.opt_.join_timeout);
  if (silent <= patience) {
    log().debug("[agg:{}] standby: '{}' came, but the root is alive; not serving", n_.self_.id,
                peer);
    return false;
  }
  take_over(peer);
  return true;
}

void Aggregator::Impl::StandbyRole::take_over(const std::string& asker) {
  std::optional<fs::path> path = n_.repl_.store->latest(n_.self_.id);
  uint64_t round = 0;
  if (path) {
    // Installed as this node's own checkpoint, then resumed like a root
    // restarting from its disk.
    const checkpoint::CheckpointTrust trust =
        checkpoint::checkpoint_trust(*n_.security_, n_.topo_, n_.self_);
    // Copied from file to file: the model never in memory here.
    Checkpoint c = read_checkpoint(*path, trust.check, {checkpoint::kRestoreOnDiskFrom});
    round = c.round;
    checkpoint::save_node_checkpoint(n_.opt_.checkpoint_dir, c, trust);
  }
  passive_ = false;
  n_.summary_.took_over = true;
  log().warn("[agg:{}] standby taking over as root: the root is silent and '{}' came; resuming "
             "{}",
             n_.self_.id, asker,
             path ? "from its checkpoint of round " + std::to_string(round) : "from the start");
  n_.security_->audit(
      "takeover",
      {{"asker", asker}, {"round", round}, {"replica", path ? path->string() : std::string()}});
  if (!path || !n_.resume_from_checkpoint()) {
    // From the initial model: what the root accepted before is not in it
    // (the audit's reader discards the root's acceptances from round 0 on).
    n_.security_->audit("resumed", {{"round", n_.round_}, {"path", std::string()}});
    n_.phase_ = Phase::kJoining;
    n_.clock_.phase_deadline = Clock::now() + n_.opt_.join_timeout;
  }
}

}  // namespace fedwan
