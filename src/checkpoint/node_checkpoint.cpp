#include "checkpoint/node_checkpoint.hpp"

#include <sys/stat.h>

#include <cstring>
#include <system_error>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_meta.hpp"
#include "common/atomic_file.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "node/node_security.hpp"

namespace fedwan::checkpoint {
namespace fs = std::filesystem;

fs::path checkpoint_path(const fs::path& dir, const std::string& node) {
  return dir / (node + ".fwck");
}

namespace {
fs::path previous_path(const fs::path& dir, const std::string& node) {
  return dir / (node + ".prev.fwck");
}
}  // namespace

CheckpointTrust checkpoint_trust(const NodeSecurity& security, const Topology& topo,
                                 const NodeSpec& self) {
  CheckpointTrust t;
  t.key = security.key();
  t.check.verifier = security.verifier();
  t.check.signer.node_id = self.id;
  t.check.signer.role = self.role;
  t.check.signer.job = topo.job();
  return t;
}

fs::path replica_image_path(const fs::path& dir, const std::string& node) {
  return dir / (node + ".replica.fwck");
}

const std::array<uint8_t, 32>* section_digest(const Checkpoint& c, const SectionDigests& digests,
                                              std::string_view name) {
  for (size_t i = 0; i < c.sections.size() && i < digests.size(); ++i) {
    if (c.sections[i].name == name) return &digests[i];
  }
  return nullptr;
}

uint64_t save_replica_image(const fs::path& dir, const Checkpoint& c, const ReplicaPlan& plan,
                            const CheckpointTrust& trust,
                            const std::array<uint8_t, 32>* base_sha256) {
  const fs::path path = replica_image_path(dir, c.node_id);
  write_checkpoint(path, make_replica_image(c, plan, base_sha256), trust.key.get(),
                   "replica_image");
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(size);
}

SectionDigests save_node_checkpoint(const fs::path& dir, const Checkpoint& c,
                                    const CheckpointTrust& trust) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_file_error("create the checkpoint directory", dir, ec.value());
  ::chmod(dir.c_str(), 0700);
  const fs::path latest = checkpoint_path(dir, c.node_id);
  if (fs::exists(latest, ec)) {
    fs::rename(latest, previous_path(dir, c.node_id), ec);
    if (ec) throw_file_error("keep the previous checkpoint", latest, ec.value());
  }
  return write_checkpoint(latest, c, trust.key.get());
}

std::optional<LoadedCheckpoint> load_node_checkpoint(const fs::path& dir, const Topology& topo,
                                                     const std::string& node,
                                                     const CheckpointTrust& trust) {
  LoadedCheckpoint out;
  for (const fs::path& p : {checkpoint_path(dir, node), previous_path(dir, node)}) {
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    Checkpoint c;
    try {
      // The model's arrays stay in the file until the caller reads them
      // into place, or decodes an image's from there.
      c = read_checkpoint(p, trust.check, {kRestoreOnDiskFrom});
    } catch (const CryptoError& e) {
      out.problems.emplace_back(e.what());
      log().error("checkpoint {} is corrupt and will not be used: {}", p.string(), e.what());
      fs::rename(p, fs::path(p.string() + ".corrupt"), ec);
      continue;
    } catch (const TransportError& e) {
      out.problems.emplace_back(e.what());
      log().error("cannot read checkpoint {}: {}", p.string(), e.what());
      continue;
    }
    if (c.node_id != node) {
      throw ConfigError("checkpoint " + p.string() + " belongs to node '" + c.node_id + "', not '" +
                        node + "'; point --checkpoint-dir at this node's own");
    }
    if (c.topology_digest != topo.lineage_digest()) {
      throw ConfigError("checkpoint " + p.string() + " was written under topology " +
                        to_hex(c.topology_digest.data(), 32).substr(0, 12) + ", this is " +
                        topo.digest_hex().substr(0, 12) +
                        "; resuming it would mix two federations. Move it away to start fresh");
    }
    out.checkpoint = std::move(c);
    out.path = p;
    return out;
  }
  return std::nullopt;
}

void check_recorded_audit_head(const Checkpoint& c, NodeSecurity& security) {
  const nlohmann::json j = checkpoint_meta(c);
  if (!j.contains("audit_seq") || !j.contains("audit_hash") ||
      !j["audit_seq"].is_number_unsigned() || !j["audit_hash"].is_string()) {
    return;
  }
  security.check_audit_head(j["audit_seq"].get<uint64_t>(), j["audit_hash"].get<std::string>());
}

CheckpointSection float_section(std::string name, const float* data, size_t n) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
                "checkpoint sections hold fp32 values little-endian, as in memory");
  CheckpointSection s;
  s.name = std::move(name);
  static const uint8_t kNone = 0;  // an empty section still views something
  s.view = n > 0 ? reinterpret_cast<const uint8_t*>(data) : &kNone;
  s.view_size = n * sizeof(float);
  return s;
}

namespace {

// The section, checked to hold floats: exactly n of them where `exact`, or
// n = 0 and any count.
const CheckpointSection& float_section_of(const Checkpoint& c, const std::string& name, size_t n,
                                          bool exact) {
  const CheckpointSection* s = c.find(name);
  if (s == nullptr) {
    throw CryptoError("checkpoint of '" + c.node_id + "' has no section '" + name + "'");
  }
  if (s->size() % sizeof(float) != 0 || ((exact || n != 0) && s->size() != n * sizeof(float))) {
    throw CryptoError("checkpoint section '" + name + "' of '" + c.node_id + "' holds " +
                      std::to_string(s->size()) + " bytes, expected " +
                      std::to_string(n * sizeof(float)));
  }
  return *s;
}

}  // namespace

std::vector<float> floats_of(const Checkpoint& c, const std::string& name, size_t n) {
  const CheckpointSection& s = float_section_of(c, name, n, false);
  std::vector<float> out(s.size() / sizeof(float));
  if (!out.empty()) read_section(s, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

void copy_floats(const Checkpoint& c, const std::string& name, float* out, size_t n) {
  const CheckpointSection& s = float_section_of(c, name, n, true);
  if (n > 0) read_section(s, reinterpret_cast<uint8_t*>(out));
}

}  // namespace fedwan::checkpoint
