// Aggregator, the round protocol both roles share: children join and are
// welcomed, deltas accumulate chunk by chunk, a complete chunk is stepped
// (the root: root_role.cpp) or forwarded (a region: region_role.cpp),
// a complete round is reported with its traffic. aggregator.cpp has the
// event loop and the outboxes these steps send through; docs/protocol.md
// the sequence.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "aggregator/aggregator_impl.hpp"
#include "aggregator/child_claims.hpp"
#include "aggregator/role.hpp"
#include "common/crash_point.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
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
  if (!knows_topology(hello.topology_digest)) check_topology_file();  // a version just written
  if (!knows_topology(hello.topology_digest)) {
    refuse(c.id, "topology mismatch: '" + c.id + "' has digest " +
                     to_hex(hello.topology_digest.data(), 32).substr(0, 12) + ", '" + self_.id +
                     "' has " + topo_.digest_hex().substr(0, 12) + " (version " +
                     std::to_string(topo_.version()) +
                     "); every node must load the same topology file, or a version of it this "
                     "aggregator has adopted");
    return;
  }
  const uint64_t n = f.header.total_elements;
  if (model_.elements != 0 && n != model_.elements) {
    refuse(c.id, "model has " + std::to_string(n) + " parameters; this federation's has " +
                     std::to_string(model_.elements));
    return;
  }
  if (c.welcomed) {
    security_->log_noise("hello-again:" + c.id, "[agg:" + self_.id + "] '" + c.id +
                                                    "' said hello again; it is already in");
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
  for (const Child& other : down_.children) {
    if (!other.joined && !other.late) return;  // late_join sites are not waited for
  }
  // A region learns the model's size from its children, once all are in:
  // the first to say hello does not get to decide it for the others.
  if (model_.elements == 0 && !settle_model_size()) return;
  all_children_joined();
}

bool Aggregator::Impl::settle_model_size() {
  // The size most of the children's weight stands behind (the smaller one
  // on a tie); a child that claims another is refused and must come back.
  std::map<uint64_t, double> votes;
  for (const Child& o : down_.children) {
    if (o.joined) votes[o.elements] += o.weight;
  }
  uint64_t n = 0;
  double best = -1;
  for (const auto& [size, weight] : votes) {
    if (weight > best) {
      n = size;
      best = weight;
    }
  }
  bool agreed = true;
  for (Child& o : down_.children) {
    if (!o.joined || o.elements == n) continue;
    refuse(o.id, "model has " + std::to_string(o.elements) +
                     " parameters; the other children of '" + self_.id + "' train " +
                     std::to_string(n));
    o.joined = false;
    agreed = false;
  }
  if (agreed) init_model_state(n);
  return agreed;
}

void Aggregator::Impl::all_children_joined() {
  // The root welcomes them and opens round 0; a region joins its parent
  // for its whole subtree first.
  role_->children_joined();
}

void Aggregator::Impl::welcome_children(uint64_t round) {
  // Each live child is welcomed at `round` and sent the model in full unless
  // it already holds exactly this anchor.
  const std::array<uint8_t, 32> digest = anchor_digest();
  for (Child& c : down_.children) {
    if (!c.live) continue;
    welcome_one(c, round, c.hello.model_digest != digest);
  }
}

// ---- rounds -------------------------------------------------------------------

void Aggregator::Impl::open_round(uint64_t round) {
  costs_round_opened(round);
  round_ = round;
  // Quorum: a chunk closes only with this much weight behind it (a hair
  // under, so a sum of the same weights in another order still counts).
  acc_->open(round);
  for (Child& c : down_.children) {
    // Sites removed by a topology version: the region's cap comes down once
    // its own membership shows it adopted the version too (before, its
    // aggregates may rightly still hold them).
    const double cap = c.is_site ? c.weight : topo_.weight_under(c.index);
    if (c.weight > cap && c.member_weight <= cap * (1 + 1e-9)) {
      c.weight = cap;
      c.member_sites = std::min<uint32_t>(c.member_sites,
                                          static_cast<uint32_t>(topo_.sites_under(c.index).size()));
    }
    // A region with no member site left sits the round out: not waited for.
    if (!c.live || c.rejoin_pending || !c.member || (!c.is_site && c.member_weight <= 0)) {
      acc_->set_expected(c.index, false);
    }
  }
  refresh_quorum();  // a share of the members' weight
  anchors_.next.clear();
  anchors_.store.rotate();  // the frames still queued keep the old file
  role_->round_opened(round);
  phase_ = Phase::kTraining;
  pace_open();
  clock_.past_deadline = false;
  clock_.round_started = Clock::now();
  clock_.phase_deadline = clock_.round_started + cfg_.round_timeout;
  log().info("[agg:{}] round {} open", self_.id, round);
  arm_deadline();
  update_metrics();  // the status shows the new round at once
}

