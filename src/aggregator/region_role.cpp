// A region's steps (aggregator/region_role.hpp): its children's
// aggregate up, the parent's model down. Its link to the parent is
// RegionLink's (region_link.cpp); the steps every role shares are
// Aggregator::Impl's.
#include "aggregator/region_role.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codec/compact_feedback.hpp"
#include "common/byte_pool.hpp"
#include "common/keep_alive.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_frames.hpp"

namespace fedwan {
Aggregator::Impl::RegionRole::RegionRole(Impl& node) : Role(node), link_(node, *this) {}

// ---- the round protocol ----------------------------------------------------------

void Aggregator::Impl::RegionRole::children_joined() {
  // A region joins upward for its whole subtree. It keeps a copy of the
  // anchor (to resync children that rejoin later), so it asks for the model
  // in full unless it was given the model the federation starts from: then
  // its hello carries that model's digest and the parent skips sending it
  // when its own matches. Each child then gets the model only if it does
  // not hold it already.
  if (n_.opt_.initial_model.size() == n_.model_.elements) {
    anchor_ = std::move(n_.opt_.initial_model);
    anchor_changed();
    holds_initial_ = true;
  } else {
    if (!n_.opt_.initial_model.empty()) {
      log().info("[agg:{}] its initial model has {} parameters, its children train {}: it is "
                 "sent the model in full",
                 n_.self_.id, n_.opt_.initial_model.size(), n_.model_.elements);
    }
    anchor_.assign(n_.model_.elements, 0.0f);
    anchor_changed();
  }
  n_.opt_.initial_model = {};
  link_.hello();
  n_.phase_ = Phase::kAwaitWelcome;
  n_.clock_.phase_deadline = Clock::now() + n_.cfg_.round_timeout;
}

void Aggregator::Impl::RegionRole::round_opened(uint64_t round) {
  link_.round_opened(round);
  // The next anchor (round + 1) starts from nothing applied: after a resync
  // the anchor it would add to was replaced.
  relay_.round = round + 1;
  relay_.done.assign(n_.model_.plan ? n_.model_.plan->count() : 0, false);
  relay_.chunks = 0;
  relay_.clip = 0;
  relay_.pending.clear();
  // It names the anchor it holds when it rejoins its parent (held_digest).
  anchor_changed();
}

void Aggregator::Impl::RegionRole::round_closed(Clock::time_point now, double /*secs*/) {
  // Its aggregate is up; the round ends with the parent's next anchor.
  n_.phase_ = Phase::kAwaitAnchor;
  anchor_progress_at_ = now;
  n_.clock_.phase_deadline = Clock::now() + n_.cfg_.round_timeout;
}

void Aggregator::Impl::RegionRole::report(uint64_t round) {
  if (!n_.book_.ready(round, n_.live_region_children())) return;
  const node::Traffic t = n_.take_traffic(round);
  link_.telemetry(round, t);
  n_.book_.sent_through(round + 1);
  RoundReport rep;
  rep.round = round;
  n_.publish_report(rep, t);
}

// Residency: an aggregate leaves the region only if it mixes at least k_min
// sites. The topology was checked at load; copies refused here, children
// lost or a deadline can leave fewer behind a chunk at run time, and then
// its values stay here: the parent is told their weight as excused.
void Aggregator::Impl::RegionRole::check_residency(aggregation::ChunkSum& cs) const {
  if (cs.mean.empty()) return;
  size_t sites = 0;
  for (uint32_t idx : cs.behind) sites += n_.topo_.sites_under(idx).size();
  const uint32_t k_min = n_.topo_.k_min_for(n_.self_.index);
  if (sites >= k_min) return;
  const std::string why = "region '" + n_.self_.id + "' would forward an aggregate of " +
                          std::to_string(sites) + " site(s); residency policy requires " +
                          std::to_string(k_min) + "; its values stay here";
  n_.security_->audit("policy_refusal",
                      {{"round", n_.round_}, {"chunk", cs.index}, {"reason", why}});
  log().warn("[agg:{}] {}", n_.self_.id, why);
  cs.excused += cs.weight;
  cs.weight = 0;
  cs.mean.clear();
}

void Aggregator::Impl::RegionRole::chunk_complete(uint32_t chunk) {
  aggregation::ChunkSum cs = n_.take_chunk(chunk);
  check_residency(cs);
  const uint64_t off = n_.model_.plan->offset(chunk);
  const uint32_t n = n_.model_.plan->size(chunk);
  // Adaptive clipping: with its round's last chunk, the count of its sites
  // whose update no aggregator clipped (every copy is in by then).
  std::optional<uint64_t> unclipped;
  if (n_.adaptive_clip() && n_.acc_->round_complete()) {
    unclipped = n_.acc_->privacy_unclipped_senders();
  }
  if (cs.mean.empty()) {
    // Every copy was refused here: the parent is told the weight that
    // delivered, with no values (wire::kFlagNoValues).
    const wire::FrameHeader h =
        node::chunk_header(n_.topo_, n_.self_.index, wire::MsgType::kDelta, n_.round_,
                           *n_.model_.plan, chunk, n_.cfg_.codec->id(), 0.0);
    link_.send_aggregate(chunk,
                         std::make_shared<const std::vector<uint8_t>>(
                             wire::encode_delta_frame(h, nullptr, 0, cs.excused, unclipped)));
    return;
  }
  const wire::FrameHeader h =
      node::chunk_header(n_.topo_, n_.self_.index, wire::MsgType::kDelta, n_.round_,
                         *n_.model_.plan, chunk, n_.cfg_.codec->id(), cs.weight);
  const size_t bytes = n_.cfg_.codec->encoded_size(n);
  // Nothing to report beside the values: the aggregate is encoded into its
  // frame, a buffer used before (every byte of it is written); else into a
  // payload the frame's trailers are written after.
  const bool plain = cs.excused == 0.0 && !unclipped;
  std::shared_ptr<std::vector<uint8_t>> frame;
  std::vector<uint8_t> payload;
  uint8_t* out = nullptr;
  if (plain) {
    frame = BytePool::shared().take_shared(wire::kHeaderSize + bytes);
    wire::frame_to_fill(h, bytes, *frame);
    out = frame->data() + wire::kHeaderSize;
  } else {
    payload.resize(bytes);
    out = payload.data();
  }
  if (n_.cfg_.codec->id() != CodecId::kFp32) {
    if (residual_.empty()) residual_.assign(n_.model_.elements, 0);  // bf16 zeros
    codec::encode_with_bf16_residual(*n_.cfg_.codec, cs.mean.data(), n, residual_.data() + off,
                                     residual_scratch_, out);
  } else {
    n_.cfg_.codec->encode(cs.mean.data(), n, nullptr, out);
  }
  n_.acc_->recycle(std::move(cs.mean));  // the next chunk's sum is written into it
  if (plain) {
    link_.send_aggregate(chunk, std::move(frame));
    return;
  }
  link_.send_aggregate(chunk, std::make_shared<const std::vector<uint8_t>>(wire::encode_delta_frame(
                                  h, payload.data(), payload.size(), cs.excused, unclipped)));
}

// ---- the parent's model, coming down -------------------------------------------------

std::array<uint8_t, 32> Aggregator::Impl::RegionRole::anchor_digest() const {
  if (!anchor_digest_) anchor_digest_ = sha256(anchor_.data(), anchor_.size() * sizeof(float));
  return *anchor_digest_;
}

std::optional<std::array<uint8_t, 32>> Aggregator::Impl::RegionRole::held_digest() const {
  // It holds the anchor of its round (the next anchor's chunks wait in
  // their frames until it is whole): the parent can skip the full model and
  // take its update again.
  const bool settled = n_.phase_ != Phase::kJoining && n_.phase_ != Phase::kAwaitWelcome;
  if (anchor_.size() == n_.model_.elements && (settled || holds_initial_) &&
      !link_.welcome.full_pending && !offer_none_) {
    return anchor_digest();
  }
  return std::nullopt;
}

bool Aggregator::Impl::RegionRole::anchor_matches(const wire::ParsedFrame& f) {
  // The parent took this region's word that it holds the round's anchor (a
  // round number names one anchor) and names its own: where the two differ,
  // the region and its children would build every later round on a model
  // the federation does not hold. It asks for the model in full instead.
  const std::optional<std::array<uint8_t, 32>> ours = held_digest();
  if (!ours || f.payload_size != ours->size() ||
      std::memcmp(f.payload, ours->data(), ours->size()) == 0) {
    return true;
  }
  const std::string mine = to_hex(ours->data(), ours->size());
  const std::string theirs = to_hex(f.payload, f.payload_size);
  log().error("[agg:{}] its anchor of round {} is not its parent's (digest {} against the "
              "parent's {}); asking for the model in full",
              n_.self_.id, n_.round_, mine.substr(0, 16), theirs.substr(0, 16));
  n_.security_->audit("anchor_mismatch",
                      {{"round", n_.round_}, {"digest", mine}, {"parent_digest", theirs}});
  offer_none_ = true;
  link_.hello();
  return false;
}

void Aggregator::Impl::RegionRole::on_parent_welcome(const wire::ParsedFrame& f) {
  if (f.header.total_elements != n_.model_.elements) {
    throw ProtocolError("parent welcomed '" + n_.self_.id + "' with a model of " +
                        std::to_string(f.header.total_elements) + " parameters, children have " +
                        std::to_string(n_.model_.elements));
  }
  link_.welcome.welcomed = true;
  link_.uplink().welcomed(f.header.flags);
  link_.welcome.round = f.header.round;
  // Draining, it holds the final model: a welcome after a reconnect asks
  // for nothing (the model in full that may follow is ignored).
  if (n_.phase_ == Phase::kDraining || n_.phase_ == Phase::kDone) return;
  link_.welcome.clip = parent_clip(f.clip, "welcome", f.header.round);
  const bool no_change = (f.header.flags & wire::kFlagNoChange) != 0;
  if (n_.phase_ != Phase::kAwaitWelcome && no_change && f.header.round == n_.round_) {
    if (!anchor_matches(f)) return;
    // Rejoined the parent (it or the link restarted) in the same round: send
    // again what it may have lost; duplicates count once.
    log().info("[agg:{}] parent welcomed it back at round {}", n_.self_.id, n_.round_);
    if (n_.adaptive_clip() && link_.welcome.clip != n_.privacy_clip_) {
      // Its copies so far got the clip it resumed with: it says so, and the
      // rest get the parent's.
      log().warn("[agg:{}] its parent's clip for round {} is {}, not the {} it resumed with",
                 n_.self_.id, n_.round_, link_.welcome.clip, n_.privacy_clip_);
      use_clip(link_.welcome.clip, n_.round_);
    }
    // The parent (restarted, perhaps) knows this region's membership only
    // from its reports: one goes before the aggregates it explains.
    link_.report_membership();
    link_.send_aggregates_again();
    return;
  }
  if (no_change) {
    // Only a region that already holds this round's anchor asks without a
    // full anchor (after resuming, or given the initial model); open the
    // round at once.
    holds_initial_ = false;
    finish_parent_welcome();
    return;
  }
  holds_initial_ = false;
  // The model follows in full; finish_parent_welcome() runs when it is in.
  // What was relayed of a next anchor is in neither that model nor the
  // round it opens.
  relay_.pending.clear();
  link_.welcome.full_pending = true;
  link_.welcome.full_chunks = 0;
  if (anchor_.size() != n_.model_.elements) anchor_.assign(n_.model_.elements, 0.0f);
  anchor_changed();
}

void Aggregator::Impl::RegionRole::finish_parent_welcome() {
  const uint64_t round = link_.welcome.round;
  offer_none_ = false;  // the parent's model is in
  const bool first = n_.phase_ == Phase::kAwaitWelcome;
  log().info("[agg:{}] {} at round {}", n_.self_.id, first ? "joined" : "resynced to the parent",
             round);
  const uint64_t sent_up = n_.round_;
  const bool whole = !first && n_.phase_ == Phase::kAwaitAnchor && sent_up < round;
  n_.book_.relayed_through(round);
  // Its aggregate of the round it took part in went up whole: the traffic
  // report of that round still goes (its parent waits for it), the rounds
  // it missed have none.
  if (whole) report(sent_up);
  n_.book_.sent_through(round);
  for (Child& c : n_.down_.children) {
    if (!first && c.live) c.rejoin_pending = true;  // they hold an older anchor
  }
  if (n_.adaptive_clip()) use_clip(link_.welcome.clip, round);
  if (round >= n_.cfg_.rounds) {
    // The federation's final model (it rejoined after the last round): no
    // round opens; children are welcomed with it, and the parent's kDone
    // follows.
    n_.round_ = round;
    n_.anchors_.next.clear();
    relay_.pending.clear();  // the welcome's model is the final one
    n_.phase_ = Phase::kAwaitAnchor;
  } else {
    n_.open_round(round);
  }
  if (first) {
    n_.welcome_children(round);
  } else {
    n_.welcome_pending();
  }
}

void Aggregator::Impl::RegionRole::on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw,
                                                    size_t raw_size) {
  const wire::FrameHeader& h = f.header;
  const bool full = (h.flags & wire::kFlagFullAnchor) != 0;
  if (h.total_elements != n_.model_.elements || h.chunk_count != n_.model_.plan->count() ||
      h.element_count != n_.model_.plan->size(h.chunk_index)) {
    throw ProtocolError("parent sent an anchor chunk that does not fit (round " +
                        std::to_string(h.round) + ", chunk " + std::to_string(h.chunk_index) +
                        ", " + std::to_string(h.element_count) + " elements)");
  }
  const Codec* codec = codec_by_wire_id(h.codec);
  float* dst = anchor_.data() + n_.model_.plan->offset(h.chunk_index);
  if (full) {
    // The model in full, answering this region's hello: kept, not relayed;
    // children get it from welcome_children() as they need it.
    if (!link_.welcome.full_pending || h.round != link_.welcome.round) {
      log().info("[agg:{}] ignored a full anchor chunk of round {} it did not ask for", n_.self_.id,
                 h.round);
      return;
    }
    codec->decode(f.payload, h.element_count, dst);
    anchor_changed();
    link_.uplink().progressed(Clock::now());
    if (++link_.welcome.full_chunks == n_.model_.plan->count()) {
      link_.welcome.full_pending = false;
      finish_parent_welcome();
    }
    return;
  }
  // An update opens the next round (applied to an anchor it holds: not
  // while restored from its image without one).
  if (h.round != n_.round_ + 1 || link_.welcome.full_pending ||
      anchor_.size() != n_.model_.elements) {
    log().info("[agg:{}] ignored an anchor chunk of round {} (training round {})", n_.self_.id,
               h.round, n_.round_);
    return;
  }
  if (relay_.round != h.round || relay_.done.size() != n_.model_.plan->count()) {
    relay_.round = h.round;
    relay_.done.assign(n_.model_.plan->count(), false);
    relay_.chunks = 0;
    relay_.clip = 0;
    relay_.pending.clear();
  }
  const double clip = parent_clip(f.clip, "anchor chunk", h.round);
  if (clip > 0 && relay_.clip > 0 && clip != relay_.clip) {
    throw ProtocolError("parent sent the anchor of round " + std::to_string(h.round) +
                        " with two clips, " + std::to_string(relay_.clip) + " and " +
                        std::to_string(clip));
  }
  relay_.clip = clip;
  if (relay_.done[h.chunk_index]) {
    // Sent again by a parent that welcomed this region back mid-round: the
    // chunk is in the anchor and went down already.
    log().debug("[agg:{}] ignored a duplicate anchor chunk {} of round {}", n_.self_.id,
                h.chunk_index, h.round);
    return;
  }
  relay_.done[h.chunk_index] = true;
  anchor_progress_at_ = Clock::now();
  // Relay the chunk as it is, re-addressed from this node: no decode.
  wire::FrameHeader out = h;
  out.sender = n_.self_.index;
  auto bytes = std::make_shared<std::vector<uint8_t>>(raw, raw + raw_size);
  wire::encode_header(out, bytes->data());
  const aggregator::StoredFrame frame = n_.anchors_.store.keep(std::move(bytes));
  n_.anchors_.next.emplace_back(frame, out);
  relay_.pending.push_back({h.chunk_index, codec, frame});
  n_.send_children(frame, out);
  relay_.chunks += 1;
  if (relay_.chunks < n_.model_.plan->count()) return;
  relay_.chunks = 0;
  n_.book_.relayed_through(h.round);
  if (h.round < n_.cfg_.rounds) {
    apply_relayed();  // anchor_ becomes the round's it opens
    if (n_.adaptive_clip()) use_clip(relay_.clip, h.round);
    n_.round_ = h.round;
    n_.save_checkpoint();
    n_.start_upload();
    n_.open_round(h.round);
    n_.welcome_pending();
  }
  report(h.round - 1);
  if (done_.round == h.round) on_parent_done(h.round);  // the end came first
}

