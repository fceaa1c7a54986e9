// Aggregator, checkpoints: one at each round boundary (the model, the
// outer optimizer's state, membership, the round's bookkeeping), resuming
// from it after a restart, and the copies of accepted updates kept for
// audit (--record-updates).
#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/role.hpp"
#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "common/atomic_file.hpp"
#include "common/keep_alive.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "common/stall_clock.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {
namespace fs = std::filesystem;

// ---- checkpoints --------------------------------------------------------------

void Aggregator::Impl::save_checkpoint() {
  if (opt_.checkpoint_dir.empty()) return;
  // Seconds at a billion parameters, on its loop: its peers go on hearing
  // from it (a busy heartbeat each period) and do not take it for lost.
  const KeepAlive keep = keep_alive();
  Checkpoint c;
  c.round = round_;  // the round a resumed node opens
  c.topology_digest = topo_.lineage_digest();
  c.node_id = self_.id;
  nlohmann::json meta = {{"role", role_name(self_.role)}, {"elements", model_.elements}};
  role_->save(c, meta);  // the root's model and optimizer, a region's anchor
  // The audit log's head as of this checkpoint: a restart checks it is
  // still there (a log cut back behind the checkpoint raises an alarm).
  meta["membership"] = membership_json();
  if (const auto head = security_->audit_head()) {
    meta["audit_seq"] = head->seq;
    meta["audit_hash"] = head->hash;
  }
  const std::string m = meta.dump();
  c.sections.push_back(checkpoint::bytes_section("meta", std::vector<uint8_t>(m.begin(), m.end())));
  const auto t0 = Clock::now();
  const checkpoint::CheckpointTrust trust = checkpoint::checkpoint_trust(*security_, topo_, self_);
  const checkpoint::SectionDigests digests =
      checkpoint::save_node_checkpoint(opt_.checkpoint_dir, c, trust);
  role_->saved(c, digests);
  // A region's parent keeps its replica image: the anchor it sent is left
  // out (named by the digest the checkpoint just took), the bf16 residual
  // goes in byte planes (checkpoint/replica_image.hpp), compressed as the
  // file is written.
  if (self_.role == fedwan::Role::kRegion && role_->replicates(round_)) {
    try {
      checkpoint::save_replica_image(opt_.checkpoint_dir, c,
                                     {"anchor", {}, {"residual"}, {"residual.bf16"}}, trust,
                                     checkpoint::section_digest(c, digests, "anchor"));
    } catch (const Error& e) {
      log().warn("[agg:{}] cannot write its replica image of round {}: {}", self_.id, round_,
                 e.what());
    }
  }
  summary_.checkpoints_written += 1;
  metrics_.last_checkpoint = Clock::now();
  not_listening(t0);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  log().info("[agg:{}] checkpoint of round {} written in {:.1f} ms", self_.id, round_, ms);
  security_->audit("checkpoint",
                   {{"round", round_},
                    {"path", checkpoint::checkpoint_path(opt_.checkpoint_dir, self_.id)},
                    {"ms", ms}});
}

void Aggregator::Impl::not_listening(Clock::time_point since) {
  // The silence of its peers while this node wrote (seconds, for a large
  // model on a busy disk) is its own: it would otherwise lose children that
  // kept talking, and they their parent, at every slow checkpoint. The
  // heartbeat timer's next tick counts from here, not crediting it twice.
  const auto now = Clock::now();
  credit_silence(now - since, now, /*parent_too=*/true);
  clock_.ticks.reset(now);
}

KeepAlive Aggregator::Impl::keep_alive() {
  return KeepAlive(
      cfg_.heartbeat, [this] { busy_beat(); }, cfg_.busy_limit());
}

void Aggregator::Impl::busy_beat() {
  const wire::FrameHeader h = [this] {
    wire::FrameHeader b = node::node_header(topo_, self_.index, wire::MsgType::kHeartbeat, round_);
    b.flags = wire::kFlagBusy;
    return b;
  }();
  const std::vector<uint8_t> frame = node::make_frame(h, {});
  for (const Child& c : down_.children) {
    if (!c.live || !c.joined) continue;
    try {
      (void)down_.link.link().try_send(c.id, frame);
    } catch (const Error&) {
      // Not connected right now: nothing to keep alive.
    }
  }
  role_->busy_beat();
}

void Aggregator::Impl::credit_silence(Clock::duration d, Clock::time_point now, bool parent_too) {
  for (Child& c : down_.children) StallClock::credit(c.last_heard, d, now);
  role_->not_listening(d, now);  // the root's standby, a standby's root
  session::Uplink* up = role_->uplink();
  if (up != nullptr && parent_too) up->session().not_listening(d, now);
}

bool Aggregator::Impl::resume_from_checkpoint() {
  if (opt_.checkpoint_dir.empty()) return false;
  auto loaded = checkpoint::load_node_checkpoint(
      opt_.checkpoint_dir, topo_, self_.id, checkpoint::checkpoint_trust(*security_, topo_, self_));
  if (!loaded) {
    role_->no_checkpoint();  // the root: throws when starting over would redo rounds
    return false;
  }
  const Checkpoint& c = loaded->checkpoint;
  round_ = c.round;
  role_->restore(c, loaded->path.string());
  summary_.resumed_from_round = round_;
  std::vector<float>().swap(opt_.initial_model);  // a region's: the checkpoint holds its anchor
  security_->audit("resumed", {{"round", round_}, {"path", loaded->path.string()}});
  checkpoint::check_recorded_audit_head(c, *security_);
  const auto now = Clock::now();
  // Who counted when the checkpoint was taken; without a record (an older
  // checkpoint), every child that is not late_join.
  for (Child& c2 : down_.children) {
    c2.member = !c2.late;
    c2.away = c2.member ? Away::kNo : Away::kNotYet;
  }
  if (const nlohmann::json j = checkpoint::checkpoint_meta(c); j.contains("membership")) {
    restore_membership(j["membership"]);
  }
  for (Child& c2 : down_.children) {
    // Members come back by saying hello; until then the round waits for
    // them as if they were there, and the heartbeat timeout judges them.
    // The others join again as newcomers.
    c2.joined = c2.member;
    c2.welcomed = false;
    c2.live = c2.member;
    c2.last_heard = now;
  }
  if (round_ >= cfg_.rounds) {
    phase_ = Phase::kDraining;
    clock_.phase_deadline = now + cfg_.round_timeout;
    clock_.finish_deadline = now + cfg_.finish_wait;
    return true;
  }
  clock_.round_started = now;
  book_.resume_at(round_);
  open_round(round_);
  role_->resumed();  // a region says hello to its parent
  return true;
}

void Aggregator::Impl::record_update(const uint8_t* payload, size_t size,
                                     const std::string& sha_hex) {
  if (opt_.record_updates_dir.empty()) return;
  const fs::path p = fs::path(opt_.record_updates_dir) / sha_hex;
  std::error_code ec;
  if (fs::exists(p, ec)) return;
  fs::create_directories(opt_.record_updates_dir, ec);
  write_file_atomic(p, std::string_view(reinterpret_cast<const char*>(payload), size), 0600);
}

}  // namespace fedwan
