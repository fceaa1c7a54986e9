// Aggregator, the round protocol: children join and are welcomed, deltas
// accumulate chunk by chunk, a complete chunk is stepped (root) or forwarded
// (region), a complete round is reported with its traffic, and a region
// relays its parent's anchors down. aggregator.cpp has the event loop and
// the outboxes these steps send through; docs/protocol.md the sequence.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "common/crash_point.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "aggregator/aggregator_impl.hpp"
#include "aggregator/child_claims.hpp"
#include "node/node_frames.hpp"

namespace fedwan {

// ---- joining ------------------------------------------------------------------

void Aggregator::Impl::on_hello(Child& c, const wire::ParsedFrame& f) {
  wire::HelloPayload hello;
  if (!wire::decode_hello(f.payload, f.payload_size, &hello)) {
    refuse(c.id, "malformed hello");
    return;
  }
  if (hello.node_id != c.id) {
    refuse(c.id, "hello names node '" + hello.node_id + "' but the connection is '" + c.id + "'");
    return;
  }
  if (hello.topology_digest != topo_.digest()) {
    refuse(c.id, "topology mismatch: '" + c.id + "' has digest " +
                     to_hex(hello.topology_digest.data(), 32).substr(0, 12) + ", '" + self_.id +
                     "' has " + topo_.digest_hex().substr(0, 12) +
                     "; every node must load the same topology file");
    return;
  }
  const uint64_t n = f.header.total_elements;
  if (total_elements_ != 0 && n != total_elements_) {
    refuse(c.id, "model has " + std::to_string(n) + " parameters; this federation's has " +
                     std::to_string(total_elements_));
    return;
  }
  if (c.welcomed) {
    security_->log_noise("hello-again:" + c.id,
                         "[agg:" + self_.id + "] '" + c.id + "' said hello again; it is already in");
    return;
  }
  if (phase_ != Phase::kJoining) {
    refuse(c.id, "joining after round " + std::to_string(round_) +
                     " started is not supported "
                     "yet; restart the federation");
    return;
  }
  c.joined = true;
  c.live = true;
  c.hello = hello;
  c.elements = n;
  log().info("[agg:{}] '{}' joined ({} parameters)", self_.id, c.id, n);
  for (const Child& other : children_) {
    if (!other.joined) return;
  }
  // A region learns the model's size from its children, once all are in:
  // the first to say hello does not get to decide it for the others.
  if (total_elements_ == 0 && !settle_model_size()) return;
  all_children_joined();
}

bool Aggregator::Impl::settle_model_size() {
  // The size most of the children's weight stands behind (the smaller one
  // on a tie); a child that claims another is refused and must come back.
  std::map<uint64_t, double> votes;
  for (const Child& o : children_) votes[o.elements] += o.weight;
  uint64_t n = 0;
  double best = -1;
  for (const auto& [size, weight] : votes) {
    if (weight > best) {
      n = size;
      best = weight;
    }
  }
  bool agreed = true;
  for (Child& o : children_) {
    if (o.elements == n) continue;
    refuse(o.id, "model has " + std::to_string(o.elements) + " parameters; the other children of '" +
                     self_.id + "' train " + std::to_string(n));
    o.joined = false;
    agreed = false;
  }
  if (agreed) init_model_state(n);
  return agreed;
}

void Aggregator::Impl::all_children_joined() {
  if (is_root_) {
    for (Child& c : children_) {
      const bool same = c.hello.model_digest == model_digest_;
      std::vector<uint8_t> payload(model_digest_.begin(), model_digest_.end());
      wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kWelcome, 0);
      h.total_elements = total_elements_;
      h.flags = (same ? wire::kFlagNoChange : 0) | welcome_flags();
      send_child(c, make_frame(h, payload), h);
      c.welcomed = true;
      if (!same) send_full_anchor(c);
    }
    open_round(0);
    return;
  }
  // A region joins upward for its whole subtree and asks for the model in
  // full (it keeps a copy to resync children that rejoin later); each child
  // then gets it only if it does not hold it already.
  anchor_.assign(total_elements_, 0.0f);
  hello_parent();
  phase_ = Phase::kAwaitWelcome;
  phase_deadline_ = Clock::now() + cfg_.round_timeout;
}