double Aggregator::Impl::RegionRole::parent_clip(double clip, const char* what,
                                                 uint64_t round) const {
  if (!n_.adaptive_clip()) return 0;  // nothing sends it: parse_frame let it through, unused
  if (clip > 0) return clip;
  throw ProtocolError("parent sent a " + std::string(what) + " of round " + std::to_string(round) +
                      " without the privacy clip; under adaptive clipping (target_quantile) "
                      "every welcome and anchor update carries it (is the parent on another "
                      "topology?)");
}

void Aggregator::Impl::RegionRole::use_clip(double clip, uint64_t round) {
  if (clip != n_.privacy_clip_) {
    // Which clip its sites' copies got, round by round, beside the root's
    // record of why it moved.
    n_.security_->audit("privacy_clip", {{"round", round},
                                         {"clip", clip},
                                         {"previous_clip", n_.privacy_clip_},
                                         {"from", n_.self_.parent}});
  }
  n_.privacy_clip_ = clip;
  for (uint32_t idx : n_.self_.children) n_.clip_children_copies(idx);
}

void Aggregator::Impl::RegionRole::apply_relayed() {
  for (const Relay::Pending& p : relay_.pending) {
    const aggregator::Frame frame = p.frame.load();
    p.codec->decode_accumulate(frame->data() + wire::kHeaderSize, n_.model_.plan->size(p.chunk),
                               1.0f, anchor_.data() + n_.model_.plan->offset(p.chunk));
    KeepAlive::pulse();
  }
  relay_.pending.clear();
  anchor_changed();
}

