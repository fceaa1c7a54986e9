// SiteCore checkpoints: written at every round boundary (and on demand, at
// SIGTERM), read back by join() so a restarted site resumes where it was:
// the parameters it trained, the anchor of its round, the error-feedback
// residual, the data position and the caller's own blobs (inner optimizer).
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/node_checkpoint.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "site/site_impl.hpp"

namespace fedwan {
namespace {

bool reserved_section(const std::string& name) {
  return name == "params" || name == "anchor" || name == "residual" || name == "meta";
}

}  // namespace

void SiteCore::Impl::save_checkpoint() {
  if (opt.checkpoint_dir.empty() || !joined) return;
  Checkpoint c;
  c.round = round;
  c.topology_digest = topo.lineage_digest();
  c.node_id = self.id;
  if (opt.update_encoder && !residual.empty()) {
    opt.update_encoder->read_residual(residual.data(), residual.size());
  }
  c.sections.push_back(checkpoint::float_section("params", params, plan.total()));
  c.sections.push_back(checkpoint::float_section("anchor", anchor.data(), anchor.size()));
  c.sections.push_back(checkpoint::float_section("residual", residual.data(), residual.size()));
  nlohmann::json meta_json = {{"role", "site"}, {"data_position", data_position}};
  if (const auto head = security->audit_head()) {
    meta_json["audit_seq"] = head->seq;
    meta_json["audit_hash"] = head->hash;
  }
  const std::string meta = meta_json.dump();
  c.sections.push_back({"meta", std::vector<uint8_t>(meta.begin(), meta.end())});
  if (opt.save_state) {
    for (StateBlob& b : opt.save_state()) {
      if (reserved_section(b.name) || !is_valid_checkpoint_section_name(b.name)) {
        throw ConfigError("site '" + self.id + "': state blob name '" + b.name +
                          "' is reserved or invalid; use 1..64 of [a-z0-9_.-]");
      }
      c.sections.push_back({b.name, std::move(b.bytes)});
    }
  }
  checkpoint::save_node_checkpoint(opt.checkpoint_dir, c,
                                   checkpoint::checkpoint_trust(*security, topo, self));
  security->audit("checkpoint", {{"round", round}});
  site_metrics.last_checkpoint = Clock::now();
  site_metrics.checkpoints += 1;
}

bool SiteCore::Impl::resume() {
  if (opt.checkpoint_dir.empty()) return false;
  auto loaded = checkpoint::load_node_checkpoint(
      opt.checkpoint_dir, topo, self.id, checkpoint::checkpoint_trust(*security, topo, self));
  if (!loaded) return false;
  const Checkpoint& c = loaded->checkpoint;
  const std::vector<float> p = checkpoint::floats_of(c, "params", plan.total());
  anchor = checkpoint::floats_of(c, "anchor", plan.total());
  residual = checkpoint::floats_of(c, "residual", 0);
  if (!residual.empty() && residual.size() != plan.total()) {
    throw CryptoError("checkpoint " + loaded->path.string() + ": residual size mismatch");
  }
  const CheckpointSection* meta = c.find("meta");
  if (meta != nullptr) {
    const auto j = nlohmann::json::parse(meta->bytes.begin(), meta->bytes.end(), nullptr, false);
    if (j.is_object() && j.contains("data_position") && j["data_position"].is_number_unsigned()) {
      data_position = j["data_position"].get<uint64_t>();
    }
  }
  std::vector<StateBlob> blobs;
  for (const CheckpointSection& s : c.sections) {
    if (!reserved_section(s.name)) blobs.push_back({s.name, s.bytes});
  }
  if (opt.load_state) opt.load_state(blobs);
  std::memcpy(params, p.data(), p.size() * sizeof(float));
  if (opt.update_encoder && cfg.codec->id() != CodecId::kFp32) {
    if (residual.empty()) residual.assign(plan.total(), 0.0f);
    opt.update_encoder->write_residual(residual.data(), residual.size());
  }
  round = c.round;
  welcome.joined_once = true;
  resumed = true;
  uplink->resumed();
  if (round >= cfg.rounds) finished = true;
  log().info("[site:{}] resumed from {} at round {}", self.id, loaded->path.string(), round);
  security->audit("resumed", {{"round", round}, {"path", loaded->path.string()}});
  checkpoint::check_recorded_audit_head(c, *security);
  return true;
}

void SiteCore::Impl::round_checkpoint(bool upload) {
  if (overlapping()) {
    // params belong to the caller until finish_sync, which saves then.
    overlap.checkpoint_due = true;
    overlap.upload_due = overlap.upload_due || upload;
    return;
  }
  save_checkpoint();
  if (upload) start_upload();
}

void SiteCore::Impl::start_upload() {
  const uint64_t every = cfg.replica_every;
  if (opt.checkpoint_dir.empty() || !uplink->parent_keeps_replicas() || every == 0 ||
      round % every != 0) {
    return;
  }
  try {
    uplink->upload().start(checkpoint::checkpoint_path(opt.checkpoint_dir, self.id), round,
                           cfg.piece_bytes());
  } catch (const Error& e) {
    log().warn("[site:{}] cannot send its checkpoint to the parent: {}", self.id, e.what());
  }
}

// Called from upkeep (never while the sealing pipeline owns the sealer):
// pieces go out only when the window has room, behind the update.
void SiteCore::Impl::pump_upload() {
  if (welcome.awaiting || incoming.full_pending() || !welcome.link_ok) return;
  uplink->upload().pump(link());
}

}  // namespace fedwan