void Aggregator::Impl::welcome_children(uint64_t round) {
  // Each live child is welcomed at `round` and sent the model in full unless
  // it already holds exactly this anchor.
  const std::array<uint8_t, 32> digest = anchor_digest();
  for (Child& c : children_) {
    if (!c.live) continue;
    welcome_one(c, round, c.hello.model_digest != digest);
  }
}

// ---- rounds -------------------------------------------------------------------

void Aggregator::Impl::open_round(uint64_t round) {
  round_ = round;
  // Quorum: a chunk closes only with this much weight behind it (a hair
  // under, so a sum of the same weights in another order still counts).
  acc_->open(round, cfg_.quorum * total_weight_ * (1 - 1e-9));
  for (const Child& c : children_) {
    if (!c.live || c.rejoin_pending) acc_->set_expected(c.index, false);
  }
  replaced_anchor_.clear();
  sent_up_.clear();
  next_anchor_.clear();
  // A region names the anchor it holds when it rejoins its parent.
  if (!is_root_ && anchor_.size() == total_elements_) round_anchor_digest_ = anchor_digest();
  if (is_root_) outer_->begin_round(round);
  phase_ = Phase::kTraining;
  round_started_ = Clock::now();
  phase_deadline_ = round_started_ + cfg_.round_timeout;
  log().info("[agg:{}] round {} open", self_.id, round);
  arm_deadline();
}

