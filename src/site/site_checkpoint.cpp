// SiteCore checkpoints: written at every round boundary (and on demand, at
// SIGTERM), read back by join() so a restarted site resumes where it was:
// the parameters it trained, the anchor of its round, the error-feedback
// residual, the data position and the caller's own blobs (inner optimizer).
// What goes to a parent that keeps replicas is the checkpoint's replica
// image (checkpoint/replica_image.hpp): the parent rebuilds the anchor, so
// the image holds the parameters against it, the residual to bf16 and the
// rest compressed. Reading them back is site_restore.cpp.
#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "site/site_impl.hpp"

namespace fedwan {
namespace {

using site::kResidualBf16;
using site::reserved_section;

const checkpoint::ReplicaPlan kReplicaPlan{"anchor", {"params"}, {"residual"}, {kResidualBf16}};

}  // namespace

// The site's state now, as a checkpoint whose sections view what they
// save (valid until the state changes).
Checkpoint SiteCore::Impl::state_checkpoint(bool on_anchor_known) {
  Checkpoint c;
  c.round = round;
  c.topology_digest = topo.lineage_digest();
  c.node_id = self.id;
  // At a round boundary the parameters are the anchor (unless overlapped):
  // said in the meta rather than written twice. Compared only where the
  // caller does not know it (a 400 MB read at 100M parameters).
  const bool on_anchor =
      anchor.size() == plan.total() &&
      (on_anchor_known || std::memcmp(params, anchor.data(), plan.total() * sizeof(float)) == 0);
  if (!on_anchor) c.sections.push_back(checkpoint::float_section("params", params, plan.total()));
  c.sections.push_back(checkpoint::float_section("anchor", anchor.data(), anchor.size()));
  if (opt.update_encoder && cfg.codec->id() != CodecId::kFp32) {
    // The encoder's own residual, in fp32 (read now, owned by the section).
    std::vector<uint8_t> r(plan.total() * sizeof(float));
    opt.update_encoder->read_residual(reinterpret_cast<float*>(r.data()), plan.total());
    c.sections.push_back(checkpoint::bytes_section("residual", std::move(r)));
  } else if (!residual.empty()) {
    CheckpointSection r;
    r.name = kResidualBf16;
    r.view = reinterpret_cast<const uint8_t*>(residual.data());
    r.view_size = residual.size() * sizeof(uint16_t);
    c.sections.push_back(std::move(r));
  } else {
    c.sections.push_back(checkpoint::float_section("residual", nullptr, 0));  // fp32: none
  }
  nlohmann::json meta_json = {{"role", "site"}, {"data_position", data_position}};
  if (on_anchor) meta_json["params_on_anchor"] = true;
  if (const auto head = security->audit_head()) {
    meta_json["audit_seq"] = head->seq;
    meta_json["audit_hash"] = head->hash;
  }
  const std::string meta = meta_json.dump();
  c.sections.push_back(
      checkpoint::bytes_section("meta", std::vector<uint8_t>(meta.begin(), meta.end())));
  if (opt.save_state) {
    for (StateBlob& b : opt.save_state()) {
      if (reserved_section(b.name) || !is_valid_checkpoint_section_name(b.name)) {
        throw ConfigError("site '" + self.id + "': state blob name '" + b.name +
                          "' is reserved or invalid; use 1..64 of [a-z0-9_.-]");
      }
      c.sections.push_back(checkpoint::bytes_section(b.name, std::move(b.bytes)));
    }
  }
  return c;
}

KeepAlive SiteCore::Impl::keep_alive() {
  return KeepAlive(
      cfg.heartbeat, [this] { busy_beat(); }, cfg.busy_limit());
}

void SiteCore::Impl::busy_beat() {
  // Only to a parent that knows this site: it judges the silence of
  // members, and a site not welcomed yet says hello as it must.
  // Nothing else may seal while the sealing pipeline's worker owns the sealer.
  if (uplink->in_federation() && !sealing_active) {
    (void)parent().heartbeat(round, wire::kFlagBusy);
  }
}

void SiteCore::Impl::save_checkpoint(bool with_replica, bool on_anchor) {
  if (opt.checkpoint_dir.empty() || !joined) return;
  // Seconds at a billion parameters: its parent goes on hearing from it.
  const KeepAlive keep = keep_alive();
  const Checkpoint c = state_checkpoint(on_anchor);
  const checkpoint::CheckpointTrust trust = checkpoint::checkpoint_trust(*security, topo, self);
  const auto t0 = Clock::now();
  const checkpoint::SectionDigests digests =
      checkpoint::save_node_checkpoint(opt.checkpoint_dir, c, trust);
  cadence.whole_at = Clock::now();
  cadence.whole_seconds = std::chrono::duration<double>(*cadence.whole_at - t0).count();
  security->audit("checkpoint", {{"round", round}, {"ms", cadence.whole_seconds * 1e3}});
  // The image's base is the anchor the checkpoint just hashed.
  if (with_replica) save_image(c, trust, checkpoint::section_digest(c, digests, "anchor"));
  site_metrics.last_checkpoint = Clock::now();
  site_metrics.checkpoints += 1;
  // Its parent's silence while it wrote (it did not listen) does not count.
  parent().not_listening(Clock::now() - t0);
}

// The replica image of `c` (site-<id>.replica.fwck): what goes to the
// parent, and this site's recovery point between whole checkpoints.
void SiteCore::Impl::save_image(const Checkpoint& c, const checkpoint::CheckpointTrust& trust,
                                const std::array<uint8_t, 32>* anchor_sha256) {
  try {
    const auto t0 = Clock::now();
    const uint64_t bytes =
        checkpoint::save_replica_image(opt.checkpoint_dir, c, kReplicaPlan, trust, anchor_sha256);
    log().info("[site:{}] replica image of round {}: {} bytes in {:.1f} ms", self.id, c.round,
               bytes, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  } catch (const Error& e) {
    log().warn("[site:{}] cannot write the replica image of round {}: {}", self.id, c.round,
               e.what());
  }
}

// A whole checkpoint at a round boundary while it is small (kWholeAlways),
// or once the time since the last is its cost over the checkpoint budget: a
// large model's checkpoint takes at most that share of the site's time.
bool SiteCore::Impl::whole_checkpoint_due() const {
  const uint64_t bytes = uint64_t{plan.total()} * sizeof(float) * 3;
  if (bytes <= kWholeAlways || !cadence.whole_at || opt.checkpoint_budget >= 1) return true;
  const double since = std::chrono::duration<double>(Clock::now() - *cadence.whole_at).count();
  return since * opt.checkpoint_budget >= cadence.whole_seconds;
}

void SiteCore::Impl::round_checkpoint(bool upload, bool on_anchor) {
  if (overlapping()) {
    // params belong to the caller until finish_sync, which saves then.
    overlap.checkpoint_due = true;
    overlap.upload_due = overlap.upload_due || upload;
    return;
  }
  boundary_checkpoint(upload, on_anchor);
  if (upload) start_upload();
}

// At a round boundary: a whole checkpoint when due, else only the image
// (the recovery point until the next whole one; resume() takes the newer).
void SiteCore::Impl::boundary_checkpoint(bool upload, bool on_anchor) {
  if (opt.checkpoint_dir.empty() || !joined) return;
  if (whole_checkpoint_due()) {
    save_checkpoint(upload && replica_due(), on_anchor);
    return;
  }
  const KeepAlive keep = keep_alive();
  const auto t0 = Clock::now();
  save_image(state_checkpoint(on_anchor), checkpoint::checkpoint_trust(*security, topo, self));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  security->audit("checkpoint", {{"round", round}, {"image", true}, {"ms", ms}});
  site_metrics.last_checkpoint = Clock::now();
  site_metrics.checkpoints += 1;
  parent().not_listening(Clock::now() - t0);
}

bool SiteCore::Impl::replica_due() const {
  const uint64_t every = cfg.replica_every;
  return !opt.checkpoint_dir.empty() && uplink->parent_keeps_replicas() && every != 0 &&
         round % every == 0;
}

void SiteCore::Impl::start_upload() {
  if (!replica_due()) return;
  try {
    // Behind an image still on its way, which finishes first.
    uplink->upload().offer(checkpoint::replica_image_path(opt.checkpoint_dir, self.id), round,
                           cfg.upload_piece_bytes());
  } catch (const Error& e) {
    log().warn("[site:{}] cannot send its checkpoint to the parent: {}", self.id, e.what());
  }
}

// Called from upkeep (never while the sealing pipeline owns the sealer):
// pieces go out only when the window has room, behind the update.
uint64_t SiteCore::Impl::replica_bytes_since_last() {
  const uint64_t now = uplink->upload().bytes_sent();
  const uint64_t since = now - replica_bytes_reported;
  replica_bytes_reported = now;
  return since;
}

void SiteCore::Impl::pump_upload() {
  if (welcome.awaiting || incoming.full_pending() || !welcome.link_ok) return;
  uplink->upload().pump(link());
}

}  // namespace fedwan
