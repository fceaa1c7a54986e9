// A region's checkpoints and recovery (aggregator/region_role.hpp): its
// anchor and bf16 residual saved and restored, from its own checkpoint or
// its parent's replica image; a region whose disk lost them fetches the
// image from its parent.
#include "aggregator/region_role.hpp"

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "checkpoint/replica_fetch.hpp"
#include "checkpoint/replica_image.hpp"
#include "codec/half.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

// Its checkpoint's residual, in bf16 ("residual", in fp32, before).
constexpr const char* kResidualSection = "residual.bf16";

}  // namespace

void Aggregator::Impl::RegionRole::save(Checkpoint& c, nlohmann::json& meta) const {
  c.sections.push_back(checkpoint::float_section("anchor", anchor_.data(), anchor_.size()));
  CheckpointSection r;
  r.name = kResidualSection;
  r.view = reinterpret_cast<const uint8_t*>(residual_.data());
  r.view_size = residual_.size() * sizeof(uint16_t);
  c.sections.push_back(std::move(r));
  // Adaptive clipping: the clip of its round, which it opens again on
  // resuming, before its parent's welcome says it.
  if (n_.adaptive_clip()) meta["privacy_clip"] = n_.privacy_clip_;
}

// The checkpoint hashed the anchor: that is the digest a hello names.
void Aggregator::Impl::RegionRole::saved(const Checkpoint& c,
                                         const std::vector<std::array<uint8_t, 32>>& digests) {
  const std::array<uint8_t, 32>* d = checkpoint::section_digest(c, digests, "anchor");
  if (d != nullptr && anchor_.size() == n_.model_.elements) anchor_digest_ = *d;
}

void Aggregator::Impl::RegionRole::restore(const Checkpoint& c, const std::string& path) {
  if (checkpoint::is_replica_image(c)) {
    // Its parent's copy, without the anchor: the parent sends the model in
    // full when it says hello offering none (held_digest), and children
    // wait until it is in (resyncing).
    uint64_t elements = 0;
    if (const nlohmann::json j = checkpoint::checkpoint_meta(c);
        j.contains("elements") && j["elements"].is_number_unsigned()) {
      elements = j["elements"].get<uint64_t>();
    }
    if (elements == 0) throw CryptoError("replica image " + path + ": no model size in its meta");
    anchor_.clear();
    anchor_changed();
    n_.init_model_state(elements);
    if (checkpoint::replica_section_size(c, kResidualSection)) {
      restore_image_residual(c, path);  // decoded from the file into place
    } else {
      restore_residual(checkpoint::expand_replica_image(c, nullptr, 0), path);  // fp32, earlier
    }
  } else {
    anchor_ = checkpoint::floats_of(c, "anchor", 0);
    anchor_changed();
    n_.init_model_state(anchor_.size());
    restore_residual(c, path);
  }
  link_.uplink().resumed();
  if (!n_.adaptive_clip()) return;
  if (const nlohmann::json j = checkpoint::checkpoint_meta(c);
      j.contains("privacy_clip") && j["privacy_clip"].is_number()) {
    const double clip = j["privacy_clip"].get<double>();
    if (std::isfinite(clip) && clip > 0) use_clip(clip, n_.round_);
  }
}

void Aggregator::Impl::RegionRole::restore_residual(const Checkpoint& c, const std::string& path) {
  residual_.clear();
  if (const CheckpointSection* r = c.find(kResidualSection)) {
    if (r->size() % sizeof(uint16_t) != 0) {
      throw CryptoError("checkpoint " + path + ": its residual is not bf16");
    }
    residual_.resize(r->size() / sizeof(uint16_t));
    read_section(*r, reinterpret_cast<uint8_t*>(residual_.data()));
  } else if (c.find("residual") != nullptr) {
    // Written by an earlier fedwan: the residual in fp32.
    const std::vector<float> fp32 = checkpoint::floats_of(c, "residual", 0);
    residual_.resize(fp32.size());
    kernels::half_kernels().bf16_encode(fp32.data(), nullptr, fp32.size(),
                                        reinterpret_cast<uint8_t*>(residual_.data()));
  }
  if (!residual_.empty() && residual_.size() != n_.model_.elements) {
    throw CryptoError("checkpoint " + path + ": residual size mismatch");
  }
}

void Aggregator::Impl::RegionRole::restore_image_residual(const Checkpoint& image,
                                                          const std::string& path) {
  const uint64_t bytes = checkpoint::replica_section_size(image, kResidualSection).value_or(0);
  if (bytes != n_.model_.elements * sizeof(uint16_t)) {
    throw CryptoError("replica image " + path + ": residual size mismatch");
  }
  residual_.assign(n_.model_.elements, 0);
  checkpoint::expand_replica_section(image, kResidualSection, nullptr, 0,
                                     reinterpret_cast<uint8_t*>(residual_.data()), bytes);
}

bool Aggregator::Impl::RegionRole::recover(bool resumed) {
  if (!resumed && !n_.opt_.checkpoint_dir.empty() &&
      checkpoint::fetch_replica(
          link_.uplink().link(),
          [this](const std::string& why) -> transport::ParentLink& {
            // The fetch paces its new sessions itself.
            link_.reconnect(why, /*grow_backoff=*/false);
            return link_.uplink().link();
          },
          n_.topo_, n_.self_, n_.cfg_, n_.opt_.checkpoint_dir, 0, n_.opt_.join_timeout,
          *n_.security_, &n_.stop_requested)) {
    // Its own checkpoints were gone or corrupt; the parent kept a copy.
    resumed = n_.resume_from_checkpoint();
  }
  return resumed;
}

}  // namespace fedwan