void Aggregator::Impl::on_delta(Child& c, const wire::ParsedFrame& f) {
  const wire::FrameHeader& h = f.header;
  if (!acc_ || phase_ == Phase::kJoining || phase_ == Phase::kAwaitWelcome) {
    refuse(c.id, "delta before the federation started");
    return;
  }
  const Codec* codec = codec_by_wire_id(h.codec);
  // What the topology fixes comes from the topology (child_claims.hpp): a
  // site's weight whatever its header says, a region's at most its sites'.
  const aggregator::DeltaWeight w = aggregator::judge_delta_weight(c.is_site, c.weight, h.weight);
  std::optional<std::string> refusal = w.refusal;
  const char* decision = refusal ? "bad_weight" : nullptr;
  if (codec != cfg_.codec) {
    refusal = "delta in codec " + std::string(codec->name()) + "; this federation's codec is " +
              std::string(cfg_.codec->name());
    decision = "bad_codec";
  }
  RoundAccumulator::Result r{AddOutcome::kBadChunk};
  if (!refusal && h.total_elements == total_elements_ && h.chunk_count == plan_->count()) {
    r = acc_->add(h.round, c.index, h.chunk_index, h.element_count, w.weight, *codec, f.payload,
                  f.payload_size);
  }
  if (decision == nullptr) {
    decision = r.outcome == AddOutcome::kAccepted ? "accepted" : add_outcome_name(r.outcome);
  }
  if (security_->auditing() || !opt_.record_updates_dir.empty()) {
    const Sha256Digest d = sha256(f.payload, f.payload_size);
    const std::string hex = to_hex(d.data(), d.size());
    if (r.outcome == AddOutcome::kAccepted && !refusal) {
      record_update(f.payload, f.payload_size, hex);
    }
    nlohmann::json fields = {{"sender", c.id},
                             {"round", h.round},
                             {"chunk", h.chunk_index},
                             {"chunks", h.chunk_count},
                             {"bytes", f.payload_size},
                             {"weight", w.weight},
                             {"codec", std::string(codec->name())},
                             {"elements", h.element_count},
                             {"sha256", hex},
                             {"decision", decision}};
    if (w.claim_differs) fields["claimed_weight"] = h.weight;
    security_->audit("update", fields);
  }
  if (w.claim_differs) {
    security_->log_noise("claimed-weight:" + c.id,
                         "[agg:" + self_.id + "] '" + c.id + "' claimed weight " +
                             std::to_string(h.weight) + " for round " + std::to_string(h.round) +
                             "; its topology weight " + std::to_string(w.weight) + " is used");
  }
  if (refusal) {
    refuse(c.id, "delta chunk " + std::to_string(h.chunk_index) + " of round " +
                     std::to_string(h.round) + " refused: " + *refusal);
    return;
  }
  switch (r.outcome) {
    case AddOutcome::kAccepted:
      crash_point("aggregator.update_accepted");
      if (r.chunk_complete) complete_chunk(h.chunk_index);
      if (acc_->round_complete()) complete_round();
      return;
    case AddOutcome::kDuplicate:
    case AddOutcome::kStale:
      summary_.rejected_frames += 1;
      if (r.outcome == AddOutcome::kStale) summary_.stale_updates += 1;
      if (log().should_log(spdlog::level::info)) {
        security_->log_noise(std::string("ignored:") + add_outcome_name(r.outcome) + ":" + c.id,
                             "[agg:" + self_.id + "] ignored " + add_outcome_name(r.outcome) +
                                 " delta from '" + c.id + "' (round " + std::to_string(h.round) +
                                 ", chunk " + std::to_string(h.chunk_index) + ")");
      }
      return;
    case AddOutcome::kBadChunk:
      refuse(c.id,
             "delta chunk " + std::to_string(h.chunk_index) + "/" + std::to_string(h.chunk_count) +
                 " of round " + std::to_string(h.round) + " has " +
                 std::to_string(h.element_count) + " of " + std::to_string(h.total_elements) +
                 " elements; expected chunk " + "size " +
                 std::to_string(h.chunk_index < plan_->count() ? plan_->size(h.chunk_index) : 0) +
                 " of " + std::to_string(total_elements_) + " in " +
                 std::to_string(plan_->count()) + " chunks");
      return;
    case AddOutcome::kBadPayload:
      refuse(c.id, "delta chunk " + std::to_string(h.chunk_index) + " of round " +
                       std::to_string(h.round) + " has a malformed or non-finite payload");
      return;
    case AddOutcome::kFuture:
    case AddOutcome::kUnknownSender:
      refuse(c.id, std::string("delta refused: ") + add_outcome_name(r.outcome));
      return;
  }
}

