// Aggregator, checkpoint replication: the checkpoints children send up are
// kept as replicas (the last few per child, docs/operations.md#recovery) and
// streamed back to a child that asks after losing its own; this node's
// checkpoint goes up to its parent, or from the root to its standby (the
// standby's side: standby_role.cpp).
// Pieces are a chunk's frame each (NodeConfig::upload_piece_bytes) and
// leave only when no frame of the round protocol waits, so replication
// never delays a round.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/child_claims.hpp"
#include "aggregator/role.hpp"
#include "checkpoint/checkpoint_upload.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {
namespace fs = std::filesystem;

std::vector<uint8_t> Aggregator::Impl::checkpoint_signal(uint64_t round, uint8_t flag) const {
  wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kCheckpoint, round);
  h.flags = flag;
  return node::make_frame(h, {});
}

// ---- replicas of children ------------------------------------------------------

checkpoint::ReplicaStore::Result Aggregator::Impl::refuse_replica_before_model(
    const std::string& child, uint64_t round) {
  repl_.store->abandon(child);
  checkpoint::ReplicaStore::Result r;
  r.kind = checkpoint::ReplicaStore::Result::Kind::kRefused;
  r.round = round;
  r.detail = "replica of '" + child + "' round " + std::to_string(round) +
             " refused: this node does not know the model's size yet, so not how large a "
             "replica may be (replica_max_bytes)";
  return r;
}

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
  repl_.reported[c.id] += f.payload_size;
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
  // As large as a child's checkpoint can be, and no larger: a child that
  // announces more cannot fill this node's disk with it.
  const uint64_t limit = aggregator::replica_max_bytes(opt_.replica_max_bytes, model_.elements);
  repl_.store->set_max_bytes(limit);
  const checkpoint::ReplicaStore::Result r =
      limit == 0 ? refuse_replica_before_model(c.id, h.round)
                 : repl_.store->add_piece(c.id, h.round, h.chunk_index, h.chunk_count,
                                          h.total_elements, f.payload, f.payload_size);
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
      {{"peer", c.id}, {"round", r.round}, {"bytes", r.bytes}, {"digest", r.digest_hex}});
  wire::FrameHeader ack =
      node::node_header(topo_, self_.index, wire::MsgType::kCheckpoint, r.round);
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
    wire::FrameHeader h = node::node_header(topo_, self_.index, wire::MsgType::kCheckpoint, 0);
    h.flags = wire::kFlagNoReplica;
    send_child(c, checkpoint_signal(0, wire::kFlagNoReplica), h);
    return;
  }
  s.reader = std::make_unique<checkpoint::PieceReader>(*path, cfg_.upload_piece_bytes());
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
  // The root to its standby every round, a region to a parent that keeps
  // replicas every replica_every rounds (Role::replicates).
  if (!role_->replicates(round_)) return;
  if (!repl_.upload)
    repl_.upload = std::make_unique<checkpoint::CheckpointUpload>(topo_, self_.index);
  try {
    if (self_.role == fedwan::Role::kRoot) {
      // The root's round commits once its standby holds this checkpoint
      // (root_role.cpp): the newest replaces one still on its way.
      repl_.upload->start(checkpoint::checkpoint_path(opt_.checkpoint_dir, self_.id), round_,
                          cfg_.upload_piece_bytes());
    } else {
      // A region's image (save_checkpoint); one on its way finishes first,
      // so one longer than a round still lands.
      repl_.upload->offer(checkpoint::replica_image_path(opt_.checkpoint_dir, self_.id), round_,
                          cfg_.upload_piece_bytes());
    }
  } catch (const Error& e) {
    log().warn("[agg:{}] cannot send its checkpoint: {}", self_.id, e.what());
  }
}

void Aggregator::Impl::restart_upload() {
  if (repl_.upload) repl_.upload->restart();
}

void Aggregator::Impl::pump_upload() {
  if (!uploading()) return;
  // Behind everything of the round protocol (null while something of it waits).
  transport::ParentLink* link = role_->replica_link();
  if (link == nullptr) return;
  repl_.upload->pump(*link);
}

}  // namespace fedwan
