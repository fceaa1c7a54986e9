// SiteCore taking the anchor of the next round (site_impl.hpp): each chunk
// checked against the plan, then applied as it comes (the anchor updated in
// place, the parameters written past the caches), held while this site's
// own delta of that chunk is not computed yet, or, when the parent sends
// the model in full, decoded straight into the anchor and taken whole
// (model_in_full). Whether the anchor the parent names is the one this site
// holds is checked first (anchor_matches).
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "site/site_impl.hpp"

namespace fedwan {

bool SiteCore::Impl::anchor_matches(const wire::ParsedFrame& f) {
  // The parent took this site's word that it holds the round's anchor (a
  // round number names one anchor). Where the site offered the digest of
  // that anchor whole and the parent's differs, training on would build
  // every later round on a model the federation does not hold: the site
  // asks for the model in full instead.
  if (!welcome.offered || welcome.offered_round != round || !anchor_whole() ||
      f.payload_size != welcome.offered->size() ||
      std::memcmp(f.payload, welcome.offered->data(), welcome.offered->size()) == 0) {
    return true;
  }
  const std::string ours = to_hex(welcome.offered->data(), welcome.offered->size());
  const std::string theirs = to_hex(f.payload, f.payload_size);
  log().error("[site:{}] its anchor of round {} is not its parent's (digest {} against the "
              "parent's {}); asking for the model in full",
              self.id, round, ours.substr(0, 16), theirs.substr(0, 16));
  security->audit("anchor_mismatch",
                  {{"round", round}, {"digest", ours}, {"parent_digest", theirs}});
  welcome.offer_none = true;
  welcome.offered.reset();
  welcome.hello_pending = true;
  welcome.awaiting = true;
  return false;
}

void SiteCore::Impl::set_anchor(const float* from) {
  const KeepAlive keep = keep_alive();  // the whole model copied: seconds at a billion
  anchor.assign(from, from + plan.total());
  warn_anchor_in_memory();
}

void SiteCore::Impl::warn_anchor_in_memory() {
  if (!anchor.why().empty() && !anchor_file_warned) {
    anchor_file_warned = true;
    log().warn("[site:{}] the anchor ({} MiB) stays in memory: no file for it in {}", self.id,
               plan.total() * sizeof(float) >> 20, anchor.why());
  }
}

void SiteCore::Impl::on_anchor(const wire::ParsedFrame& f, SyncResult* res) {
  const wire::FrameHeader& h = f.header;
  const bool is_full = (h.flags & wire::kFlagFullAnchor) != 0;
  const Codec* c = codec_by_wire_id(h.codec);
  if (h.total_elements != plan.total() || h.chunk_count != plan.count() ||
      h.element_count != plan.size(h.chunk_index) ||
      !c->validate(f.payload, f.payload_size, h.element_count)) {
    throw ProtocolError("site '" + self.id +
                        "': parent sent an anchor chunk that does not "
                        "fit (round " +
                        std::to_string(h.round) + ", chunk " + std::to_string(h.chunk_index) +
                        ", " + std::to_string(h.element_count) + " elements)");
  }
  const site::AnchorAssembly::Taken t =
      incoming.take(h.round, h.chunk_index, is_full, round, outgoing.encoded_upto, h.codec,
                    f.payload, f.payload_size, Clock::now());
  if (t.opened) outgoing.encoded_upto = 0;  // before this site's sync: no delta computed yet
  switch (t.step) {
    case site::AnchorAssembly::Step::kIgnored:
      log().info("[site:{}] ignored {} anchor chunk of round {} (at round {})", self.id,
                 is_full ? "a full" : "an", h.round, round);
      return;
    case site::AnchorAssembly::Step::kFull:
    case site::AnchorAssembly::Step::kFullComplete:
      c->decode(f.payload, h.element_count, anchor.data() + plan.offset(h.chunk_index));
      uplink->progressed(Clock::now());
      if (t.step == site::AnchorAssembly::Step::kFullComplete) model_in_full(res);
      return;
    case site::AnchorAssembly::Step::kEarly:
      // Closed without this site's chunk (quorum or deadline) before its
      // delta was computed here: applied once it is (apply_early).
      return;
    case site::AnchorAssembly::Step::kApply:
      apply_update_chunk(h.chunk_index, *c, f.payload);
      return;
  }
}

void SiteCore::Impl::model_in_full(SyncResult* res) {
  // The whole model is in: this round restarts from it (an overlapped
  // sync's caller copies it at finish_sync).
  const uint64_t full_round = incoming.full_round();
  // The copy and the checkpoint: its parent goes on hearing from it.
  const KeepAlive keep = keep_alive();
  if (!overlapping()) KeepAlive::copy(params, anchor.data(), plan.total() * sizeof(float));
  anchor_mixed = false;
  log().info("[site:{}] {} at round {}", self.id, welcome.joined_once ? "resynced" : "joined",
             full_round);
  if (welcome.joined_once) {
    security->audit("resync", {{"from_round", round}, {"to_round", full_round}});
  }
  round = full_round;
  welcome.offer_none = false;
  welcome.offered.reset();
  incoming.forget_full();
  incoming.forget_next();
  outgoing.sent = false;
  outgoing.frames.clear();
  clear_residual();
  if (replica_image) take_replica_image(full_round);
  welcome.joined_once = true;
  res->resynced = true;
  if (round >= cfg.rounds) finished = true;
  round_checkpoint(/*upload=*/false);
}

void SiteCore::Impl::apply_update_chunk(uint32_t chunk, const Codec& c, const uint8_t* payload) {
  const uint64_t off = plan.offset(chunk);
  const uint32_t n = plan.size(chunk);
  // The anchor is updated in place: its old chunk was only needed for this
  // chunk's delta, already encoded. The params take the new chunk while it
  // is in cache (not as a whole-model copy at take_anchor); overlapped,
  // `work`, the params sent, becomes what finish_sync adds to the caller's.
  float* a = anchor.data() + off;
  anchor_mixed = true;
  if (!overlapping()) {
    // params is read next by the next training step: written past the caches.
    c.decode_add_copy(payload, n, a, params + off);
    return;
  }
  float* w = work + off;
  c.decode_accumulate(payload, n, 1.0f, a);
  for (uint32_t k = 0; k < n; ++k) w[k] = a[k] - w[k];
}

void SiteCore::Impl::apply_early() {
  for (const site::AnchorAssembly::EarlyChunk& c : incoming.take_early(outgoing.encoded_upto)) {
    apply_update_chunk(c.chunk, *codec_by_wire_id(c.codec), c.payload.data());
    KeepAlive::pulse();
  }
}

}  // namespace fedwan