void Aggregator::Impl::complete_chunk(uint32_t chunk) {
  if (!is_root_) {
    // Residency: an aggregate leaves the region only if it mixes at least
    // k_min sites (every child contributes to every chunk in this protocol;
    // the topology was checked at load, this guards the invariant at run
    // time before anything is sent upward).
    size_t sites = 0;
    for (uint32_t idx : acc_->contributors(chunk)) sites += topo_.sites_under(idx).size();
    const uint32_t k_min = topo_.k_min_for(self_.index);
    if (sites < k_min) {
      const std::string why = "region '" + self_.id + "' would forward an aggregate of " +
                              std::to_string(sites) + " site(s); residency policy requires " +
                              std::to_string(k_min);
      security_->audit("policy_refusal", {{"round", round_}, {"chunk", chunk}, {"reason", why}});
      throw ProtocolError(why);
    }
  }
  ChunkSum cs = acc_->take(chunk);
  const uint64_t off = plan_->offset(chunk);
  const uint32_t n = plan_->size(chunk);
  std::vector<uint8_t> payload(cfg_.codec->encoded_size(n));
  if (is_root_) {
    outer_->step(global_.data() + off, cs.mean.data(), off, n);
    // Send what the children need to move from `held` to the new global
    // model; `held` then advances by exactly what they decode, so whatever
    // the encoding lost is carried into the next round's update.
    for (uint32_t k = 0; k < n; ++k) cs.mean[k] = global_[off + k] - held_[off + k];
    cfg_.codec->encode(cs.mean.data(), n, nullptr, payload.data());
    keep_round_anchor(chunk);
    cfg_.codec->decode_accumulate(payload.data(), n, 1.0f, held_.data() + off);
    const wire::FrameHeader h = chunk_header(topo_, self_.index, wire::MsgType::kAnchor,
                                             round_ + 1, *plan_, chunk, cfg_.codec->id());
    const Frame frame = std::make_shared<const std::vector<uint8_t>>(make_frame(h, payload));
    book_.report(round_).weight = cs.weight;
    if (acc_->round_complete()) {
      held_back_.emplace(frame, h);  // sent once the round's checkpoint is durable
      return;
    }
    next_anchor_.emplace_back(frame, h);
    for (const Child& c : children_) {
      if (c.live && !c.rejoin_pending) send_child(c, frame, h);
    }
    return;
  }
  float* residual = nullptr;
  if (cfg_.codec->id() != CodecId::kFp32) {
    if (residual_.empty()) residual_.assign(total_elements_, 0.0f);
    residual = residual_.data() + off;
  }
  cfg_.codec->encode(cs.mean.data(), n, residual, payload.data());
  const wire::FrameHeader h = chunk_header(topo_, self_.index, wire::MsgType::kDelta, round_,
                                           *plan_, chunk, cfg_.codec->id(), cs.weight);
  auto frame = std::make_shared<const std::vector<uint8_t>>(make_frame(h, payload));
  sent_up_.push_back(frame);
  sent_up_at_ = Clock::now();
  send_parent(std::vector<uint8_t>(*frame));
}

void Aggregator::Impl::complete_round() {
  // A round lasts from the end of the previous one to the end of this one,
  // so time spent in on_model (while the sites already train) is counted.
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - round_started_).count();
  log().info("[agg:{}] round {} complete in {:.2f} s", self_.id, round_, secs);
  nlohmann::json missing = nlohmann::json::array();
  for (uint32_t idx : acc_->missing_children()) missing.push_back(topo_.node(idx).id);
  security_->audit("round_closed",
                   {{"round", round_}, {"children", children_.size()}, {"missing", missing}});
  security_->audit_sync();
  deadline_timer_->cancel();
  if (!is_root_) {
    phase_ = Phase::kAwaitAnchor;
    anchor_progress_at_ = now;
    phase_deadline_ = Clock::now() + cfg_.round_timeout;
    return;
  }
  RoundReport& report = book_.report(round_);
  report.round = round_;
  report.seconds = secs;
  book_.complete(round_);
  const uint64_t finished = round_;
  // Commit: the round's checkpoint is durable before the last anchor chunk
  // leaves, so no child can be ahead of what a restarted root remembers.
  // With a live standby, the standby must hold that checkpoint too (its
  // acknowledgement releases the chunk, see on_standby_frame), so a
  // takeover never finds children ahead of it.
  round_ += 1;
  save_checkpoint();
  start_upload();
  const bool wait_for_standby = held_back_ && standby_live() && upload_;
  if (wait_for_standby) {
    held_since_ = Clock::now();
  } else {
    if (standby_link_) standby_missing("it is not connected");
    release_held_back();
  }
  if (opt_.on_model) opt_.on_model(finished, global_);
  if (round_ == cfg_.rounds) {
    if (held_back_) {
      done_pending_ = true;  // after the last chunk
    } else {
      send_done(round_);
    }
    phase_ = Phase::kDraining;
    phase_deadline_ = Clock::now() + cfg_.round_timeout;
    finish_deadline_ = Clock::now() + cfg_.finish_wait;
  } else {
    open_round(round_);
    round_started_ = now;
    welcome_pending();
  }
  try_finish_round_report(finished);
}

// ---- traffic reports ------------------------------------------------------------

