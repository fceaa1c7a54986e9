// SiteCore checkpoints: written at every round boundary (and on demand, at
// SIGTERM), read back by join() so a restarted site resumes where it was:
// the parameters it trained, the anchor of its round, the error-feedback
// residual, the data position and the caller's own blobs (inner optimizer).
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "runtime/node_checkpoint.hpp"
#include "runtime/site_impl.hpp"

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
  c.topology_digest = topo.digest();
  c.node_id = self.id;
  c.sections.push_back(runtime::float_section("params", params, plan.total()));
  c.sections.push_back(runtime::float_section("anchor", anchor.data(), anchor.size()));
  c.sections.push_back(runtime::float_section("residual", residual.data(), residual.size()));
  const std::string meta =
      nlohmann::json{{"role", "site"}, {"data_position", data_position}}.dump();
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
  runtime::save_node_checkpoint(opt.checkpoint_dir, c);
  security->audit("checkpoint", {{"round", round}});
}

void SiteCore::Impl::resume() {
  if (opt.checkpoint_dir.empty()) return;
  auto loaded = runtime::load_node_checkpoint(opt.checkpoint_dir, topo, self.id);
  if (!loaded) return;
  const Checkpoint& c = loaded->checkpoint;
  const std::vector<float> p = runtime::floats_of(c, "params", plan.total());
  anchor = runtime::floats_of(c, "anchor", plan.total());
  residual = runtime::floats_of(c, "residual", 0);
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
  round = c.round;
  joined_once = true;
  resumed = true;
  if (round >= topo.federation().rounds) finished = true;
  log().info("[site:{}] resumed from {} at round {}", self.id, loaded->path.string(), round);
  security->audit("resumed", {{"round", round}, {"path", loaded->path.string()}});
}

}  // namespace fedwan
