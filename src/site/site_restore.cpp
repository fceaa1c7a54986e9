// A site restored (site_impl.hpp) at join(): from its whole checkpoint,
// each array read straight into place from the file; or from a replica
// image (its own, newer than the whole checkpoint, or its parent's when
// its checkpoints were lost), its progress at once and its parameters and
// residual, decoded from the file, once the parent's model of its round is
// in (take_replica_image). Every size is checked before anything is
// overwritten. Saving is site_checkpoint.cpp.
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "codec/half.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "site/site_impl.hpp"

namespace fedwan {
namespace {

using site::kResidualBf16;

bool params_on_anchor(const Checkpoint& c) {
  const nlohmann::json j = checkpoint::checkpoint_meta(c);
  return j.contains("params_on_anchor") && j["params_on_anchor"].is_boolean() &&
         j["params_on_anchor"].get<bool>();
}

// A checkpoint's sections, in memory or left in its file.
site::RestoreSource from_checkpoint(const Checkpoint& c) {
  const auto section = [&c](const std::string& name) -> const CheckpointSection& {
    const CheckpointSection* s = c.find(name);
    if (s == nullptr) throw CryptoError("checkpoint: no section '" + name + "'");
    return *s;
  };
  return {[&c] {
            std::vector<std::string> names;
            for (const CheckpointSection& s : c.sections) {
              if (s.name != checkpoint::kMetaSection) names.push_back(s.name);
            }
            return names;
          },
          [&c](const std::string& name) -> std::optional<uint64_t> {
            const CheckpointSection* s = c.find(name);
            if (s == nullptr) return std::nullopt;
            return s->size();
          },
          [section](const std::string& name, uint8_t* out) { read_section(section(name), out); },
          [section](const std::string& name, const CheckpointSection::Sink& sink) {
            stream_section(section(name), sink);
          }};
}

// A replica image's sections, each decoded on its own against `base` (the
// anchor it was made against).
site::RestoreSource from_image(const Checkpoint& image, const float* base, size_t n) {
  const auto read = [&image, base, n](const std::string& name, uint8_t* out) {
    const std::optional<uint64_t> bytes = checkpoint::replica_section_size(image, name);
    if (!bytes) throw CryptoError("replica image: no section '" + name + "'");
    checkpoint::expand_replica_section(image, name, base, n, out, *bytes);
  };
  return {
      [&image] { return checkpoint::replica_section_names(image); },
      [&image](const std::string& name) { return checkpoint::replica_section_size(image, name); },
      read,
      [&image, read](const std::string& name, const CheckpointSection::Sink& sink) {
        std::vector<uint8_t> bytes(checkpoint::replica_section_size(image, name).value_or(0));
        read(name, bytes.data());
        sink(bytes.data(), bytes.size());
      }};
}

}  // namespace

bool SiteCore::Impl::resume() {
  if (opt.checkpoint_dir.empty()) return false;
  auto loaded = checkpoint::load_node_checkpoint(
      opt.checkpoint_dir, topo, self.id, checkpoint::checkpoint_trust(*security, topo, self));
  // The image of a later round boundary than the whole checkpoint (written
  // between whole ones) is the newer recovery point.
  if (auto image = local_image();
      image && (!loaded || image->checkpoint.round > loaded->checkpoint.round)) {
    return resume_from_image(std::move(*image));
  }
  if (!loaded) return false;
  if (checkpoint::is_replica_image(loaded->checkpoint)) {
    return resume_from_image(std::move(*loaded));
  }
  const Checkpoint& c = loaded->checkpoint;
  const std::string what = "checkpoint " + loaded->path.string();
  const site::RestoreSource src = from_checkpoint(c);
  // No "params" section: the parameters were the anchor (the meta says so).
  const bool own_params = c.find("params") != nullptr || !params_on_anchor(c);
  // Every size checked before anything is overwritten; then each array
  // straight from the file into place, no copy of the model beside it.
  check_restorable(src, own_params, /*with_anchor=*/true, what);
  {
    const KeepAlive keep = keep_alive();  // seconds at a billion parameters
    src.read("anchor", reinterpret_cast<uint8_t*>(anchor.reset(plan.total())));
    warn_anchor_in_memory();
    if (own_params) {
      src.read("params", reinterpret_cast<uint8_t*>(params));
    } else {
      std::memcpy(params, anchor.data(), plan.total() * sizeof(float));
    }
  }
  if (!restore_residual(src, what)) clear_residual();
  restore_progress(c, src);
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

// This site's own replica image (replica_image_path), when intact, its own
// and of this topology; nullopt otherwise (a damaged one is logged).
std::optional<checkpoint::LoadedCheckpoint> SiteCore::Impl::local_image() {
  const auto path = checkpoint::replica_image_path(opt.checkpoint_dir, self.id);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    checkpoint::LoadedCheckpoint out;
    // Left in the file: each section is decoded from there, when needed.
    out.checkpoint =
        read_checkpoint(path, checkpoint::checkpoint_trust(*security, topo, self).check,
                        {checkpoint::kRestoreOnDiskFrom});
    out.path = path;
    const Checkpoint& c = out.checkpoint;
    if (c.node_id == self.id && c.topology_digest == topo.lineage_digest() &&
        checkpoint::is_replica_image(c)) {
      return out;
    }
    log().warn("[site:{}] {} is not this site's replica image under this topology; not used",
               self.id, path.string());
  } catch (const Error& e) {
    log().warn("[site:{}] its replica image {} is not used: {}", self.id, path.string(), e.what());
  }
  return std::nullopt;
}

// The site's own progress in a checkpoint or an image: the data position
// and the caller's blobs, each read (or decoded) once, into its own bytes.
void SiteCore::Impl::restore_progress(const Checkpoint& c, const site::RestoreSource& src) {
  const nlohmann::json j = checkpoint::checkpoint_meta(c);
  if (j.contains("data_position") && j["data_position"].is_number_unsigned()) {
    data_position = j["data_position"].get<uint64_t>();
  }
  if (!opt.load_state) return;
  std::vector<StateBlob> blobs;
  for (const std::string& name : src.names()) {
    if (site::reserved_section(name)) continue;
    StateBlob b{name, std::vector<uint8_t>(src.size(name).value_or(0))};
    src.read(name, b.bytes.data());
    blobs.push_back(std::move(b));
  }
  opt.load_state(blobs);
}

// The parent's replica image, fetched when the site's own checkpoints were
// lost: its progress now; its parameters and residual once the parent's
// model of its round is in (take_replica_image). Until then its hello
// offers no anchor, so the parent sends its model in full.
bool SiteCore::Impl::resume_from_image(checkpoint::LoadedCheckpoint loaded) {
  // Nothing of the model decoded yet: it needs the parent's anchor.
  restore_progress(loaded.checkpoint, from_image(loaded.checkpoint, nullptr, 0));
  round = loaded.checkpoint.round;
  welcome.joined_once = true;
  resumed = true;
  uplink->resumed();
  if (round >= cfg.rounds) finished = true;
  log().info("[site:{}] resumed from its parent's replica image at round {}", self.id, round);
  security->audit("resumed", {{"round", round}, {"path", loaded.path.string()}, {"image", true}});
  checkpoint::check_recorded_audit_head(loaded.checkpoint, *security);
  replica_image = std::move(loaded.checkpoint);
  return true;
}

// The model of `full_round` came in full after a restore from a replica
// image: the image's parameters and residual when it was made against that
// model, else (the federation moved on) the new model as any resync.
void SiteCore::Impl::take_replica_image(uint64_t full_round) {
  const Checkpoint image = std::move(*replica_image);
  replica_image.reset();
  const bool same_base = full_round == image.round && checkpoint::replica_base_sha256(image) ==
                                                          sha256(anchor.data(), anchor.size() * 4);
  if (!same_base) {
    log().info("[site:{}] its replica image of round {} is behind the federation's round {}: "
               "it trains on from the new model",
               self.id, image.round, full_round);
    security->audit("replica_behind", {{"round", image.round}, {"to_round", full_round}});
    return;
  }
  try {
    // Each array decoded from the image into place: no expanded copy.
    const site::RestoreSource src = from_image(image, anchor.data(), anchor.size());
    // No "params": they were the anchor, already in place.
    const bool own_params = src.size("params").has_value() || !params_on_anchor(image);
    check_restorable(src, own_params, /*with_anchor=*/false, "replica image");
    if (!overlapping() && own_params) src.read("params", reinterpret_cast<uint8_t*>(params));
    restore_residual(src, "replica image");
    if (security->auditing()) {  // a hash of the whole model, for the entry alone
      security->audit("replica_rebuilt",
                      {{"round", image.round},
                       {"params_sha256", to_hex(sha256(params, plan.total() * 4).data(), 32)}});
    }
  } catch (const Error& e) {
    // Signed by this site, so not expected (CryptoError: damaged, or
    // changed in its file since it was verified; TransportError: the file
    // cannot be read again); never a wrong model: the parent's model as it
    // came.
    log().error("[site:{}] its replica image of round {} does not decode: {}", self.id, image.round,
                e.what());
    security->audit("replica_refused", {{"round", image.round}, {"reason", e.what()}});
    // What a decode cut short left: the model as it came, no residual.
    if (!overlapping()) std::memcpy(params, anchor.data(), plan.total() * sizeof(float));
    clear_residual();
  }
}

void SiteCore::Impl::clear_residual() {
  if (cfg.codec->id() == CodecId::kFp32) return;
  if (opt.update_encoder) {
    const std::vector<float> zeros(plan.total(), 0.0f);
    opt.update_encoder->write_residual(zeros.data(), zeros.size());
  } else if (!residual.empty()) {
    std::fill(residual.begin(), residual.end(), uint16_t{0});
  }
}

// The sizes of what a restore from `src` overwrites, checked before it
// starts: a checkpoint that does not fit this model changes nothing.
void SiteCore::Impl::check_restorable(const site::RestoreSource& src, bool own_params,
                                      bool with_anchor, const std::string& what) const {
  const auto fits = [&](const char* name, size_t element_bytes, bool needed) {
    const std::optional<uint64_t> size = src.size(name);
    if (!size ? needed : *size != plan.total() * element_bytes) {
      throw CryptoError(what + ": its '" + name + "' section " +
                        (!size ? std::string("is missing")
                               : "holds " + std::to_string(*size) + " bytes, not " +
                                     std::to_string(plan.total() * element_bytes)) +
                        " for this model of " + std::to_string(plan.total()) + " parameters");
    }
  };
  fits("anchor", sizeof(float), with_anchor);
  fits("params", sizeof(float), own_params);
  fits(kResidualBf16, sizeof(uint16_t), false);
  // fp32 (an earlier fedwan, or an update encoder's); empty: none.
  if (!src.size(kResidualBf16) && src.size("residual").value_or(0) > 0) {
    fits("residual", sizeof(float), false);
  }
}

// The residual from `src`, read into place; false when it has none (an
// empty fp32 one: the fp32 codec keeps none).
bool SiteCore::Impl::restore_residual(const site::RestoreSource& src, const std::string& what) {
  const bool bf16 = src.size(kResidualBf16).has_value();
  const uint64_t fp32_bytes = bf16 ? 0 : src.size("residual").value_or(0);
  if (!bf16 && fp32_bytes == 0) return false;
  const uint64_t bytes = bf16 ? *src.size(kResidualBf16) : fp32_bytes;
  if (bytes != plan.total() * (bf16 ? sizeof(uint16_t) : sizeof(float))) {
    throw CryptoError(what + ": residual size mismatch");
  }
  if (cfg.codec->id() == CodecId::kFp32) return true;  // the codec needs none
  const kernels::HalfKernels& k = kernels::half_kernels();
  if (opt.update_encoder) {  // it takes fp32: decoded piece by piece
    std::vector<float> values(plan.total());
    if (bf16) {
      size_t at = 0;
      src.stream(kResidualBf16, [&](const uint8_t* data, size_t n) {
        k.bf16_decode(data, n / sizeof(uint16_t), values.data() + at);
        at += n / sizeof(uint16_t);
      });
    } else {
      src.read("residual", reinterpret_cast<uint8_t*>(values.data()));
    }
    opt.update_encoder->write_residual(values.data(), values.size());
    residual.clear();
    return true;
  }
  residual.resize(plan.total());
  auto* out = reinterpret_cast<uint8_t*>(residual.data());
  if (bf16) {
    src.read(kResidualBf16, out);
    return true;
  }
  size_t at = 0;  // written by an earlier fedwan: fp32, kept to bf16 piece by piece
  src.stream("residual", [&](const uint8_t* data, size_t n) {
    const size_t m = n / sizeof(float);
    k.bf16_encode(reinterpret_cast<const float*>(data), nullptr, m, out + at * sizeof(uint16_t));
    at += m;
  });
  return true;
}

}  // namespace fedwan