void Aggregator::Impl::on_telemetry(Child& c, const wire::ParsedFrame& f) {
  wire::TelemetryPayload t;
  if (c.is_site || !wire::decode_telemetry(f.payload, f.payload_size, &t)) {
    refuse(c.id, "unexpected or malformed telemetry");
    return;
  }
  if (auto bad = aggregator::telemetry_refusal(t.wan_bytes, t.fp32_bytes, t.frames)) {
    refuse(c.id, "telemetry for round " + std::to_string(f.header.round) + " refused: " + *bad);
    return;
  }
  const uint64_t round = f.header.round;
  switch (book_.add_telemetry(round, c.index, Traffic{t.wan_bytes, t.fp32_bytes, t.frames})) {
    case aggregator::RoundBook::Telemetry::kTaken:
      break;
    case aggregator::RoundBook::Telemetry::kNoRoundWaits:
      return;  // late (a region that was lost): nowhere to go
    case aggregator::RoundBook::Telemetry::kNotRelayedYet:
      refuse(c.id, "telemetry for round " + std::to_string(round) +
                       ", whose anchor was not relayed yet");
      return;
    case aggregator::RoundBook::Telemetry::kAgain:
      refuse(c.id, "telemetry for round " + std::to_string(round) + " again; counted once");
      return;
  }
  if (is_root_) {
    try_finish_round_report(round);
  } else {
    try_send_telemetry(round);
  }
}

void Aggregator::Impl::try_finish_round_report(uint64_t round) {
  if (!book_.ready(round, live_region_children(), force_reports_)) return;
  const Traffic t = take_traffic(round);
  publish_report(book_.take_report(round), t);
}

Traffic Aggregator::Impl::take_traffic(uint64_t round) {
  Traffic t = ledger_.take(round);
  t += book_.take_subtree(round);
  return t;
}

void Aggregator::Impl::publish_report(RoundReport r, const Traffic& t) {
  r.wan_bytes = t.wan_bytes;
  r.fp32_bytes = t.fp32_bytes;
  r.frames = t.frames;
  summary_.reports.push_back(r);
  summary_.rounds = r.round + 1;
  summary_.wan_bytes_total += t.wan_bytes;
  summary_.fp32_bytes_total += t.fp32_bytes;
  if (opt_.on_round) opt_.on_round(r);
  maybe_finish();
}

void Aggregator::Impl::try_send_telemetry(uint64_t round) {
  if (!book_.ready(round, live_region_children(), force_reports_)) return;
  const Traffic t = take_traffic(round);
  wire::TelemetryPayload p{t.wan_bytes, t.fp32_bytes, t.frames};
  send_parent(make_frame(node_header(topo_, self_.index, wire::MsgType::kTelemetry, round),
                         wire::encode_telemetry(p)));
  book_.sent_through(round + 1);
  RoundReport rep;
  rep.round = round;
  publish_report(rep, t);
}

// ---- anchor relay (regions) -------------------------------------------------------

void Aggregator::Impl::on_parent_welcome(const wire::ParsedFrame& f) {
  if (f.header.total_elements != total_elements_) {
    throw ProtocolError("parent welcomed '" + self_.id + "' with a model of " +
                        std::to_string(f.header.total_elements) + " parameters, children have " +
                        std::to_string(total_elements_));
  }
  parent_welcomed_ = true;
  parent_contact_ = true;
  parent_keeps_replicas_ = (f.header.flags & wire::kFlagKeepsReplicas) != 0;
  parent_welcome_round_ = f.header.round;
  const bool no_change = (f.header.flags & wire::kFlagNoChange) != 0;
  if (phase_ != Phase::kAwaitWelcome && no_change && f.header.round == round_) {
    // Rejoined the parent (it or the link restarted) in the same round: send
    // again what it may have lost; duplicates count once.
    log().info("[agg:{}] parent welcomed it back at round {}", self_.id, round_);
    for (const Frame& fr : sent_up_) send_parent(std::vector<uint8_t>(*fr));
    return;
  }
  if (no_change) {
    // Only a region that already holds this round's anchor asks without a
    // full anchor (after resuming); open the round at once.
    finish_parent_welcome();
    return;
  }
  // The model follows in full; finish_parent_welcome() runs when it is in.
  parent_full_pending_ = true;
  parent_full_chunks_ = 0;
  if (anchor_.size() != total_elements_) anchor_.assign(total_elements_, 0.0f);
}