void Aggregator::Impl::on_delta(Child& c, const wire::ParsedFrame& f,
                                const aggregator::DeltaFacts* facts) {
  const wire::FrameHeader& h = f.header;
  if (!acc_ || phase_ == Phase::kJoining || phase_ == Phase::kAwaitWelcome) {
    refuse(c.id, "delta before the federation started");
    return;
  }
  const Codec* codec = codec_by_wire_id(h.codec);
  // A region that adopted a topology version adding sites before this node
  // did: the version may be in this node's file already.
  if (!c.is_site && h.weight + f.excused_weight > c.weight) check_topology_file();
  // What the topology fixes comes from the topology (child_claims.hpp): a
  // site's weight whatever its header says, a region's at most its sites'.
  const aggregator::DeltaWeight w =
      aggregator::judge_delta_weight(c.is_site, c.weight, h.weight, f.excused_weight);
  std::optional<std::string> refusal = w.refusal;
  const char* decision = refusal ? "bad_weight" : nullptr;
  if (codec != cfg_.codec) {
    refusal = "delta in codec " + std::string(codec->name()) + "; this federation's codec is " +
              std::string(cfg_.codec->name());
    decision = "bad_codec";
  }
  if (!refusal && f.unclipped_sites && (c.is_site || !adaptive_clip())) {
    refusal = c.is_site ? "a site has no sites below it to count unclipped"
                        : "an unclipped-site count, and this federation's clip is fixed";
    decision = "bad_weight";
  }
  // Hashed once (where a crypto thread opened it): for the audit and the replay check.
  std::optional<Sha256Digest> sha;
  if (security_->auditing() || !opt_.record_updates_dir.empty()) {
    sha = facts != nullptr && facts->sha ? *facts->sha : sha256(f.payload, f.payload_size);
  }
  aggregation::RoundAccumulator::Result r{aggregation::AddOutcome::kBadChunk, false, {}};
  if (!refusal && h.total_elements == model_.elements && h.chunk_count == model_.plan->count()) {
    r = acc_->add(h.round, c.index, h.chunk_index, h.element_count, w.weight, *codec,
                  f.payload_size > 0 ? f.payload : nullptr, f.payload_size, f.excused_weight,
                  aggregator::payload_facts(facts, sha ? &*sha : nullptr));
    if (f.unclipped_sites) take_unclipped_report(c, h.round, *f.unclipped_sites, r.outcome);
  }
  if (decision == nullptr) decision = delta_decision(r, f);
  audit_delta(c, f, w, *codec, decision, r, sha ? &*sha : nullptr);
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
  on_delta_added(c, h, r);
}

void Aggregator::Impl::on_delta_added(Child& c, const wire::FrameHeader& h,
                                      const aggregation::RoundAccumulator::Result& r) {
  switch (r.outcome) {
    case aggregation::AddOutcome::kRefused:
    case aggregation::AddOutcome::kAccepted:
      if (r.outcome == aggregation::AddOutcome::kRefused ||
          r.verdict.verdict == aggregation::Verdict::kClipped) {
        judged_bad(c, h.round, h.chunk_index, r.verdict);
      }
      crash_point("aggregator.update_accepted");
      // Past the deadline a chunk closes with the quorum, as the deadline
      // closed those that had it then.
      if (r.chunk_complete || (clock_.past_deadline && acc_->chunk_quorate(h.chunk_index))) {
        complete_chunk(h.chunk_index);
      }
      if (acc_->round_complete()) {
        complete_round();
      } else if (acc_->owing_children().empty()) {
        check_round_wait();  // the last chunk owed came, and the round still lacks quorum
      } else {
        pace_children();
      }
      return;
    case aggregation::AddOutcome::kDuplicate:
    case aggregation::AddOutcome::kStale:
      summary_.rejected_frames += 1;
      if (r.outcome == aggregation::AddOutcome::kStale) summary_.stale_updates += 1;
      if (log().should_log(spdlog::level::info)) {
        security_->log_noise(
            std::string("ignored:") + aggregation::add_outcome_name(r.outcome) + ":" + c.id,
            "[agg:" + self_.id + "] ignored " + aggregation::add_outcome_name(r.outcome) +
                " delta from '" + c.id + "' (round " + std::to_string(h.round) + ", chunk " +
                std::to_string(h.chunk_index) + ")");
      }
      return;
    case aggregation::AddOutcome::kBadChunk:
      refuse(c.id, "delta chunk " + std::to_string(h.chunk_index) + "/" +
                       std::to_string(h.chunk_count) + " of round " + std::to_string(h.round) +
                       " has " + std::to_string(h.element_count) + " of " +
                       std::to_string(h.total_elements) + " elements; expected chunk " + "size " +
                       std::to_string(h.chunk_index < model_.plan->count()
                                          ? model_.plan->size(h.chunk_index)
                                          : 0) +
                       " of " + std::to_string(model_.elements) + " in " +
                       std::to_string(model_.plan->count()) + " chunks");
      return;
    case aggregation::AddOutcome::kBadPayload:
      refuse(c.id, "delta chunk " + std::to_string(h.chunk_index) + " of round " +
                       std::to_string(h.round) + " has an impossible weight");
      return;
    case aggregation::AddOutcome::kFuture:
    case aggregation::AddOutcome::kUnknownSender:
      refuse(c.id, std::string("delta refused: ") + aggregation::add_outcome_name(r.outcome));
      return;
  }
}