void Aggregator::Impl::RegionRole::on_parent_done(uint64_t final_round) {
  // Said again by a parent waiting for this region's confirmation.
  if (n_.phase_ == Phase::kDraining || n_.phase_ == Phase::kDone) return;
  if (n_.book_.relayed_through() < final_round) {
    // The end can overtake the final anchor's last chunks (a striped link
    // keeps each connection's order, not their order among one another):
    // it waits for them while they come, and the parent says the end
    // again. Passing the end on now would finish the children on a model a
    // chunk short.
    const Clock::time_point now = Clock::now();
    if (done_.round != final_round) done_ = {final_round, now};
    if (now - std::max(anchor_progress_at_, done_.since) <= n_.cfg_.heartbeat_timeout) return;
    // Nothing of it came for a heartbeat timeout: chunks were lost. Rejoin;
    // the draining parent hands the final model over in full (children are
    // welcomed with it) and says the end again.
    if (!link_.welcome.welcomed || link_.welcome.full_pending) return;  // asked already
    log().warn("[agg:{}] the parent ended the federation at round {} before this node had its "
               "final anchor whole; rejoining for the final model",
               n_.self_.id, final_round);
    link_.hello();
    return;
  }
  // The final anchor, whole since its last chunk (until now a child that
  // rejoined was sent the last round's anchor and the final chunks).
  apply_relayed();
  // The round of the model it holds, so rejoining children are welcomed at
  // the final round and its heartbeats say it.
  n_.round_ = final_round;
  n_.send_done(final_round);
  n_.phase_ = Phase::kDraining;
  n_.clock_.phase_deadline = Clock::now() + n_.cfg_.round_timeout;
  n_.clock_.finish_deadline = Clock::now() + n_.cfg_.finish_wait;
  n_.maybe_finish();
}

}  // namespace fedwan