void Aggregator::Impl::finish_parent_welcome() {
  const uint64_t round = parent_welcome_round_;
  const bool first = phase_ == Phase::kAwaitWelcome;
  log().info("[agg:{}] {} at round {}", self_.id, first ? "joined" : "resynced to the parent",
             round);
  book_.relayed_through(round);
  book_.sent_through(round);
  for (Child& c : children_) {
    if (!first && c.live) c.rejoin_pending = true;  // they hold an older anchor
  }
  open_round(round);
  if (first) {
    welcome_children(round);
  } else {
    welcome_pending();
  }
}

void Aggregator::Impl::on_parent_anchor(const wire::ParsedFrame& f, const uint8_t* raw,
                                        size_t raw_size) {
  const wire::FrameHeader& h = f.header;
  const bool full = (h.flags & wire::kFlagFullAnchor) != 0;
  if (h.total_elements != total_elements_ || h.chunk_count != plan_->count() ||
      h.element_count != plan_->size(h.chunk_index)) {
    throw ProtocolError("parent sent an anchor chunk that does not fit (round " +
                        std::to_string(h.round) + ", chunk " + std::to_string(h.chunk_index) +
                        ", " + std::to_string(h.element_count) + " elements)");
  }
  const Codec* codec = codec_by_wire_id(h.codec);
  float* dst = anchor_.data() + plan_->offset(h.chunk_index);
  if (full) {
    // The model in full, answering this region's hello: kept, not relayed;
    // children get it from welcome_children() as they need it.
    if (!parent_full_pending_ || h.round != parent_welcome_round_) {
      log().info("[agg:{}] ignored a full anchor chunk of round {} it did not ask for", self_.id,
                 h.round);
      return;
    }
    codec->decode(f.payload, h.element_count, dst);
    parent_progress_at_ = Clock::now();
    if (++parent_full_chunks_ == plan_->count()) {
      parent_full_pending_ = false;
      finish_parent_welcome();
    }
    return;
  }
  // An update opens the next round.
  if (h.round != round_ + 1 || parent_full_pending_) {
    log().info("[agg:{}] ignored an anchor chunk of round {} (training round {})", self_.id,
               h.round, round_);
    return;
  }
  keep_round_anchor(h.chunk_index);
  codec->decode_accumulate(f.payload, h.element_count, 1.0f, dst);
  anchor_progress_at_ = Clock::now();
  if (relay_round_ != h.round) {
    relay_round_ = h.round;
    relayed_chunks_ = 0;
  }
  // Relay the chunk as it is, re-addressed from this node: no decode.
  wire::FrameHeader out = h;
  out.sender = self_.index;
  auto bytes = std::make_shared<std::vector<uint8_t>>(raw, raw + raw_size);
  wire::encode_header(out, bytes->data());
  const Frame frame = std::move(bytes);
  next_anchor_.emplace_back(frame, out);
  for (const Child& c : children_) {
    if (c.live && !c.rejoin_pending) send_child(c, frame, out);
  }
  relayed_chunks_ += 1;
  if (relayed_chunks_ < plan_->count()) return;
  relayed_chunks_ = 0;
  book_.relayed_through(h.round);
  if (h.round < cfg_.rounds) {
    round_ = h.round;
    save_checkpoint();
    start_upload();
    open_round(h.round);
    welcome_pending();
  }
  try_send_telemetry(h.round - 1);
}

}  // namespace fedwan