// Takes a chunk out of the round, auditing the copies judged only now (held
// copies, copies the rule left out).
aggregation::ChunkSum Aggregator::Impl::take_chunk(uint32_t chunk) {
  aggregation::ChunkSum cs = acc_->take(chunk);
  for (const aggregation::LateVerdict& l : cs.late) {
    Child* c = down_.children.by_index(l.sender);
    if (c == nullptr) continue;
    nlohmann::json fields = {{"sender", c->id},
                             {"round", round_},
                             {"chunk", chunk},
                             {"weight", l.weight},
                             {"decision", aggregation::verdict_name(l.verdict.verdict)}};
    verdict_fields(l.verdict, fields);
    security_->audit("update_verdict", fields);
    if (l.verdict.verdict != aggregation::Verdict::kAccepted) {
      judged_bad(*c, round_, chunk, l.verdict);
    }
  }
  if (cs.mean.empty()) {
    log().warn("[agg:{}] every copy of chunk {} of round {} was refused (weight {}); it closes "
               "with no values",
               self_.id, chunk, round_, cs.excused);
  }
  return cs;
}

void Aggregator::Impl::complete_chunk(uint32_t chunk) {
  // The root steps the outer optimizer and sends the anchor's chunk down; a
  // region sends the chunk up.
  role_->chunk_complete(chunk);
}

void Aggregator::Impl::complete_round() {
  // A round lasts from the end of the previous one to the end of this one,
  // so time spent in on_model (while the sites already train) is counted.
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - clock_.round_started).count();
  log().info("[agg:{}] round {} complete in {:.2f} s", self_.id, round_, secs);
  round_metrics(secs);
  nlohmann::json missing = nlohmann::json::array();
  for (uint32_t idx : acc_->missing_children()) missing.push_back(topo_.node(idx).id);
  security_->audit("round_closed",
                   {{"round", round_}, {"children", down_.children.size()}, {"missing", missing}});
  security_->audit_sync();
  crash_point("aggregator.round_closed");
  clock_.deadline_timer->cancel();
  role_->round_closed(now, secs);  // the root commits; a region awaits the anchor
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
  switch (book_.add_telemetry(round, c.index, node::Traffic{t.wan_bytes, t.fp32_bytes, t.frames})) {
    case aggregator::RoundBook::Telemetry::kTaken: break;
    case aggregator::RoundBook::Telemetry::kNoRoundWaits:
      return;  // late (a region that was lost): nowhere to go
    case aggregator::RoundBook::Telemetry::kNotRelayedYet:
      refuse(c.id,
             "telemetry for round " + std::to_string(round) + ", whose anchor was not relayed yet");
      return;
    case aggregator::RoundBook::Telemetry::kAgain:
      refuse(c.id, "telemetry for round " + std::to_string(round) + " again; counted once");
      return;
  }
  role_->report(round);
}

node::Traffic Aggregator::Impl::take_traffic(uint64_t round) {
  node::Traffic t = ledger_.take(round);
  t += book_.take_subtree(round);
  return t;
}

void Aggregator::Impl::publish_report(RoundReport r, const node::Traffic& t) {
  r.wan_bytes = t.wan_bytes;
  r.fp32_bytes = t.fp32_bytes;
  r.frames = t.frames;
  r.replica_bytes = std::exchange(repl_.reported, {});
  summary_.reports.push_back(r);
  // A round's report can come after a later one's (a region that died
  // took its telemetry with it, and the report waited for the finish).
  summary_.rounds = std::max<uint64_t>(summary_.rounds, r.round + 1);
  summary_.wan_bytes_total += t.wan_bytes;
  summary_.fp32_bytes_total += t.fp32_bytes;
  if (opt_.on_round) opt_.on_round(r);
  maybe_finish();
}

}  // namespace fedwan
