// Aggregator, what it records of each child's copy of a chunk: the audit
// log's word for what became of it, its audit entry (the payload kept for a
// replay where it may stand behind the model), the screen's verdict in
// fields, and a copy refused or clipped counted against its child.
// aggregator_rounds.cpp judges the copies; this file writes it down.
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "aggregator/aggregator_impl.hpp"
#include "aggregator/child_claims.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"

namespace fedwan {

// The audit log's word for what became of a delta chunk.
const char* Aggregator::Impl::delta_decision(const aggregation::RoundAccumulator::Result& r,
                                             const wire::ParsedFrame& f) {
  using aggregation::AddOutcome;
  using aggregation::Verdict;
  if (r.outcome == AddOutcome::kRefused) return f.payload_size == 0 ? "excused" : "refused";
  if (r.outcome != AddOutcome::kAccepted) return aggregation::add_outcome_name(r.outcome);
  switch (r.verdict.verdict) {
    case Verdict::kClipped: return "clipped";
    case Verdict::kDeferred: return "held";
    default: return "accepted";
  }
}

void Aggregator::Impl::audit_delta(const Child& c, const wire::ParsedFrame& f,
                                   const aggregator::DeltaWeight& w, const Codec& codec,
                                   const char* decision,
                                   const aggregation::RoundAccumulator::Result& r,
                                   const Sha256Digest* sha) {
  if (!security_->auditing() && opt_.record_updates_dir.empty()) return;
  const wire::FrameHeader& h = f.header;
  const Sha256Digest d = sha != nullptr ? *sha : sha256(f.payload, f.payload_size);
  const std::string hex = to_hex(d.data(), d.size());
  // What may yet stand behind the model is kept for a replay.
  const std::string kept(decision);
  if (kept == "accepted" || kept == "clipped" || kept == "held") {
    record_update(f.payload, f.payload_size, hex);
  }
  nlohmann::json fields = {{"sender", c.id},
                           {"round", h.round},
                           {"chunk", h.chunk_index},
                           {"chunks", h.chunk_count},
                           {"bytes", f.payload_size},
                           {"weight", w.weight},
                           {"codec", std::string(codec.name())},
                           {"elements", h.element_count},
                           {"sha256", hex},
                           {"decision", decision}};
  if (w.claim_differs) fields["claimed_weight"] = h.weight;
  if (f.excused_weight > 0) fields["excused"] = f.excused_weight;
  verdict_fields(r.verdict, fields);
  security_->audit("update", fields);
}

void Aggregator::Impl::verdict_fields(const aggregation::CopyVerdict& v, nlohmann::json& fields) {
  if (!v.reason.empty()) fields["reason"] = v.reason;
  if (std::isfinite(v.norm) && v.norm > 0) fields["norm"] = v.norm;
  if (v.bound > 0) fields["bound"] = v.bound;
  if (v.verdict == aggregation::Verdict::kClipped) fields["scale"] = v.scale;
}

// A copy this node refused or clipped: counted for the child, logged (rate
// limited), and the child flagged when it keeps happening. The audit entry
// is written by the caller.
void Aggregator::Impl::judged_bad(Child& c, uint64_t round, uint32_t chunk,
                                  const aggregation::CopyVerdict& v) {
  const bool refused = v.verdict == aggregation::Verdict::kRefused;
  if (refused)
    summary_.refused_copies += 1;
  else
    summary_.clipped_copies += 1;
  security_->log_noise(std::string(refused ? "refused-copy:" : "clipped-copy:") + c.id,
                       "[agg:" + self_.id + "] " + (refused ? "refused" : "clipped") + " chunk " +
                           std::to_string(chunk) + " of round " + std::to_string(round) +
                           " from '" + c.id + "': " + v.reason);
  if (aggregator::note_bad_copy(c, round, refused)) {
    log().warn("[agg:{}] '{}' flagged: its copies were refused or clipped {} rounds in a row",
               self_.id, c.id, aggregator::kFlagAfterBadRounds);
    security_->audit("child_flagged", {{"child", c.id},
                                       {"round", round},
                                       {"rounds", aggregator::kFlagAfterBadRounds},
                                       {"refused", c.copies_refused},
                                       {"clipped", c.copies_clipped}});
  }
}

}  // namespace fedwan
